package session

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// KVOptions configure a Store kept in a NATS JetStream key-value bucket
// (OpenKV), shared by several gateway nodes.
type KVOptions struct {
	// Bucket is the key-value bucket; default "ferrymq_sessions". Created
	// with file storage and Replicas when missing; an existing bucket is
	// used as it is (so an operator may create it with other settings).
	Bucket string
	// Replicas of the bucket when it is created: 1 on one server, 3 on a
	// cluster (a write is acknowledged once a majority stored it).
	// Default 1.
	Replicas int
	// NodeID names this gateway node in the owner records. It must be
	// unique among the live nodes and should stay the same across
	// restarts: at start a node takes back the sessions it owned. Default:
	// the host name.
	NodeID string
	// Timeout bounds one request to JetStream (a write, a claim, loading a
	// session), and Close's wait for the writes still queued. Default 5 s.
	Timeout time.Duration
	// MaxValueBytes bounds one stored value. Default and ceiling: the
	// server's max payload (1 MiB unless configured) less 4 KiB for the
	// subject and headers. A larger record is not stored (counted,
	// reason "too_large").
	MaxValueBytes int
	// MarkerTTL is how long the marker a delete leaves in a bucket this
	// store created is kept (long enough for every node's watcher to see
	// it). Default 10 minutes.
	MarkerTTL time.Duration
	// Writers is how many writes are in flight to JetStream at once (one
	// per session at a time). Default 16.
	Writers int
	// MaxBacklog bounds the writes queued and not yet acknowledged; past
	// it a change is not stored (counted, reason "backlog"). Default
	// 100,000.
	MaxBacklog int
	Logger     *zerolog.Logger
}

// Defaults of KVOptions.
const (
	DefaultBucket     = "ferrymq_sessions"
	DefaultKVTimeout  = 5 * time.Second
	DefaultMarkerTTL  = 10 * time.Minute
	DefaultKVWriters  = 16
	DefaultMaxBacklog = 100_000
)

func (o KVOptions) withDefaults() KVOptions {
	if o.Bucket == "" {
		o.Bucket = DefaultBucket
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.NodeID == "" {
		o.NodeID, _ = os.Hostname()
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultKVTimeout
	}
	if o.MarkerTTL == 0 {
		o.MarkerTTL = DefaultMarkerTTL
	}
	if o.Writers == 0 {
		o.Writers = DefaultKVWriters
	}
	if o.MaxBacklog == 0 {
		o.MaxBacklog = DefaultMaxBacklog
	}
	return o
}

func (o KVOptions) validate() error {
	var errs []error
	if o.Replicas < 1 || o.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas %d: want 1 to 5", o.Replicas))
	}
	if o.NodeID == "" || len(o.NodeID) > maxNodeBytes {
		errs = append(errs, fmt.Errorf("node ID of %d bytes: want 1 to %d", len(o.NodeID), maxNodeBytes))
	}
	if o.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout %s: want > 0", o.Timeout))
	}
	if o.MarkerTTL < time.Second {
		errs = append(errs, fmt.Errorf("marker TTL %s: want at least 1s", o.MarkerTTL))
	}
	if o.MaxValueBytes < 0 || o.Writers < 1 || o.MaxBacklog < 1 {
		errs = append(errs, fmt.Errorf("max value bytes %d, writers %d, max backlog %d: want positive",
			o.MaxValueBytes, o.Writers, o.MaxBacklog))
	}
	return errors.Join(errs...)
}

// Headers every write carries: who wrote it, and under which owner
// revision (for operators reading the bucket's stream).
const (
	hdrNode     = "Ferrymq-Node"
	hdrOwnerRev = "Ferrymq-Owner-Revision"
	kvOpHeader  = "KV-Operation" // nats.go's KV delete markers
	kvOpPurge   = "PURGE"
	kvOpDelete  = "DEL"
	// kvOverhead is what a write needs besides its value: subject, headers.
	kvOverhead = 4 << 10
)

// kvBackend keeps a Store's records in a JetStream key-value bucket.
// Every write of a session's record is fenced by its owner record: it
// carries Nats-Expected-Last-Subject-Sequence = the revision of o.<client>
// this node wrote when it claimed the session, checked by the stream
// against the owner key's subject. Once another node claims the session (a
// newer revision) or it ended (a delete marker), the stream refuses this
// node's writes (ErrFenced).
//
// Writes are queued (kvwriter.go): the index is changed at once, the
// bucket when the write lands; a write that fails is counted and logged,
// not retried — the bucket misses that change, the node's memory has it.
type kvBackend struct {
	// afterClaim, set by tests only, runs in an adoption after a session
	// was claimed and loaded, before it is installed, under its claim lock.
	afterClaim func(id string)

	s        *Store
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	nc       *nats.Conn
	bucket   string
	prefix   string // "$KV.<bucket>."
	node     string
	inc      uint64 // this process's incarnation (owner records)
	gen      atomic.Uint64
	timeout  time.Duration
	maxValue int
	ttl      time.Duration // delete markers' TTL; 0: the bucket has no message TTLs
	writers  int
	w        *kvWriter

	// Guarded by Store.mu.
	held map[string]uint64 // session → the owner revision this node holds
	// claiming are the sessions whose claim is queued (claimLaterLocked).
	claiming map[string]bool
	heldTok  map[string]string // owner key token → session
	cache    map[string]*msgCache
	// Retained messages: the newest revision applied here per topic, the
	// writes of this node not yet acknowledged per topic, the topic of
	// each token seen (a delete marker has no value), and the messages
	// read at OpenKV until Load hands them over.
	retApplied map[string]uint64
	retPending map[string]int
	retTopic   map[string]string
	initial    map[string]*engine.Message
	handed     bool

	// link is canceled when the NATS connection is lost, so that requests
	// waiting on it fail at once instead of after Timeout (linkLoop).
	link      atomic.Pointer[linkCtx]
	takenOver atomic.Int64
	claims    claimLocks
}

// msgCache holds the full messages of a session this node just claimed or
// is resuming, for the engine's LoadMessages, which it calls under its
// locks (no network there). Writes of the session keep it current.
type msgCache struct {
	at   time.Time
	msgs map[uint16]engine.StoredMessage
}

// cacheTTL drops a cache entry the engine never asked for (its connection
// failed between the claim and the resume).
const cacheTTL = time.Minute

// linkCtx is the context of one period of the NATS connection being up.
type linkCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newLink() *linkCtx {
	ctx, cancel := context.WithCancel(context.Background())
	return &linkCtx{ctx, cancel}
}

// requestCtx bounds one request to JetStream: Timeout, ctx, or until the
// connection is lost.
func (k *kvBackend) requestCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	c, cancel := context.WithTimeout(ctx, k.timeout)
	stop := context.AfterFunc(k.link.Load().ctx, cancel)
	return c, func() { stop(); cancel() }
}

// linkLoop follows the connection's status until Close: losing the
// connection cancels the requests waiting on it; getting it back starts a
// new period.
func (k *kvBackend) linkLoop() {
	ch := k.nc.StatusChanged()
	defer k.nc.RemoveStatusListener(ch)
	defer func() { k.link.Load().cancel() }()
	for {
		select {
		case <-k.s.stop:
			return
		case st, ok := <-ch:
			if !ok {
				return
			}
			cur := k.link.Load()
			switch {
			case st != nats.CONNECTED:
				cur.cancel()
			case cur.ctx.Err() != nil:
				k.link.Store(newLink())
			}
		}
	}
}

// OpenKV opens (creating it when missing) the key-value bucket o.Bucket
// through js and returns a Store kept in it, whose sessions several
// gateway nodes share; it is also an engine.SessionClaimer. It reads the
// retained messages and starts the watchers of the owner records (a
// session another node takes over is dropped here: Engine.Forget) and of
// the retained messages (Engine.SetRetained), and the writers. Load (at
// the engine's Start) takes back the sessions this node owned. Attach the
// engine before it starts. Close stops everything; the NATS connection
// stays the caller's.
func OpenKV(ctx context.Context, js jetstream.JetStream, o KVOptions) (*Store, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("session: kv options: %w", err)
	}
	s := newStore(o.Logger)
	s.log = s.log.With().Str(logNode, o.NodeID).Logger()
	s.errLog = s.errLog.With().Str(logNode, o.NodeID).Logger()
	kv, err := js.KeyValue(ctx, o.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: o.Bucket, Description: "ferrymq MQTT sessions", Storage: jetstream.FileStorage,
			Replicas: o.Replicas, LimitMarkerTTL: o.MarkerTTL,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, o.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("session: bucket %s: %w", o.Bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("session: bucket %s: %w", o.Bucket, err)
	}
	var incb [8]byte
	_, _ = rand.Read(incb[:])
	k := &kvBackend{s: s, js: js, kv: kv, nc: js.Conn(), bucket: o.Bucket, prefix: "$KV." + o.Bucket + ".",
		node: o.NodeID, inc: binary.BigEndian.Uint64(incb[:]), timeout: o.Timeout, writers: o.Writers,
		w: newKVWriter(o.MaxBacklog), held: map[string]uint64{}, claiming: map[string]bool{}, heldTok: map[string]string{}, cache: map[string]*msgCache{},
		retApplied: map[string]uint64{}, retPending: map[string]int{}, retTopic: map[string]string{},
		initial: map[string]*engine.Message{}}
	k.claims.seed = maphash.MakeSeed()
	k.link.Store(newLink())
	if st.LimitMarkerTTL() > 0 { // the stream allows message TTLs
		k.ttl = o.MarkerTTL
	}
	k.maxValue = int(k.nc.MaxPayload()) - kvOverhead
	if o.MaxValueBytes > 0 && o.MaxValueBytes < k.maxValue {
		k.maxValue = o.MaxValueBytes
	}
	s.b, s.kv = k, k
	s.wg.Go(k.linkLoop)
	if err := k.start(ctx); err != nil {
		s.closed = true
		k.w.shutdown(0)
		close(s.stop)
		s.wg.Wait()
		return nil, err
	}
	for range k.writers {
		s.wg.Go(k.work)
	}
	return s, nil
}

// start reads the retained messages and starts the two watchers (owned by
// Store.wg, ended by Close).
func (k *kvBackend) start(ctx context.Context) error {
	s := k.s
	rw, rcancel, err := k.watchAtStart(ctx, []string{kvRetained + "*"})
	if err != nil {
		return fmt.Errorf("session: watch retained messages: %w", err)
	}
	if err := initial(ctx, rw, k.snapshotTimeout(), k.retainedEvent); err != nil {
		stopWatch(rw)
		rcancel()
		return fmt.Errorf("session: load retained messages: %w", err)
	}
	ow, ocancel, err := k.watchAtStart(ctx, []string{kvOwner + "*"}, jetstream.UpdatesOnly())
	if err != nil {
		stopWatch(rw)
		rcancel()
		return fmt.Errorf("session: watch owner records: %w", err)
	}
	if err := k.serveHandovers(); err != nil {
		stopWatch(rw)
		rcancel()
		stopWatch(ow)
		ocancel()
		return fmt.Errorf("session: %w", err)
	}
	s.wg.Go(func() { k.watchLoop(rw, rcancel, k.retainedEvent) })
	s.wg.Go(func() { k.watchLoop(ow, ocancel, k.ownerEvent) })
	s.mu.Lock()
	s.log.Info().Str(logBucket, k.bucket).Int("retained", len(k.initial)).Msg("session bucket opened")
	s.mu.Unlock()
	return nil
}

// watchAtStart is watch for the bucket's opening: a JetStream cluster
// that has just started (or just lost every node and come back) may take
// longer than one request's timeout to answer for a new bucket's stream,
// so an unavailable bucket is asked again, with backoff, until ctx ends.
func (k *kvBackend) watchAtStart(ctx context.Context, keys []string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, context.CancelFunc, error) {
	backoff := 100 * time.Millisecond
	for {
		w, cancel, err := k.watch(ctx, keys, opts...)
		if err == nil || !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			return w, cancel, err
		}
		k.s.log.Warn().Err(err).Str(logBucket, k.bucket).Dur("retry_in", backoff).Msg("session bucket not available yet")
		select {
		case <-ctx.Done():
			return nil, nil, err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// snapshotTimeout bounds reading every key of a kind (all owner records,
// all retained messages).
func (k *kvBackend) snapshotTimeout() time.Duration { return max(10*k.timeout, time.Minute) }

// put queues a write of k = value, fenced by its session's owner record.
func (k *kvBackend) put(id, sk string, value []byte) (loc, error) {
	if err := k.queue(id, sk, value, false); err != nil {
		return loc{}, err
	}
	return loc{n: uint32(len(value))}, nil
}

func (k *kvBackend) del(id, sk string) error { return k.queue(id, sk, nil, true) }

func (k *kvBackend) queue(id, sk string, value []byte, del bool) error {
	pk, err := parseKey(sk)
	if err != nil {
		return err
	}
	if len(value) > k.maxValue {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrValueTooLarge, len(value), k.maxValue)
	}
	it := &kvWrite{id: id, subj: k.prefix + bucketKey(pk), value: value, del: del, what: string(pk.kind)}
	if pk.kind == kRetained {
		it.lane, it.topic = retainedLane(pk.id), pk.id
	} else {
		rev := k.held[id]
		if rev == 0 && !k.claiming[id] {
			return fmt.Errorf("%w: %q", ErrNotOwner, id)
		}
		it.lane, it.fence, it.lazy = sessionLane(id), rev, rev == 0
	}
	return k.w.enqueue(it)
}

// claimLaterLocked queues the claim of session id ahead of its first
// write: a clean start claims nothing when no session of its ID is stored
// anywhere (Claim cannot tell whether the new session will be), so the
// first client record of a persistent one claims it here, without a
// network round trip under the engine's lock. If another node claims it
// first, the writes queued behind fail (not_owner) and this node serves
// the session from memory.
func (k *kvBackend) claimLaterLocked(id string) error {
	if k.held[id] != 0 || k.claiming[id] {
		return nil
	}
	if err := k.w.enqueue(&kvWrite{lane: sessionLane(id), id: id, what: "owner", subj: k.prefix + ownerKey(id), claim: true}); err != nil {
		return err
	}
	k.claiming[id] = true
	return nil
}

// claimNow makes a queued claim.
func (k *kvBackend) claimNow(it *kvWrite) {
	s := k.s
	ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
	defer cancel()
	rev, _, err := k.claim(ctx, it.id, nil, true)
	s.mu.Lock()
	delete(k.claiming, it.id)
	if err == nil {
		k.holdLocked(it.id, rev)
	}
	s.mu.Unlock()
	if err != nil {
		s.failed(reasonNotOwner, fmt.Errorf("%w: %w", ErrNotOwner, err), it.id, "owner")
	}
}

// drop queues the deletes of every key of session ss, then the release of
// its owner record.
func (k *kvBackend) drop(ss *sess) error {
	if k.held[ss.id] == 0 && !k.claiming[ss.id] {
		return fmt.Errorf("%w: %q", ErrNotOwner, ss.id)
	}
	keys := []string{clientKey(ss.id), offlineKey(ss.id)}
	for _, sub := range ss.subs {
		keys = append(keys, subKey(ss.id, sub.filter))
	}
	for _, m := range ss.msgs {
		keys = append(keys, pidKey(kMessage, ss.id, m.pid))
		if m.rel.ok() {
			keys = append(keys, pidKey(kReleased, ss.id, m.pid))
		}
	}
	for _, q := range ss.inbound {
		keys = append(keys, pidKey(kInbound, ss.id, q.pid))
	}
	var errs []error
	for _, sk := range keys {
		if err := k.queue(ss.id, sk, nil, true); err != nil {
			errs = append(errs, err)
			break
		}
	}
	k.releaseLocked(ss.id)
	return errors.Join(errs...)
}

// releaseLocked queues the delete of session id's owner record, if this
// node holds it; the writer skips it if the session is stored again
// before its turn.
func (k *kvBackend) releaseLocked(id string) {
	rev := k.held[id]
	if rev == 0 && !k.claiming[id] {
		return
	}
	if err := k.w.enqueue(&kvWrite{lane: sessionLane(id), id: id, what: "owner", subj: k.prefix + ownerKey(id), release: true,
		fence: rev, lazy: rev == 0}); err != nil {
		k.s.failed(reasonOf(err), err, id, "owner")
	}
}

// work makes queued writes until the writer stops.
func (k *kvBackend) work() {
	for {
		l, it, ok := k.w.next()
		if !ok {
			return
		}
		k.write(it)
		k.w.done(l)
	}
}

// write makes one queued write.
func (k *kvBackend) write(it *kvWrite) {
	s := k.s
	switch {
	case it.barrier != nil && it.check:
		it.barrier <- k.w.takeFailed(it.lane)
		return
	case it.barrier != nil:
		it.barrier <- nil
		return
	case it.claim:
		k.claimNow(it)
		return
	case it.lazy:
		s.mu.Lock()
		it.fence = k.held[it.id]
		s.mu.Unlock()
		if it.fence == 0 {
			err := fmt.Errorf("%w: %q: its claim failed", ErrNotOwner, it.id)
			k.w.fail(it.lane, err)
			s.failed(reasonNotOwner, err, it.id, it.what)
			return
		}
	}
	m := nats.NewMsg(it.subj)
	m.Data = it.value
	m.Header.Set(hdrNode, k.node)
	var opts []jetstream.PublishOpt
	if it.del || it.release {
		k.markDeleted(m, &opts)
	}
	switch {
	case it.release:
		s.mu.Lock()
		again := s.ix.sessions[it.id] != nil || k.held[it.id] != it.fence
		if !again {
			k.unholdLocked(it.id) // before the write: its echo is not a takeover
		}
		s.mu.Unlock()
		if again {
			return
		}
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(it.fence))
	case it.fence > 0:
		m.Header.Set(hdrOwnerRev, strconv.FormatUint(it.fence, 10))
		opts = append(opts, jetstream.WithExpectLastSequenceForSubject(it.fence, k.prefix+ownerKey(it.id)))
	}
	ack, err := k.publish(context.Background(), m, opts...)
	if it.topic != "" {
		var rev uint64
		if err == nil {
			rev = ack.Sequence
		}
		k.retainedAcked(it.topic, it.m, rev)
	}
	if err != nil {
		k.w.fail(it.lane, err)
		s.failed(reasonOf(err), err, it.id, it.what)
	}
}

// markDeleted makes m a delete marker: a purge (earlier revisions go) that
// expires after the marker TTL, or a plain delete where the bucket has no
// message TTLs.
func (k *kvBackend) markDeleted(m *nats.Msg, opts *[]jetstream.PublishOpt) {
	if k.ttl > 0 {
		m.Header.Set(kvOpHeader, kvOpPurge)
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		*opts = append(*opts, jetstream.WithMsgTTL(k.ttl))
		return
	}
	m.Header.Set(kvOpHeader, kvOpDelete)
}

// publish sends m to the stream and waits for its acknowledgement. Not
// connected: ErrUnavailable at once (an outage must not hold the writers
// for Timeout). A replicated stream may refuse an expected-sequence check
// while another one on the same subject is being proposed (10164; a
// claim racing a write): that is retried.
func (k *kvBackend) publish(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	for attempt := 0; ; attempt++ {
		if st := k.nc.Status(); st != nats.CONNECTED {
			return nil, fmt.Errorf("%w: nats connection %s", ErrUnavailable, st)
		}
		rctx, cancel := k.requestCtx(ctx)
		ack, err := k.js.PublishMsg(rctx, m, opts...)
		cancel()
		if err == nil {
			return ack, nil
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) {
			switch apiErr.ErrorCode {
			case jetstream.JSErrCodeStreamWrongLastSequenceConstant:
				if attempt < 5 {
					if sleep(ctx, time.Duration(attempt+1)*5*time.Millisecond) != nil {
						return nil, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
					}
					continue
				}
				return nil, fmt.Errorf("%w: %w", ErrFenced, err)
			case jetstream.JSErrCodeStreamWrongLastSequence:
				return nil, fmt.Errorf("%w: %w", ErrFenced, err)
			}
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			return nil, fmt.Errorf("%w: %w", ErrValueTooLarge, err)
		}
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (k *kvBackend) holdLocked(id string, rev uint64) {
	k.held[id] = rev
	k.heldTok[token(id)] = id
}

func (k *kvBackend) unholdLocked(id string) {
	delete(k.held, id)
	delete(k.heldTok, token(id))
	delete(k.cache, id)
}

// The message cache (msgCache).

func (k *kvBackend) cacheMessageLocked(id string, pid uint16, m *engine.Message, subIDs []uint32) {
	if c := k.cache[id]; c != nil {
		c.msgs[pid] = engine.StoredMessage{PID: pid, Message: m, SubIDs: subIDs}
	}
}

func (k *kvBackend) uncacheMessageLocked(id string, pid uint16) {
	if c := k.cache[id]; c != nil {
		delete(c.msgs, pid)
	}
}

func (k *kvBackend) forgetCachedLocked(id string) { delete(k.cache, id) }

func (k *kvBackend) pruneCacheLocked(now time.Time) {
	for id, c := range k.cache {
		if now.Sub(c.at) > cacheTTL {
			delete(k.cache, id)
		}
	}
}

// cachedLocked returns the cached messages of ss in the index's order,
// with their PUBREC flags; false when there is no cache entry.
func (k *kvBackend) cachedLocked(ss *sess) ([]engine.StoredMessage, bool) {
	c := k.cache[ss.id]
	if c == nil {
		return nil, false
	}
	delete(k.cache, ss.id)
	out := make([]engine.StoredMessage, 0, len(ss.msgs))
	for _, ml := range ss.msgs {
		if sm, ok := c.msgs[ml.pid]; ok {
			sm.Released = ml.rel.ok() && sm.Message.QoS == 2
			out = append(out, sm)
		}
	}
	return out, true
}

// loadMessages serves LoadMessages: from the cache the claim filled, else
// from the bucket — a network read while the engine holds its locks,
// bounded by Timeout; it happens only when the claim could not read them.
func (k *kvBackend) loadMessages(id string) ([]engine.StoredMessage, error) {
	s := k.s
	s.mu.Lock()
	ss := s.ix.sessions[id]
	if ss == nil {
		s.mu.Unlock()
		return nil, nil
	}
	if msgs, ok := k.cachedLocked(ss); ok {
		s.mu.Unlock()
		return msgs, nil
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
	defer cancel()
	if err := k.fetchMessages(ctx, id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss = s.ix.sessions[id]; ss == nil {
		return nil, nil
	}
	msgs, _ := k.cachedLocked(ss)
	return msgs, nil
}

// fetchMessages reads the outbound messages of session id (held here)
// from the bucket into the cache, once this node's writes of it have
// landed.
func (k *kvBackend) fetchMessages(ctx context.Context, id string) error {
	if err := k.w.flush(ctx, sessionLane(id)); err != nil {
		return fmt.Errorf("session: load messages of %q: %w: %w", id, ErrUnavailable, err)
	}
	tok := token(id)
	items, err := k.read(ctx, id, []string{kvMessage + tok + ".*"})
	if err != nil {
		return err
	}
	c := &msgCache{at: time.Now(), msgs: map[uint16]engine.StoredMessage{}}
	for _, e := range items {
		pk, err := storeKey(id, e.Key(), e.Value())
		var sm engine.StoredMessage
		if err == nil {
			sm.Message, sm.SubIDs, err = decodeMessage(e.Value())
		}
		if err != nil {
			k.s.log.Warn().Err(err).Str(logClient, id).Str(logKey, e.Key()).Msg("stored message does not load; skipped")
			continue
		}
		sm.PID = pk.pid
		c.msgs[pk.pid] = sm
	}
	s := k.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ix.sessions[id] != nil {
		// What the engine stored since the read is the newest: keep it.
		if old := k.cache[id]; old != nil {
			for pid, sm := range old.msgs {
				c.msgs[pid] = sm
			}
		}
		k.cache[id] = c
	}
	return nil
}

// read returns the current value of every key of session id matching
// subjects, in revision order (one ordered consumer, served by the
// stream's leader).
func (k *kvBackend) read(ctx context.Context, id string, subjects []string) ([]jetstream.KeyValueEntry, error) {
	if st := k.nc.Status(); st != nats.CONNECTED {
		return nil, fmt.Errorf("session: load %q: %w: nats connection %s", id, ErrUnavailable, st)
	}
	rctx, cancel := k.requestCtx(ctx)
	defer cancel()
	w, err := k.kv.WatchFiltered(rctx, slices.Clone(subjects), jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("session: load %q: %w: %w", id, ErrUnavailable, err)
	}
	defer stopWatch(w)
	var out []jetstream.KeyValueEntry
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("session: load %q: %w: watcher closed", id, ErrUnavailable)
			}
			if e == nil {
				return out, nil
			}
			out = append(out, e)
		case <-rctx.Done():
			return nil, fmt.Errorf("session: load %q: %w: %w", id, ErrUnavailable, rctx.Err())
		}
	}
}

// close: the store's goroutines have ended (Store.Close drained the
// writer first).
func (k *kvBackend) close() error { return nil }

// drain gives the queued writes Timeout to land, then stops the writers.
func (k *kvBackend) drain() {
	if left := k.w.shutdown(k.timeout); left > 0 {
		k.s.errMu.Lock()
		k.s.writeErrs[reasonClosed] += int64(left)
		k.s.errMu.Unlock()
		k.s.log.Error().Int("writes", left).Msg("session writes still queued at close not stored")
	}
}
