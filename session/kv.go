package session

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// KVOptions configure a Store kept in a NATS JetStream key-value bucket
// (OpenKV), shared by several gateway nodes.
type KVOptions struct {
	// Options are the store's: parking, expiry sweeps, queue bounds,
	// Discarded, Logger. SyncInterval is unused: every write is
	// acknowledged by JetStream before the store goes on.
	Options
	// Bucket is the key-value bucket; default "ferrymq_sessions". Created
	// with file storage and Replicas when missing; an existing bucket is
	// used as it is (so an operator may create it with other settings).
	Bucket string
	// Replicas of the bucket when it is created: 1 on one server, 3 on a
	// cluster (a write is acknowledged once a majority stored it).
	// Default 1.
	Replicas int
	// NodeID names this gateway node in the owner records. It must be
	// unique among the live nodes and should stay the same across restarts:
	// at start a node takes back the offline sessions it owned. Default:
	// the host name.
	NodeID string
	// Timeout bounds one request to JetStream (a write, a read, claiming a
	// session, loading one). Default 5 s.
	Timeout time.Duration
	// MaxValueBytes bounds one stored value. Default and ceiling: the
	// server's max payload (1 MiB unless configured) less 4 KiB for the
	// subject and headers. A larger record is not stored (ErrValueTooLarge,
	// counted and logged).
	MaxValueBytes int
	// MarkerTTL is how long the marker a delete leaves in a bucket this
	// store created is kept (long enough for every node's watcher to see
	// it). Default 10 minutes.
	MarkerTTL time.Duration
}

func (o *KVOptions) withDefaults() {
	o.Options.withDefaults()
	if o.Bucket == "" {
		o.Bucket = "ferrymq_sessions"
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.NodeID == "" {
		o.NodeID, _ = os.Hostname()
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.MarkerTTL <= 0 {
		o.MarkerTTL = 10 * time.Minute
	}
}

func (o *KVOptions) validate() error {
	var errs []error
	if o.Replicas < 1 || o.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas %d, want 1 to 5", o.Replicas))
	}
	if o.NodeID == "" || len(o.NodeID) > maxNodeBytes {
		errs = append(errs, fmt.Errorf("node ID of %d bytes, want 1 to %d", len(o.NodeID), maxNodeBytes))
	}
	if o.MarkerTTL < time.Second {
		errs = append(errs, fmt.Errorf("marker TTL %s, want at least 1s", o.MarkerTTL))
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

// kvBackend keeps a Store's records in a JetStream key-value bucket. Every
// write of a session's record is fenced by the owner record: it carries
// Nats-Expected-Last-Subject-Sequence = the revision of o.<client> this
// node wrote when it claimed the session, checked by the stream against
// the owner key's subject (Nats-Expected-Last-Subject-Sequence-Subject).
// Once another node claims the session (a newer revision) or it ended
// (a delete marker), the stream refuses this node's writes (ErrFenced):
// nothing this node writes after it lost a session reaches the bucket.
//
// Its fields are guarded by Store.mu, except the counters.
type kvBackend struct {
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	nc       *nats.Conn
	bucket   string
	prefix   string // "$KV.<bucket>."
	node     string
	inc      uint64 // this process's incarnation (owner records)
	gen      uint64 // connections claimed
	timeout  time.Duration
	maxValue int
	ttl      time.Duration // delete markers' TTL; 0: the bucket has no message TTLs
	log      zerolog.Logger
	errLog   zerolog.Logger // sampled: an outage must not flood the log

	held    map[string]uint64       // session → the owner revision this node holds
	heldTok map[string]string       // owner key token → session
	conns   map[string]*mqtt.Client // session → the connection whose claim is held
	preload map[string]kvValue

	// Retained messages: the topic of each retained key token known (for
	// deletes, whose marker has no value), the revision of deletes not yet
	// seen back (a put older than it is stale), and, until mochi loaded
	// them (StoredRetainedMessages), the messages themselves.
	retTok  map[string]string
	tomb    map[string]uint64
	pending map[string]*storage.Message
	handed  bool
	lastRev uint64 // revision of the last successful write

	// link is canceled when the NATS connection is lost, so that requests
	// waiting on it fail at once instead of after Timeout (linkLoop).
	link atomic.Pointer[linkCtx]

	errUnavailable atomic.Int64
	errTooLarge    atomic.Int64
	errFenced      atomic.Int64
	errNotOwner    atomic.Int64
	takenOver      atomic.Int64
}

// linkCtx is the context of one period of the NATS connection being up.
type linkCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newLink() *linkCtx {
	ctx, cancel := context.WithCancel(context.Background())
	return &linkCtx{ctx, cancel}
}

// requestCtx bounds one request to JetStream: Timeout, or until the
// connection is lost.
func (k *kvBackend) requestCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(k.link.Load().ctx, k.timeout)
}

// linkLoop follows the connection's status until stop: losing the
// connection cancels the requests waiting on it; getting it back starts a
// new period.
func (k *kvBackend) linkLoop(stop <-chan struct{}) {
	ch := k.nc.StatusChanged()
	defer k.nc.RemoveStatusListener(ch)
	defer func() { k.link.Load().cancel() }()
	for {
		select {
		case <-stop:
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

// kvValue is a value read with its revision.
type kvValue struct {
	rev   uint64
	value []byte
}

// OpenKV opens (creating it when missing) the key-value bucket
// o.Bucket through js and returns a Store kept in it: the same hook as
// Open's, whose sessions several gateway nodes share. It loads the retained
// messages, takes back the sessions this node (o.NodeID) owned, and starts
// the watchers: of the owner records (a session another node takes over
// is dropped here and its client disconnected) and of the retained
// messages (applied to the attached mochi server). Close stops them; the
// NATS connection stays the caller's.
func OpenKV(ctx context.Context, js jetstream.JetStream, o KVOptions) (*Store, error) {
	o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("session: kv options: %w", err)
	}
	s := newStore(o.Options)
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
	k := &kvBackend{js: js, kv: kv, nc: js.Conn(), bucket: o.Bucket, prefix: "$KV." + o.Bucket + ".",
		node: o.NodeID, inc: binary.BigEndian.Uint64(incb[:]), timeout: o.Timeout, log: s.log,
		held: map[string]uint64{}, heldTok: map[string]string{}, conns: map[string]*mqtt.Client{},
		retTok: map[string]string{}, tomb: map[string]uint64{}, pending: map[string]*storage.Message{}}
	k.errLog = s.log.Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Second})
	k.link.Store(newLink())
	if st.LimitMarkerTTL() > 0 { // the stream allows message TTLs
		k.ttl = o.MarkerTTL
	}
	k.maxValue = int(k.nc.MaxPayload()) - kvOverhead
	if o.MaxValueBytes > 0 && o.MaxValueBytes < k.maxValue {
		k.maxValue = o.MaxValueBytes
	}
	s.b, s.kv = k, k
	s.log = s.log.With().Str("node", o.NodeID).Logger()
	k.log = s.log
	s.wg.Go(func() { k.linkLoop(s.stop) })
	if err := s.startKV(ctx); err != nil {
		close(s.stop)
		s.wg.Wait()
		return nil, err
	}
	s.wg.Go(s.loop)
	return s, nil
}

// put writes key = value, fenced by the owner revision of its session.
func (k *kvBackend) put(key string, value []byte) (entry, error) {
	return k.write(key, value, false, entry{})
}

// del leaves a delete marker for key (a purge with a TTL when the bucket
// allows message TTLs, so markers do not pile up). A session's delete is
// fenced like a put; a retained message's is conditional on the revision
// this node knows (old): a newer message set elsewhere is not deleted.
func (k *kvBackend) del(key string, old entry) error {
	_, err := k.write(key, nil, true, old)
	return err
}

func (k *kvBackend) write(key string, value []byte, del bool, old entry) (entry, error) {
	kk, id, err := kvKey(key)
	if err != nil {
		k.errUnavailable.Add(1)
		k.errLog.Error().Err(err).Msg("session key not mapped; not stored")
		return entry{}, err
	}
	subj := k.prefix + kk
	if len(value) > k.maxValue {
		k.errTooLarge.Add(1)
		err := fmt.Errorf("%w: %d bytes, at most %d", ErrValueTooLarge, len(value), k.maxValue)
		k.errLog.Error().Err(err).Str("client", id).Str("key", kk).Msg("session record not stored")
		return entry{}, err
	}
	m := nats.NewMsg(subj)
	m.Data = value
	m.Header.Set(hdrNode, k.node)
	var opts []jetstream.PublishOpt
	if del {
		k.markDeleted(m, &opts)
	}
	if id != "" {
		rev := k.held[id]
		if rev == 0 {
			k.errNotOwner.Add(1)
			err := fmt.Errorf("%w: %q", ErrNotOwner, id)
			k.errLog.Warn().Err(err).Str("key", kk).Msg("session record not stored")
			return entry{}, err
		}
		m.Header.Set(hdrOwnerRev, fmt.Sprint(rev))
		opts = append(opts, jetstream.WithExpectLastSequenceForSubject(rev, k.prefix+ownerKey(id)))
	} else if del && old.off > 0 {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(uint64(old.off)))
	}
	ack, err := k.publish(m, opts...)
	if err != nil {
		if id == "" && errors.Is(err, ErrFenced) {
			return entry{}, err // a retained message changed elsewhere: the watcher brings it
		}
		k.failed(err, id, kk)
		return entry{}, err
	}
	k.lastRev = ack.Sequence
	return entry{off: int64(ack.Sequence), n: int32(max(len(value), 1))}, nil
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

// failed counts and logs a write that did not happen.
func (k *kvBackend) failed(err error, id, key string) {
	switch {
	case errors.Is(err, ErrFenced):
		k.errFenced.Add(1)
		k.errLog.Warn().Err(err).Str("client", id).Str("key", key).
			Msg("session write refused: another node owns the session now")
	case errors.Is(err, ErrValueTooLarge):
		k.errTooLarge.Add(1)
		k.errLog.Error().Err(err).Str("client", id).Str("key", key).Msg("session record not stored")
	default:
		k.errUnavailable.Add(1)
		k.errLog.Error().Err(err).Str("client", id).Str("key", key).Msg("session write failed; the session is not persisted")
	}
}

// publish sends m to the stream and waits for its acknowledgement. Not
// connected: ErrUnavailable at once (an outage must not hold every hook
// for Timeout). A replicated stream may refuse an expected-sequence check
// while another one on the same subject is being proposed (10164): that is
// retried.
func (k *kvBackend) publish(m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if st := k.nc.Status(); st != nats.CONNECTED {
		return nil, fmt.Errorf("%w: nats connection %s", ErrUnavailable, st)
	}
	for attempt := 0; ; attempt++ {
		ctx, cancel := k.requestCtx()
		ack, err := k.js.PublishMsg(ctx, m, opts...)
		cancel()
		if err == nil {
			return ack, nil
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) {
			switch apiErr.ErrorCode {
			case jetstream.JSErrCodeStreamWrongLastSequenceConstant:
				if attempt < 3 {
					time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
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

// read returns key's value at revision e.off: from the session just loaded,
// else from the bucket. A direct get may be answered by a replica a little
// behind: a missing revision is asked for again twice.
func (k *kvBackend) read(key string, e entry) ([]byte, error) {
	if v, ok := k.preload[key]; ok && v.rev == uint64(e.off) {
		return v.value, nil
	}
	kk, _, err := kvKey(key)
	if err != nil {
		return nil, err
	}
	if st := k.nc.Status(); st != nats.CONNECTED {
		return nil, fmt.Errorf("session: read %s: %w: nats connection %s", kk, ErrUnavailable, st)
	}
	for attempt := 0; ; attempt++ {
		ctx, cancel := k.requestCtx()
		ent, err := k.kv.GetRevision(ctx, kk, uint64(e.off))
		cancel()
		if errors.Is(err, jetstream.ErrKeyNotFound) && attempt < 2 {
			time.Sleep(time.Duration(attempt+1) * 10 * time.Millisecond)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("session: read %s at revision %d: %w", kk, e.off, err)
		}
		return ent.Value(), nil
	}
}

// hold records that this node owns session id at owner revision rev,
// claimed for connection cl (nil: taken back at start).
func (k *kvBackend) hold(id string, rev uint64, cl *mqtt.Client) {
	k.held[id] = rev
	k.heldTok[token(id)] = id
	if cl != nil {
		k.conns[id] = cl
	} else {
		delete(k.conns, id)
	}
}

// unhold forgets this node's ownership of id without writing.
func (k *kvBackend) unhold(id string) {
	delete(k.held, id)
	delete(k.heldTok, token(id))
	delete(k.conns, id)
}

// release deletes the owner record of a session that ended here, if this
// node still owns it (the delete is conditional on the revision held).
func (k *kvBackend) release(id string) {
	rev := k.held[id]
	if rev == 0 {
		return
	}
	k.unhold(id)
	kk := ownerKey(id)
	m := nats.NewMsg(k.prefix + kk)
	m.Header.Set(hdrNode, k.node)
	var opts []jetstream.PublishOpt
	k.markDeleted(m, &opts)
	opts = append(opts, jetstream.WithExpectLastSequencePerSubject(rev))
	if _, err := k.publish(m, opts...); err != nil {
		k.failed(err, id, kk)
	}
}

func (k *kvBackend) tick() {}

func (k *kvBackend) size() int64 { return 0 }

func (k *kvBackend) close() error { return nil }

// errs are the backend's failed writes by reason.
func (k *kvBackend) errs() map[string]int64 {
	return map[string]int64{"unavailable": k.errUnavailable.Load(), "too_large": k.errTooLarge.Load(),
		"fenced": k.errFenced.Load(), "not_owner": k.errNotOwner.Load()}
}
