package jetstream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// Read implements core.Broker with batched direct gets filtered on the
// queue's subject of each epoch that wrote to it, oldest first. A queue's
// offsets are its messages' stream sequences minus one: increasing, with
// gaps where other queues' messages are.
func (e *Engine) Read(ctx context.Context, req core.ReadRequest) (core.ReadResult, error) {
	if e.closed.Load() {
		return core.ReadResult{}, core.ErrClosed
	}
	t, err := e.queueTopic(ctx, req.Topic, req.Queue)
	if err != nil {
		return core.ReadResult{}, err
	}
	rg, fresh, err := e.rangeOf(ctx, t, false)
	if err != nil {
		return core.ReadResult{}, err
	}
	if req.Offset > rg.Max && !fresh {
		// Clamping down on a stale maximum could hand out messages again:
		// look afresh.
		if rg, _, err = e.rangeOf(ctx, t, true); err != nil {
			return core.ReadResult{}, err
		}
	}
	lay := t.lay.Load()
	res := core.ReadResult{Range: rg, NextOffset: req.Offset, Epochs: len(lay.epochs)}
	off := req.Offset
	if off < rg.Min {
		off, res.Clamped = rg.Min, true
	} else if off > rg.Max {
		off, res.Clamped = rg.Max, true
	}
	res.NextOffset = off
	if (off >= rg.Max && fresh) || (req.Until > 0 && off >= req.Until) {
		return res, nil
	}
	n := req.MaxCount
	if n <= 0 {
		n = 32
	}
	maxBytes := req.MaxBytes
	if maxBytes <= 0 {
		maxBytes = 4 << 20
	}
	size := 0
	for _, seg := range lay.segments(t.tok, req.Queue) {
		if off >= seg.end {
			continue
		}
		raws, err := e.get.do(ctx, t.stream, directReq{Seq: uint64(off) + 1, NextFor: seg.subject, Batch: n, MaxBytes: max(maxBytes-size, 1)})
		if err != nil {
			return res, e.readErr(t, err)
		}
		n -= len(raws)
		done := true // this segment has more, or the read is over
		for _, nm := range raws {
			r, err := parseDirect(nm)
			if err != nil {
				return res, fmt.Errorf("%w: read %s/%d: %w", core.ErrCorrupt, t.name, req.Queue, err)
			}
			o := int64(r.seq) - 1
			if o >= seg.end {
				// A message of an ended epoch stored after the epoch's
				// boundary was recorded (resize.go): every message of the
				// segment before it was seen.
				e.straggler(t, req.Queue, seg.epoch, r.seq)
				done = false
				break
			}
			if req.Until > 0 && o >= req.Until {
				res.NextOffset = req.Until
				return res, nil
			}
			// The server stops after the message that crosses max_bytes (and
			// counts subjects and headers); the contract bounds stored sizes,
			// with at least one message.
			if size += len(r.data); size > maxBytes && res.NextOffset > off {
				return res, nil
			}
			sm, err := e.decode(t, lay, r)
			if err != nil {
				return res, err
			}
			res.NextOffset = sm.QueueOffset + 1
			if res.NextOffset > res.Range.Max { // newer than the cached range
				res.Range.Max = res.NextOffset
			}
			if res.NextOffset == seg.end {
				done = false
			}
			if len(req.Tags) > 0 && !slices.Contains(req.Tags, sm.Tag) {
				continue
			}
			res.Messages = append(res.Messages, sm)
		}
		if done || n <= 0 {
			break
		}
		// Every message of the queue in this epoch was read: go on with
		// the next epoch that wrote to it.
		off = seg.end
		res.NextOffset = max(res.NextOffset, seg.end)
		if req.Until > 0 && res.NextOffset >= req.Until {
			res.NextOffset = req.Until
			break
		}
	}
	return res, nil
}

// straggler logs a message stored under an ended epoch's queue count after
// the boundary recorded for it: only a publish the server had already
// matched to the old subjects, but handed to the stream a long while later,
// can be one (resize.go). Reads stop before it.
func (e *Engine) straggler(t *topicState, queue, epoch int, seq uint64) {
	e.log.Error().Str("topic", t.name).Int("queue", queue).Int("epoch", epoch).Uint64("seq", seq).
		Msg("message of an ended epoch stored after the epoch's boundary: not read")
}

// rangeTTL is how long Read trusts a topic's cached range: a read costs
// one direct get instead of a stream info and a direct get. A stale range
// is only ever lower than the real one: its minimum clamps less, its
// maximum is raised by what the read returns, and a read above it looks
// afresh before clamping down.
const rangeTTL = 250 * time.Millisecond

// rangeOf returns t's offset range, from the cache unless it is older than
// rangeTTL or refresh is set; fresh says it was read just now.
func (e *Engine) rangeOf(ctx context.Context, t *topicState, refresh bool) (rg core.QueueRange, fresh bool, err error) {
	if c := t.rng.Load(); c != nil && !refresh && time.Since(c.at) < rangeTTL {
		return c.r, false, nil
	}
	info, _, err := e.info(ctx, t)
	if err != nil {
		return rg, false, err
	}
	rg = streamRange(info)
	t.rng.Store(&cachedRange{r: rg, at: time.Now()})
	return rg, true, nil
}

type cachedRange struct {
	r  core.QueueRange
	at time.Time
}

func (e *Engine) readErr(t *topicState, err error) error {
	if _, _, ierr := e.info(context.Background(), t); ierr != nil && ierr != err {
		if strings.Contains(ierr.Error(), core.ErrTopicNotFound.Error()) {
			return ierr
		}
	}
	return err
}

// errStaleLayout is decode's answer for a message of an epoch the engine
// does not know yet: its caller learns the topic's epochs and tries again.
var errStaleLayout = errors.New("jetstream: message of an unknown epoch")

// decode turns a direct get answer into a stored message of topic t, whose
// epochs are lay.
func (e *Engine) decode(t *topicState, lay *layout, r rawMsg) (*core.StoredMessage, error) {
	q, ep, ok := queueOf(t.tok, r.subject)
	if ok && ep > lay.pubEpoch() {
		return nil, errStaleLayout
	}
	// A message of an intent's epoch (Get by ID of an acknowledged message,
	// before the commit) has its queues; readers do not go there yet.
	if !ok || (ep < len(lay.epochs) && q >= lay.epochs[ep].Queues) || (ep == len(lay.epochs) && q >= lay.intent.Queues) {
		return nil, fmt.Errorf("%w: %s sequence %d has subject %q", core.ErrCorrupt, t.name, r.seq, r.subject)
	}
	m, err := decodeRecord(r.data)
	if err != nil {
		return nil, &core.CorruptError{Topic: t.name, Queue: q, QueueOffset: int64(r.seq) - 1, Err: err}
	}
	if m.Topic != t.name {
		return nil, fmt.Errorf("%w: %s sequence %d holds a message of topic %q", core.ErrCorrupt, t.name, r.seq, m.Topic)
	}
	return &core.StoredMessage{Message: m, ID: newID(t.name, r.seq), Queue: q, QueueOffset: int64(r.seq) - 1,
		CommitLogOffset: int64(r.seq), Size: len(r.data), StoredAt: r.time}, nil
}

// Get implements core.Broker.
func (e *Engine) Get(ctx context.Context, id core.MessageID) (*core.StoredMessage, error) {
	if e.closed.Load() {
		return nil, core.ErrClosed
	}
	if id.Kind() != IDKindJetStream {
		return nil, fmt.Errorf("%w: %s is not an ID of the JetStream engine", core.ErrMessageNotFound, id)
	}
	h, seq := idParts(id)
	name, ok := e.topicByHash(h)
	if !ok {
		if _, err := e.Topics(ctx); err != nil {
			return nil, err
		}
		if name, ok = e.topicByHash(h); !ok {
			return nil, fmt.Errorf("%w: %s: no topic", core.ErrMessageNotFound, id)
		}
	}
	t, err := e.topic(ctx, name, false)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", core.ErrMessageNotFound, id, err)
	}
	return e.getSeq(ctx, t, seq, id)
}

func (e *Engine) getSeq(ctx context.Context, t *topicState, seq uint64, id core.MessageID) (*core.StoredMessage, error) {
	raws, err := e.get.do(ctx, t.stream, directReq{Seq: seq, Batch: 1})
	if err != nil {
		return nil, err
	}
	if len(raws) == 0 {
		return nil, fmt.Errorf("%w: %s", core.ErrMessageNotFound, id)
	}
	r, err := parseDirect(raws[0])
	if err != nil {
		return nil, fmt.Errorf("%w: %w", core.ErrCorrupt, err)
	}
	if r.seq != seq || strings.HasPrefix(r.subject, markerPrefix) {
		// Deleted, the next one answered; or an epoch marker, no message.
		return nil, fmt.Errorf("%w: %s", core.ErrMessageNotFound, id)
	}
	sm, err := e.decode(t, t.lay.Load(), r)
	if errors.Is(err, errStaleLayout) {
		var lay *layout
		if _, lay, err = e.info(ctx, t); err != nil {
			return nil, err
		}
		if sm, err = e.decode(t, lay, r); errors.Is(err, errStaleLayout) {
			err = fmt.Errorf("%w: %s sequence %d has subject %q of no epoch of the topic", core.ErrCorrupt, t.name, r.seq, r.subject)
		}
	}
	return sm, err
}

func (e *Engine) topicByHash(h uint64) (string, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	name, ok := e.byHash[h]
	return name, ok
}

// FindByKey implements core.Broker through the index stream: the entries
// under the key's subject name the sequences of the topic's messages with
// that key (as sharding key or in Keys); each is fetched and checked (keys
// share subjects by hash). It first waits until this engine's index writes
// issued so far are stored, so a produce is found once it returned.
func (e *Engine) FindByKey(ctx context.Context, topic, key string, q core.KeyQuery) ([]*core.StoredMessage, error) {
	if e.closed.Load() {
		return nil, core.ErrClosed
	}
	t, err := e.topic(ctx, topic, false)
	if err != nil {
		return nil, err
	}
	limit := q.Max
	if limit <= 0 {
		limit = 32
	}
	if err := e.idx.barrier(ctx); err != nil {
		return nil, err
	}
	req := directReq{NextFor: keySubject(t.tok, key), Batch: 256}
	if !q.Begin.IsZero() {
		b := q.Begin
		req.Start = &b
	} else {
		req.Seq = 1
	}
	var out []*core.StoredMessage
	seen := map[uint64]bool{}
	for scanned := 0; scanned < maxKeyScan && len(out) < limit; {
		raws, err := e.get.do(ctx, keysStream, req)
		if err != nil {
			return nil, err
		}
		var last rawMsg
		for _, nm := range raws {
			r, err := parseDirect(nm)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", core.ErrCorrupt, err)
			}
			last = r
			if len(r.data) != 8 {
				continue
			}
			seq := binary.BigEndian.Uint64(r.data)
			if seen[seq] {
				continue
			}
			seen[seq] = true
			sm, err := e.getSeq(ctx, t, seq, newID(t.name, seq))
			if err != nil {
				continue // gone with retention, or an older incarnation's
			}
			if (!q.Begin.IsZero() && sm.StoredAt.Before(q.Begin)) || (!q.End.IsZero() && sm.StoredAt.After(q.End)) {
				continue
			}
			if sm.ShardingKey == key || slices.Contains(sm.Keys, key) {
				out = append(out, sm)
				if len(out) == limit {
					break
				}
			}
		}
		scanned += len(raws)
		if len(raws) < req.Batch || last.pending == 0 || (!q.End.IsZero() && last.time.After(q.End.Add(time.Minute))) {
			break
		}
		req.Start, req.Seq = nil, last.seq+1
	}
	slices.SortFunc(out, func(a, b *core.StoredMessage) int { return int(a.CommitLogOffset - b.CommitLogOffset) })
	return out, nil
}

// maxKeyScan bounds the index entries one FindByKey looks at.
const maxKeyScan = 10_000

// OffsetAt implements core.Broker: the first message of the queue stored
// at or after at, looked for in each epoch that wrote to the queue, oldest
// first.
func (e *Engine) OffsetAt(ctx context.Context, topic string, queue int, at time.Time) (int64, error) {
	if e.closed.Load() {
		return 0, core.ErrClosed
	}
	t, err := e.queueTopic(ctx, topic, queue)
	if err != nil {
		return 0, err
	}
	info, lay, err := e.info(ctx, t)
	if err != nil {
		return 0, err
	}
	rg := streamRange(info)
	if rg.Min == rg.Max {
		return rg.Max, nil
	}
	at = at.UTC()
	subjects := make([]string, 0, len(lay.epochs)+1)
	for _, seg := range lay.segments(t.tok, queue) {
		subjects = append(subjects, seg.subject)
	}
	if lay.intent != nil && queue < lay.intent.Queues {
		// Messages of an epoch not yet committed: an offset past them
		// (the range's end) would pass them by once readers go there.
		subjects = append(subjects, queueSubject(t.tok, queue, lay.pubEpoch()))
	}
	for _, subject := range subjects {
		raws, err := e.get.do(ctx, t.stream, directReq{Start: &at, NextFor: subject, Batch: 1})
		if err != nil {
			return 0, err
		}
		if len(raws) == 0 {
			continue
		}
		r, err := parseDirect(raws[0])
		if err != nil {
			return 0, fmt.Errorf("%w: %w", core.ErrCorrupt, err)
		}
		return int64(r.seq) - 1, nil
	}
	return rg.Max, nil
}

// Backlog counts the messages of one queue at offsets ≥ from: in each
// epoch that wrote to the queue, the number the server reports pending
// after the first of them, plus that one.
func (e *Engine) Backlog(ctx context.Context, topic string, queue int, from int64) (int64, error) {
	if e.closed.Load() {
		return 0, core.ErrClosed
	}
	t, err := e.queueTopic(ctx, topic, queue)
	if err != nil {
		return 0, err
	}
	if _, _, err := e.rangeOf(ctx, t, false); err != nil { // and the epochs, as Read
		return 0, err
	}
	from = max(from, 0)
	var n int64
	for _, seg := range t.lay.Load().segments(t.tok, queue) {
		if from >= seg.end {
			continue
		}
		raws, err := e.get.do(ctx, t.stream, directReq{Seq: uint64(from) + 1, NextFor: seg.subject, Batch: 1, MaxBytes: 1})
		if err != nil {
			return 0, err
		}
		if len(raws) == 0 {
			continue
		}
		r, err := parseDirect(raws[0])
		if err != nil {
			return 0, fmt.Errorf("%w: %w", core.ErrCorrupt, err)
		}
		n += int64(r.pending) + 1
	}
	return n, nil
}

// Arrivals implements core.Broker.
func (e *Engine) Arrivals(topic string) <-chan struct{} {
	if topic == "" {
		return e.arrive.wait("")
	}
	return e.arrive.wait(token(topic))
}
