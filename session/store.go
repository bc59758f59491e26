package session

import (
	"context"
	"encoding/binary"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/rs/zerolog"
)

// Options configure a Store.
type Options struct {
	// SyncInterval is how often written records are fsynced (a process
	// crash loses nothing written; a power loss at most this much).
	// Default 200 ms.
	SyncInterval time.Duration
	// ParkAfter is how long a persistent session stays a mochi client after
	// its connection ended before it is parked: taken out of mochi, its
	// messages only on disk (see park.go). Default 1 s.
	ParkAfter time.Duration
	// SweepInterval is how often parked sessions and their queued messages
	// are checked for expiry. Default 1 s.
	SweepInterval time.Duration
	// MaxQueued and MaxQueuedBytes bound what is queued for one parked
	// session (QoS 1/2 messages; their payload bytes). Past a bound the new
	// message is refused (Discarded is told). Defaults 1,000 and 1 MiB.
	MaxQueued      int
	MaxQueuedBytes int
	// Discarded, if set, is told of every message queued for a session that
	// the store gives up on: expired (its own expiry or its session's) or
	// refused because the session's queue is full. Called without locks
	// held, from the goroutine that discarded it.
	Discarded func(clientID string, pk packets.Packet, expired bool, reason string)
	// Readable, if set, reports whether a publish on topic may be queued
	// for the parked session of clientID, authenticated as username (the
	// read ACL mochi applies before each delivery to a connected client;
	// a subscription can be granted that reaches some denied topics).
	// Called with the store's lock held: it must not call into the store.
	// Nil: every topic a session's subscriptions match.
	Readable func(clientID, username, topic string) bool
	// DiscardedDurably, if set, is asked instead of Discarded about a
	// queued message whose expiry passes while its session is parked, on
	// the store's own goroutine with no lock held; it returns once the
	// discard is recorded durably (the bridge: the expired receipt is in
	// the core), or an error. The message leaves the queue only after nil:
	// on an error it stays — expired, never delivered — and is offered
	// again at the next sweep, so its receipt is not lost while the core
	// refuses writes (after a full disk, until it is reopened). Discarded
	// still tells every other discard.
	DiscardedDurably func(ctx context.Context, clientID string, pk packets.Packet, expired bool, reason string) error
	Logger           *zerolog.Logger
}

// Store persists MQTT sessions — clients with their will, subscriptions,
// outbound QoS 1/2 messages not yet acknowledged (including those queued
// for an offline client), and retained messages — in a backend: the local
// log dir/sessions.log (Open) or a NATS JetStream key-value bucket shared
// by several gateway nodes (OpenKV, kv.go). It is a mochi hook; safe for
// concurrent use.
//
// Online sessions are mochi clients. An offline one is parked (park.go):
// mochi forgets it, and what stays in memory is its record entries, its
// subscription filters for routing, and the entries of its queued
// messages — the messages themselves are in the backend until it
// reconnects.
type Store struct {
	mqtt.HookBase

	opts Options
	log  zerolog.Logger

	mu       sync.Mutex // guards everything below, and the backend
	b        backend
	lg       *logBackend // the log backend (Open), or nil
	kv       *kvBackend  // the key-value backend (OpenKV), or nil
	live     int64       // bytes of live records
	sessions map[string]*sess
	retained map[string]*entry
	routes   routes

	server     *mqtt.Server
	parkq      map[*mqtt.Client]time.Time // offline mochi clients to park, with when they were queued
	connecting map[string]*mqtt.Client    // connections between OnSessionEstablish and OnSessionEstablished
	gen        uint64                     // routing generation (dedupes a session matched by several filters)
	parked     int                        // sessions parked
	queued     int                        // messages queued in parked sessions
	openedAt   int64

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// backend is where a Store keeps its records, under the keys of the scheme
// below (c/<id>, s/<id>\0<filter>, …): the local log (logBackend, log.go)
// or a NATS JetStream key-value bucket (kvBackend, kv.go). An entry says
// where a live record is: offset and length in the log, revision and value
// length in the bucket; n == 0 means none. Every method is called with
// Store.mu held. The session logic — parking, routing, expiry, hydration —
// is the Store's and the same for both.
type backend interface {
	// put writes key = value and returns where it is.
	put(key string, value []byte) (entry, error)
	// del deletes key, whose live record is at old.
	del(key string, old entry) error
	// read returns the value of key's live record at e.
	read(key string, e entry) ([]byte, error)
	// release gives up this node's ownership of session id, deleting the
	// owner record: the session ended (the log owns nothing).
	release(id string)
	// tick does the periodic work (fsync, compaction), every SyncInterval.
	tick()
	// size is what the backend holds, in bytes (the log file's size).
	size() int64
	// close ends the backend; the Store's goroutines have ended.
	close() error
}

// entry is where a live record is in the backend.
type entry struct {
	off int64
	n   int32
}

// sess is what the store keeps of one persistent session.
type sess struct {
	id     string
	client entry // c/ record
	gone   entry // d/ record: when it went offline (n == 0: none)
	subs   []subRef
	msgs   []msgRef // outbound QoS 1/2 messages not acknowledged, oldest first
	bytes  int      // payload bytes of msgs

	// user is the username its client record holds, once read (userKnown)
	// for Options.Readable.
	user      string
	userKnown bool

	// While parked:
	parked   bool
	deadline int64  // unix seconds it expires at; 0 never
	nextPID  uint16 // next packet ID to try for a queued message
	mark     uint64 // routing generation it was last matched in
}

// subRef is a subscription: what it grants is kept here (routing a publish
// to a parked session and restoring it read nothing from disk).
type subRef struct {
	filter string
	e      entry
	slot   int32 // its place in routes (parked only; -1 when not routed)
	ident  int32 // MQTT 5 subscription identifier
	qos    byte
	flags  byte // subNoLocal | subRetainAsPublished | subShared
	retain byte // MQTT 5 retain handling
}

const (
	subNoLocal = 1 << iota
	subRetainAsPublished
	subShared
)

type msgRef struct {
	e      entry
	expiry int64 // unix seconds; 0 never
	size   int32 // payload bytes
	pid    uint16
}

// Key prefixes. A session's keys are its ID after the prefix; a
// subscription's and a message's add NUL and the filter / packet ID.
const (
	kClient   = "c/"
	kGone     = "d/"
	kSub      = "s/"
	kInflight = "i/"
	kRetained = "r/"
)

func (o *Options) withDefaults() {
	if o.SyncInterval <= 0 {
		o.SyncInterval = 200 * time.Millisecond
	}
	if o.ParkAfter <= 0 {
		o.ParkAfter = time.Second
	}
	if o.SweepInterval <= 0 {
		o.SweepInterval = time.Second
	}
	if o.MaxQueued <= 0 {
		o.MaxQueued = 1000
	}
	if o.MaxQueuedBytes <= 0 {
		o.MaxQueuedBytes = 1 << 20
	}
}

// newStore is a Store without a backend and without goroutines.
func newStore(o Options) *Store {
	o.withDefaults()
	s := &Store{opts: o, log: zerolog.Nop(),
		sessions: map[string]*sess{}, retained: map[string]*entry{}, routes: routes{},
		parkq: map[*mqtt.Client]time.Time{}, connecting: map[string]*mqtt.Client{},
		stop: make(chan struct{}), openedAt: time.Now().Unix()}
	if o.Logger != nil {
		s.log = o.Logger.With().Str("component", "session").Logger()
	}
	return s
}

// Open loads dir/sessions.log (creating dir) and starts the background
// goroutine (fsync, parking, expiry, compaction). Attach parks the
// sessions found.
func Open(dir string, o Options) (*Store, error) {
	s := newStore(o)
	lg, err := openLog(s, dir)
	if err != nil {
		return nil, err
	}
	s.b, s.lg = lg, lg
	s.wg.Go(s.loop)
	return s, nil
}

// Close stops the store's goroutines, waits for them, and closes the
// backend (the log is synced); safe to call twice.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		close(s.stop)
		s.wg.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		err = s.b.close()
	})
	return err
}

// loop fsyncs, parks, expires and compacts until Close.
func (s *Store) loop() {
	t := time.NewTicker(min(s.opts.SyncInterval, s.opts.ParkAfter, s.opts.SweepInterval))
	defer t.Stop()
	var lastSync, lastSweep time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		s.parkDue(now)
		if now.Sub(lastSweep) >= s.opts.SweepInterval {
			lastSweep = now
			s.sweep(now)
		}
		if now.Sub(lastSync) < s.opts.SyncInterval {
			continue
		}
		lastSync = now
		s.mu.Lock()
		s.b.tick()
		s.mu.Unlock()
	}
}

// putLocked writes key = value and returns its entry; n == 0 and the
// backend's error if it was not written (the backend logged it).
func (s *Store) putLocked(key string, value []byte) (entry, error) {
	e, err := s.b.put(key, value)
	if err != nil {
		return entry{}, err
	}
	s.live += int64(e.n)
	return e, nil
}

// replaceLocked writes a put of key and returns its entry, counting old
// (the entry it replaces, n == 0 for none) as dead; n == 0 if not written.
func (s *Store) replaceLocked(old entry, key string, value []byte) entry {
	s.live -= int64(old.n)
	e, _ := s.putLocked(key, value)
	return e
}

// deleteLocked deletes key, whose live record is at e.
func (s *Store) deleteLocked(e entry, key string) {
	if e.n == 0 {
		return
	}
	s.live -= int64(e.n)
	_ = s.b.del(key, e)
}

// readLocked reads key's live record at e and returns its value.
func (s *Store) readLocked(key string, e entry) ([]byte, error) {
	return s.b.read(key, e)
}

// apply indexes one record read at Open (or loaded from the bucket).
func (s *Store) apply(op byte, key string, value []byte, e entry) {
	if len(key) < 2 {
		return
	}
	prefix, rest := key[:2], key[2:]
	if prefix == kRetained {
		if old, ok := s.retained[rest]; ok {
			s.live -= int64(old.n)
			delete(s.retained, rest)
		}
		if op == opPut {
			s.retained[rest] = &e
			s.live += int64(e.n)
		}
		return
	}
	id, sub, _ := strings.Cut(rest, "\x00")
	ss := s.sessions[id]
	if ss == nil {
		if op == opDelete || prefix != kClient {
			return // nothing of it is live (or it belongs to no session)
		}
		ss = &sess{id: id}
		s.sessions[id] = ss
	}
	var put bool
	if op == opPut {
		put = true
		s.live += int64(e.n)
	}
	switch prefix {
	case kClient:
		if !put {
			s.dropLocked(ss, false) // delete of the client: the whole session
			return
		}
		s.live -= int64(ss.client.n)
		ss.client = e
		ss.userKnown = false
	case kGone:
		s.live -= int64(ss.gone.n)
		ss.gone = entry{}
		if put {
			ss.gone = e
		}
	case kSub:
		i := ss.findSub(sub)
		if i >= 0 {
			s.live -= int64(ss.subs[i].e.n)
			ss.subs = append(ss.subs[:i], ss.subs[i+1:]...)
		}
		if put {
			ref, err := decodeSubRef(sub, value)
			if err != nil {
				s.live -= int64(e.n)
				s.log.Warn().Err(err).Str("client", id).Msg("subscription record does not decode; dropped")
				return
			}
			ref.e = e
			ss.subs = append(ss.subs, ref)
		}
	case kInflight:
		if len(sub) != 2 {
			return
		}
		pid := binary.BigEndian.Uint16([]byte(sub))
		if i := ss.findMsg(pid); i >= 0 {
			s.live -= int64(ss.msgs[i].e.n)
			ss.bytes -= int(ss.msgs[i].size)
			ss.msgs = append(ss.msgs[:i], ss.msgs[i+1:]...)
		}
		if put {
			ref, err := decodeMsgRef(value)
			if err != nil {
				s.live -= int64(e.n)
				s.log.Warn().Err(err).Str("client", id).Msg("message record does not decode; dropped")
				return
			}
			ref.e, ref.pid = e, pid
			ss.msgs = append(ss.msgs, ref)
			ss.bytes += int(ref.size)
		}
	}
}

func (ss *sess) findSub(filter string) int {
	for i := range ss.subs {
		if ss.subs[i].filter == filter {
			return i
		}
	}
	return -1
}

func (ss *sess) findMsg(pid uint16) int {
	for i := range ss.msgs {
		if ss.msgs[i].pid == pid {
			return i
		}
	}
	return -1
}

// dropLocked forgets a session and, when write is set, deletes its
// records; a parked one leaves the routes.
func (s *Store) dropLocked(ss *sess, write bool) {
	if ss.parked {
		s.unrouteLocked(ss)
		s.parked--
		s.queued -= len(ss.msgs)
		ss.parked = false
	}
	for _, r := range ss.subs {
		if write {
			s.deleteLocked(r.e, subKey(ss.id, r.filter))
		} else {
			s.live -= int64(r.e.n)
		}
	}
	for _, m := range ss.msgs {
		if write {
			s.deleteLocked(m.e, inflightKey(ss.id, m.pid))
		} else {
			s.live -= int64(m.e.n)
		}
	}
	if write {
		s.deleteLocked(ss.gone, kGone+ss.id)
		s.deleteLocked(ss.client, kClient+ss.id)
	} else {
		s.live -= int64(ss.gone.n) + int64(ss.client.n)
	}
	ss.subs, ss.msgs, ss.bytes = nil, nil, 0
	delete(s.sessions, ss.id)
}

// endLocked deletes a session that ended — its records, then (on a
// bucket) its owner record.
func (s *Store) endLocked(ss *sess) {
	s.dropLocked(ss, true)
	s.b.release(ss.id)
}

// eachEntryLocked calls fn with every live entry, in place.
func (s *Store) eachEntryLocked(fn func(*entry)) {
	for _, ss := range s.sessions {
		fn(&ss.client)
		fn(&ss.gone)
		for i := range ss.subs {
			fn(&ss.subs[i].e)
		}
		for i := range ss.msgs {
			fn(&ss.msgs[i].e)
		}
	}
	for _, e := range s.retained {
		fn(e)
	}
}

func clientKey(id string) string { return kClient + id }

func subKey(id, filter string) string { return kSub + id + "\x00" + filter }

func inflightKey(id string, pid uint16) string {
	return kInflight + id + "\x00" + string(binary.BigEndian.AppendUint16(nil, pid))
}

func retainedKey(topic string) string { return kRetained + topic }
