package session

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// Log field names.
const (
	logClient   = "client"
	logFile     = "file"
	logOffset   = "offset"
	logKey      = "key"
	logNode     = "node"
	logBucket   = "bucket"
	logRevision = "revision"
	logRecord   = "record"
	logReason   = "reason"
)

// Write error reasons (Stats.WriteErrors, the metrics' reason label).
const (
	reasonIO             = "io"
	reasonTooLarge       = "too_large"
	reasonBadValue       = "bad_value"
	reasonUnknownSession = "unknown_session"
	reasonClosed         = "closed"
	reasonUnavailable    = "unavailable"
	reasonFenced         = "fenced"
	reasonNotOwner       = "not_owner"
	reasonBacklog        = "backlog"
)

// Store persists the engine's persistent sessions and retained messages:
// an engine.SessionStore over the local log (Open) or over a NATS
// JetStream key-value bucket shared by several gateway nodes (OpenKV, which
// also makes it an engine.SessionClaimer). Safe for concurrent use; the
// write-through methods take the store's lock for a log append or a
// queued bucket write, never for a disk sync or a network round trip.
//
// Lock order: swapMu (log fsync, compaction swap), mu (the index and the
// backend's state), then the bucket writer's queue lock.
type Store struct {
	log    zerolog.Logger
	errLog zerolog.Logger // sampled: an outage must not flood the log

	swapMu sync.Mutex

	mu     sync.Mutex
	ix     index
	b      backend
	lg     *logBackend // the log backend (Open), or nil
	kv     *kvBackend  // the bucket backend (OpenKV), or nil
	closed bool

	engine atomic.Pointer[engine.Engine]

	errMu     sync.Mutex
	writeErrs map[string]int64

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// backend is where a Store's records go: the log (logBackend) or a bucket
// (kvBackend). put, del and drop are called with Store.mu held, after the
// index was checked and before it is changed.
type backend interface {
	// put writes k = value; id is the session it belongs to ("" for a
	// retained message).
	put(id, k string, value []byte) (loc, error)
	// del deletes k.
	del(id, k string) error
	// drop deletes session ss with every record of it.
	drop(ss *sess) error
	// load and loadMessages serve Load and LoadMessages; they take Store.mu
	// themselves.
	load() ([]engine.StoredSession, []*engine.Message, error)
	loadMessages(id string) ([]engine.StoredMessage, error)
	// close ends the backend once the store's goroutines have ended.
	close() error
}

func newStore(logger *zerolog.Logger) *Store {
	s := &Store{log: zerolog.Nop(), ix: newIndex(), writeErrs: map[string]int64{}, stop: make(chan struct{})}
	if logger != nil {
		s.log = logger.With().Str("component", "session").Logger()
	}
	s.errLog = s.log.Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Second})
	return s
}

// Attach gives the store the engine it serves; call it before e.Start.
// A bucket store needs it to tell the engine of sessions other nodes take
// over (Engine.Forget), of retained messages set elsewhere
// (Engine.SetRetained) and of sessions it adopts (Engine.Adopt); the log
// store keeps it for nothing.
func (s *Store) Attach(e *engine.Engine) { s.engine.Store(e) }

// Close stops the store's goroutines, waits for them, and closes the
// backend: the log is synced, the bucket's queued writes are given
// KVOptions.Timeout to land. Safe to call twice.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		if s.kv != nil {
			s.kv.drain()
		}
		close(s.stop)
		s.wg.Wait()
		err = s.b.close()
	})
	return err
}

// failed counts and logs a write that did not happen.
func (s *Store) failed(reason string, err error, id, what string) {
	ev := s.errLog.Error()
	if reason == reasonFenced || reason == reasonNotOwner || reason == reasonUnknownSession || reason == reasonClosed {
		ev = s.errLog.Warn()
	}
	ev.Err(err).Str(logClient, id).Str(logRecord, what).Str(logReason, reason).Msg("session change not stored")
	s.errMu.Lock()
	s.writeErrs[reason]++
	s.errMu.Unlock()
}

// reasonOf classifies a write error.
func reasonOf(err error) string {
	switch {
	case errors.Is(err, ErrValueTooLarge):
		return reasonTooLarge
	case errors.Is(err, ErrBadValue):
		return reasonBadValue
	case errors.Is(err, ErrFenced):
		return reasonFenced
	case errors.Is(err, ErrNotOwner):
		return reasonNotOwner
	case errors.Is(err, ErrBacklog):
		return reasonBacklog
	case errors.Is(err, ErrUnavailable):
		return reasonUnavailable
	case errors.Is(err, ErrClosed):
		return reasonClosed
	}
	return reasonIO
}

// session returns session id's index entry for a write, or nil (counted)
// when the store has none or is closed.
func (s *Store) sessionLocked(id, what string) *sess {
	if s.closed {
		s.failed(reasonClosed, ErrClosed, id, what)
		return nil
	}
	ss := s.ix.sessions[id]
	if ss == nil {
		reason, err := reasonUnknownSession, fmt.Errorf("%w: no stored session %q", ErrBadKey, id)
		if s.kv != nil {
			reason, err = reasonNotOwner, fmt.Errorf("%w: %q", ErrNotOwner, id)
		}
		s.failed(reason, err, id, what)
	}
	return ss
}

func (s *Store) putLocked(id, k string, value []byte, what string) (loc, bool) {
	at, err := s.b.put(id, k, value)
	if err != nil {
		s.failed(reasonOf(err), err, id, what)
		return loc{}, false
	}
	return at, true
}

func (s *Store) delLocked(id, k, what string) bool {
	if err := s.b.del(id, k); err != nil {
		s.failed(reasonOf(err), err, id, what)
		return false
	}
	return true
}

// The engine.SessionStore methods. The engine calls them under the
// session's lock, in the order the changes happened.

// Load returns every stored session and retained message (the engine's
// Start). Sessions that were connected when the last process ended are
// written as offline from now, so that a second restart neither counts
// their expiry from an earlier start nor publishes their will again.
func (s *Store) Load() ([]engine.StoredSession, []*engine.Message, error) {
	return s.b.load()
}

// Flush returns when the writes of clientID's session made so far are in
// the bucket (engine.SessionClaimer), with an error when one of them — or
// one refused since the previous Flush — failed. A store opened with Open
// has nothing to wait for: no other node reads its log.
func (s *Store) Flush(ctx context.Context, clientID string) error {
	if s.kv == nil {
		return nil
	}
	if err := s.kv.w.flushChecked(ctx, sessionLane(clientID)); err != nil {
		return fmt.Errorf("session: store %q: %w: %w", clientID, ErrUnavailable, err)
	}
	return nil
}

// SyncInbound returns once the inbound QoS 2 records of clientID written so
// far are durable (engine.InboundSyncer): in the bucket (Flush), or, with
// Options.SyncInbound, fsynced in the log; with an error when one could not
// be stored. Without SyncInbound the log's records are durable against a
// process crash already (they are written at once) and it returns nil.
func (s *Store) SyncInbound(ctx context.Context, clientID string) error {
	if s.kv != nil {
		return s.Flush(ctx, clientID)
	}
	if s.lg != nil && s.lg.opts.SyncInbound {
		if err := s.lg.syncNow(); err != nil {
			return fmt.Errorf("session: sync %q: %w", clientID, err)
		}
	}
	return nil
}

// LoadMessages returns the stored outbound messages of clientID, in order.
func (s *Store) LoadMessages(clientID string) ([]engine.StoredMessage, error) {
	return s.b.loadMessages(clientID)
}

// SaveClient stores a session's client record. Every call comes from a
// connection (its CONNECT, its DISCONNECT changing the expiry): the session
// is online from here on until SaveOffline.
func (s *Store) SaveClient(r engine.ClientRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.failed(reasonClosed, ErrClosed, r.ID, "client")
		return
	}
	fresh := s.ix.sessions[r.ID] == nil
	if s.kv != nil && fresh {
		if err := s.kv.claimLaterLocked(r.ID); err != nil {
			s.failed(reasonOf(err), err, r.ID, "owner")
			return
		}
	}
	v, err := encodeClient(&r, fresh)
	if err != nil {
		s.failed(reasonOf(err), err, r.ID, "client")
		return
	}
	if at, ok := s.putLocked(r.ID, clientKey(r.ID), v, "client"); ok {
		s.ix.putClient(r.ID, at, fresh)
	}
}

// SaveOffline records when the session's connection ended.
func (s *Store) SaveOffline(clientID string, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessionLocked(clientID, "offline") == nil {
		return
	}
	if at, ok := s.putLocked(clientID, offlineKey(clientID), encodeOffline(since), "offline"); ok {
		s.ix.putOffline(clientID, at)
	}
}

// Delete forgets the session and everything stored with it.
func (s *Store) Delete(clientID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.ix.sessions[clientID]
	if s.kv != nil {
		s.kv.forgetCachedLocked(clientID)
	}
	if ss == nil {
		if s.kv != nil {
			s.kv.releaseLocked(clientID) // claimed, never stored
		}
		return
	}
	if s.closed {
		s.failed(reasonClosed, ErrClosed, clientID, "delete")
		return
	}
	if err := s.b.drop(ss); err != nil {
		s.failed(reasonOf(err), err, clientID, "delete")
		return
	}
	s.ix.dropSession(clientID)
}

// SaveSubscription stores a subscription of a session.
func (s *Store) SaveSubscription(clientID, filter string, o topictree.Options) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessionLocked(clientID, "subscription") == nil {
		return
	}
	v, err := encodeSub(filter, o)
	if err != nil {
		s.failed(reasonOf(err), err, clientID, "subscription")
		return
	}
	if at, ok := s.putLocked(clientID, subKey(clientID, filter), v, "subscription"); ok {
		s.ix.putSub(clientID, filter, at)
	}
}

// DeleteSubscription forgets a subscription of a session.
func (s *Store) DeleteSubscription(clientID, filter string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessionLocked(clientID, "unsubscribe")
	if ss == nil || ss.findSub(filter) < 0 {
		return
	}
	if s.delLocked(clientID, subKey(clientID, filter), "unsubscribe") {
		s.ix.delSub(clientID, filter)
	}
}

// SaveMessage stores an outbound QoS 1/2 message of a session.
func (s *Store) SaveMessage(clientID string, pid uint16, m *engine.Message, subIDs []uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessionLocked(clientID, "message") == nil {
		return
	}
	v, err := encodeMessage(m, subIDs)
	if err != nil {
		s.failed(reasonOf(err), err, clientID, "message")
		return
	}
	if at, ok := s.putLocked(clientID, pidKey(kMessage, clientID, pid), v, "message"); ok {
		s.ix.putMsg(clientID, pid, at)
		if s.kv != nil {
			s.kv.cacheMessageLocked(clientID, pid, m, subIDs)
		}
	}
}

// MessageReleased records the PUBREC of an outbound QoS 2 message.
func (s *Store) MessageReleased(clientID string, pid uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessionLocked(clientID, "pubrec")
	if ss == nil || ss.findMsg(pid) < 0 {
		return
	}
	if at, ok := s.putLocked(clientID, pidKey(kReleased, clientID, pid), markerValue, "pubrec"); ok {
		s.ix.putReleased(clientID, pid, at)
	}
}

// DeleteMessage forgets an outbound message (acknowledged, discarded).
func (s *Store) DeleteMessage(clientID string, pid uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessionLocked(clientID, "ack")
	if ss == nil {
		return
	}
	i := ss.findMsg(pid)
	if i < 0 {
		return
	}
	released := ss.msgs[i].rel.ok()
	if s.delLocked(clientID, pidKey(kMessage, clientID, pid), "ack") {
		if released && s.kv != nil {
			s.delLocked(clientID, pidKey(kReleased, clientID, pid), "ack")
		}
		s.ix.delMsg(clientID, pid)
		if s.kv != nil {
			s.kv.uncacheMessageLocked(clientID, pid)
		}
	}
}

// SaveInbound records (add) an inbound QoS 2 packet ID, taken under a
// QoS2ID or (id 0) answered, or forgets it.
func (s *Store) SaveInbound(clientID string, pid uint16, id uint64, add bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessionLocked(clientID, "inbound")
	if ss == nil {
		return
	}
	k := pidKey(kInbound, clientID, pid)
	if add {
		v := markerValue // answered
		if id != 0 {
			v = encodeInbound(id) // taken
		}
		if at, ok := s.putLocked(clientID, k, v, "inbound"); ok {
			s.ix.putInbound(clientID, pid, at)
		}
		return
	}
	for _, q := range ss.inbound {
		if q.pid == pid {
			if s.delLocked(clientID, k, "inbound") {
				s.ix.delInbound(clientID, pid)
			}
			return
		}
	}
}

// SaveRetained stores a retained message; an empty payload deletes the
// topic's.
func (s *Store) SaveRetained(m *engine.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.failed(reasonClosed, ErrClosed, "", "retained")
		return
	}
	if s.kv != nil {
		s.kv.saveRetainedLocked(m)
		return
	}
	k := retainedKey(m.Topic)
	if len(m.Payload) == 0 {
		if _, held := s.ix.retained[m.Topic]; held && s.delLocked("", k, "retained") {
			s.ix.delRetained(m.Topic)
		}
		return
	}
	v, err := encodeRetained(m)
	if err != nil {
		s.failed(reasonOf(err), err, "", "retained")
		return
	}
	if at, ok := s.putLocked("", k, v, "retained"); ok {
		s.ix.putRetained(m.Topic, at)
	}
}

// Stats are the store's figures. On a bucket (OpenKV) the sessions are
// those this node holds.
type Stats struct {
	Sessions  int   // persistent sessions stored
	Messages  int   // their outbound QoS 1/2 messages (in flight or queued)
	Retained  int   // retained messages
	LogBytes  int64 // size of the session log (0 on a bucket)
	LiveBytes int64 // bytes of its live records (on a bucket: of the values this node holds)
	// SyncedBytes is how much of the log is known to be on disk.
	SyncedBytes int64
	// Failed is the log's sticky write error, if any: nothing is stored
	// since.
	Failed error
	// WriteErrors are the changes not stored, by reason: "io",
	// "too_large", "bad_value" (a QoS 3 the engine never sends),
	// "unknown_session", "closed"; on a bucket also
	// "unavailable", "fenced", "not_owner", "backlog".
	WriteErrors map[string]int64
	// On a bucket: sessions another node took over from this one, and
	// writes queued for the bucket and not yet acknowledged.
	TakenOver int64
	Backlog   int
}

// Stats returns the current figures.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	st := Stats{Sessions: len(s.ix.sessions), Messages: s.ix.messages, Retained: len(s.ix.retained), LiveBytes: s.ix.live}
	if b := s.lg; b != nil {
		st.LogBytes, st.SyncedBytes, st.Failed = b.size, b.synced, b.err
	}
	s.mu.Unlock()
	if k := s.kv; k != nil {
		st.TakenOver = k.takenOver.Load()
		st.Backlog = k.w.backlog()
	}
	s.errMu.Lock()
	st.WriteErrors = maps.Clone(s.writeErrs)
	s.errMu.Unlock()
	return st
}

var (
	_ engine.SessionStore   = (*Store)(nil)
	_ engine.SessionClaimer = (*Store)(nil)
)
