package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferrymq/core"
)

// Resizing a topic: a new epoch (core/epoch.go) whose boundaries are exact
// although several nodes produce to the topic, each with the queue count
// it cached.
//
// The fence is the stream's subject list. Epoch e's queues are the
// subjects fmq.<tok>.<q>.<e> (epoch 0: fmq.<tok>.<q>), and the stream takes
// only the current epoch's, so a node that publishes with a stale count
// uses subjects no stream takes: its publish is refused (fence.go answers
// it), it reads the stream's metadata and publishes again with the new
// count. JetStream enforces this, not the nodes' good behaviour.
//
// A resize, under the topic's resize lock (a key in the engine's bucket),
// once this node's own publishes in flight are answered and its fence
// listens to the epoch that ends (fence.go):
//
//  1. Intent. One stream update swaps the subjects to the new epoch's
//     (and its marker subject fmqe.<tok>.<e>) and records the epoch,
//     without boundaries, in the metadata. From here no message is stored
//     under the old count; this node's producers hold theirs until step 2.
//  2. Marker. An empty message on the marker subject. The stream stores in
//     the order it takes messages in, and it took the marker after the
//     update, so every old-count message it had taken is stored by then —
//     even those a cluster's stream leader had taken but not yet committed
//     when the update was answered (measured: up to 69 on the 3-node
//     cluster; the stream's last sequence in the update's answer misses
//     them). The fence answers what it held, but what the stream stored.
//     Producers go on with the new count: this node's now, the others'
//     when the fence refuses their next publish and they read the intent.
//     The stream takes the new subjects only since the update, after every
//     old-count message it took, so each message of the new epoch is
//     stored above every message of the ended one.
//  3. Boundaries. For each queue q of the ended epoch, the sequence of its
//     last message (one batched direct get of the last message per
//     subject, from a replica that has the marker): Begin[q], the queue's
//     next offset. Everything on the ended subjects counts, even a message
//     stored after the marker — unless a message of the new epoch in the
//     same queue was stored before it (below).
//  4. Commit. One stream update records the boundaries (and the new count
//     in ferrymq.queues). Readers follow the new epoch from here: what was
//     stored in it since step 2 waited for this.
//
// Any node that finds an intent older than graceOf — a producer writing
// to its epoch, a reader, a producer the fence refused — finishes steps 2
// to 4 in the background once the lock expires (a second marker changes
// nothing), so a resize whose caller died is completed; producers do not
// wait for it, readers see the committed epochs until then. The lock
// expires after lockTTL unless renewed (before the updates): a holder
// stalled longer than that may write after the node that took over.
// Leases fence time, not writes, as in lease.go.
//
// What JetStream does not close: a publish the stream's server had matched
// to the old subjects just before step 1 but handed to the stream only
// later (its goroutine paused in between) is stored under the old count
// above messages of the new epoch. If one of those is in its own queue,
// the boundary is set below that one (a boundary above it would hide it
// from readers) and the late message is logged and not read (read.go);
// likewise for one stored after step 4.

// pollEvery is how often a resize looks again at a replica behind its
// marker, or a refused producer at a stream that has no new epoch yet.
const pollEvery = 10 * time.Millisecond

// boundaryChunk is how many queues one direct get of last messages asks
// for: each answer carries a whole message (up to the message limit), and
// the server stops a batch past its max_bytes (64 MiB unless the request
// says more, which it does: a batch cut short would lack the marker).
const boundaryChunk = 8

// boundaryBatchBytes bounds the bytes one direct get of last messages may
// answer with, so that with large messages a batch holds fewer queues:
// one answer of 8 × 4.25 MiB took over the 5 s request timeout on a
// loaded machine, where eight of 4.25 MiB each did not.
const boundaryBatchBytes = 8 << 20

// lockTTL is how long a resize lock lives without renewal.
func (e *Engine) lockTTL() time.Duration { return 3 * e.opts.Timeout }

// graceOf is how old an intent must be before another node finishes it.
func (e *Engine) graceOf() time.Duration { return 2 * e.opts.Timeout }

// ResizeTopic implements core.Broker.
func (e *Engine) ResizeTopic(ctx context.Context, name string, queues int) (core.TopicInfo, error) {
	if e.closed.Load() {
		return core.TopicInfo{}, core.ErrClosed
	}
	if err := e.readOnly(name, "resize "+name); err != nil {
		return core.TopicInfo{}, err
	}
	if strings.HasPrefix(name, "%") {
		if err := core.ValidateSystemTopic(name); err != nil {
			return core.TopicInfo{}, err
		}
		return core.TopicInfo{}, fmt.Errorf("%w: %s is a system topic", core.ErrInvalidTopic, name)
	}
	if err := core.ValidateTopic(name); err != nil {
		return core.TopicInfo{}, err
	}
	if err := core.ValidateQueueCount(queues); err != nil {
		return core.TopicInfo{}, err
	}
	t, err := e.topic(ctx, name, false)
	if err != nil {
		return core.TopicInfo{}, err
	}
	info, lay, err := e.info(ctx, t)
	if err != nil {
		return core.TopicInfo{}, err
	}
	if lay.intent == nil && lay.queues() == queues {
		return topicInfo(t, info, lay), nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 4*e.lockTTL())
		defer cancel()
	}
	lk, err := e.lockResize(ctx, t, true)
	if err != nil {
		return core.TopicInfo{}, err
	}
	defer lk.release()
	if info, lay, err = e.complete(ctx, t, lk, nil, nil, nil); err != nil {
		return core.TopicInfo{}, err
	}
	if lay.queues() == queues {
		return topicInfo(t, info, lay), nil
	}
	// This node's produces wait only while its fence begins to listen to
	// the epoch that ends, and for those in flight to be answered first:
	// one the servers matched before the fence listened and handed the
	// stream's leader only after the swap would be dropped unanswered.
	// Then they go on with the old count: the stream stores what it takes
	// before the swap, the fence holds what it refuses after and answers
	// once the marker is stored, and those are published again with the
	// new count — this node learns the intent as soon as it is written, so
	// no question to the stream — before anything produced later.
	t.hold()
	release := sync.OnceFunc(t.unhold)
	defer release()
	if err := t.idle(ctx); err != nil {
		return core.TopicInfo{}, err
	}
	ended := epochPattern(t.tok, lay.cur())
	since := info.State.LastSeq // nothing the fence will hold is stored at or below it
	if err := e.fence.hold(ended); err != nil {
		return core.TopicInfo{}, err
	}
	release()
	if err := lk.renew(ctx); err != nil {
		e.fence.drop(ended)
		return core.TopicInfo{}, err
	}
	intent := lay.withIntent(queues, time.Now())
	if info, err = e.updateStream(ctx, t, info, intent); err != nil {
		// The update may have been applied all the same.
		if _, now, ierr := e.info(ctx, t); ierr != nil || now.intent == nil {
			e.fence.drop(ended)
			return core.TopicInfo{}, err
		}
		info, intent = nil, nil // complete reads them
	} else {
		e.learn(t, intent)
	}
	if info, lay, err = e.complete(ctx, t, lk, &heldFence{pattern: ended, since: since}, info, intent); err != nil {
		return core.TopicInfo{}, err
	}
	return topicInfo(t, info, lay), nil
}

// heldFence is the fence a resize holds on the epoch it ends, and the
// stream's last sequence before it listened.
type heldFence struct {
	pattern string
	since   uint64
}

// complete finishes the epoch t's stream records as an intent, if any
// (steps 2 to 4), holding lk; held, if not nil, is the fence to release
// once the marker is stored. info and lay are the stream as the caller
// just wrote it, or nil: read it. It returns the stream's info and layout
// after.
func (e *Engine) complete(ctx context.Context, t *topicState, lk *resizeLock, held *heldFence, info *jetstream.StreamInfo, lay *layout) (*jetstream.StreamInfo, *layout, error) {
	if held != nil {
		defer e.fence.release(held.pattern, false, nil) // when not released below
	}
	if info == nil || lay == nil {
		var err error
		if info, lay, err = e.info(ctx, t); err != nil {
			return nil, nil, err
		}
	}
	if lay.intent == nil {
		return info, lay, nil
	}
	k := lay.cur() + 1
	marker, err := e.publishMarker(ctx, t, k)
	if err != nil {
		return nil, nil, err
	}
	if held != nil {
		e.releaseFence(ctx, t, held, marker)
	}
	begin, err := e.boundaries(ctx, t, lay, marker)
	if err != nil {
		return nil, nil, err
	}
	if err := lk.renew(ctx); err != nil {
		return nil, nil, err
	}
	done := lay.committed(marker, begin)
	if info, err = e.updateStream(ctx, t, info, done); err != nil {
		return nil, nil, err
	}
	e.learn(t, done)
	e.arrive.notify(t.tok) // wakes the nodes waiting for the epoch (resolve)
	e.log.Info().Str("topic", t.name).Int("epoch", k).Int("queues", done.queues()).Uint64("marker", marker).
		Msg("topic resized")
	return info, done, nil
}

// releaseFence releases the fence a resize held once its marker is
// stored. Of what it held, the messages the stream took before the swap
// are stored below the marker, but their acknowledgements may still be on
// their way — on a loaded cluster, behind the fence's answer, which would
// then make the producer send them again: every message stored on the
// ended subjects between the fence's start and the marker is read, and
// the fence does not answer copies of those, now or later.
func (e *Engine) releaseFence(ctx context.Context, t *topicState, held *heldFence, marker uint64) {
	stored := map[uint64]bool{}
	// Everything from the fence's start to the marker, on any subject: a
	// replica that answers with the marker has all of it.
	for seq := held.since + 1; seq <= marker; {
		raws, err := e.get.do(ctx, t.stream, directReq{Seq: seq, Batch: 256, MaxBytes: 64 << 20})
		if err != nil {
			// Unproven: answer all, at worst a message is stored twice
			// (at least once), rather than leave a producer to time out.
			e.log.Warn().Err(err).Str("topic", t.name).Msg("fenced publishes answered without checking what the stream stored")
			stored = nil
			break
		}
		if len(raws) == 0 { // a replica behind the marker
			select {
			case <-ctx.Done():
				stored = nil
			case <-time.After(pollEvery):
			}
			if stored == nil {
				break
			}
			continue
		}
		for _, nm := range raws {
			r, err := parseDirect(nm)
			if err != nil || r.seq >= marker {
				seq = marker + 1
				break
			}
			if subjectMatch(held.pattern, r.subject) {
				stored[payloadHash(r.data)] = true
			}
			seq = r.seq + 1
		}
	}
	e.fence.release(held.pattern, true, stored)
}

// publishMarker stores a marker of epoch k and returns its sequence. Right
// after the intent another server may not know yet that the stream takes
// the marker subject: it answers "no responders", and the publish is tried
// again.
func (e *Engine) publishMarker(ctx context.Context, t *topicState, k int) (uint64, error) {
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	m := nats.NewMsg(markerSubject(t.tok, k))
	ack, err := e.js.PublishMsg(ctx, m, jetstream.WithExpectStream(t.stream),
		jetstream.WithRetryWait(pollEvery), jetstream.WithRetryAttempts(int(e.opts.Timeout/pollEvery)))
	if err != nil {
		return 0, e.unavailable(fmt.Sprintf("marker of epoch %d of %s", k, t.name), err)
	}
	return ack.Sequence, nil
}

// boundaries returns Begin of the intent of lay: per queue, the sequence
// of its last message before the new epoch. It reads the last message of
// each queue subject of the ended epoch from a replica that has the
// marker (a replica behind would miss the last ones).
func (e *Engine) boundaries(ctx context.Context, t *topicState, lay *layout, marker uint64) ([]int64, error) {
	cur := lay.cur()
	ended := lay.epochs[cur].Queues
	begin := make([]int64, max(ended, lay.intent.Queues))
	for q := range begin {
		begin[q] = lay.lastBefore(q, cur)
	}
	mark := markerSubject(t.tok, cur+1)
	apply := func(last map[int]int64) {
		for q, seq := range last {
			if q < len(begin) {
				if seq > int64(marker) {
					e.log.Warn().Str("topic", t.name).Int("queue", q).Int64("seq", seq).
						Msg("message of the ended epoch stored after the marker: counted in the ended epoch")
				}
				begin[q] = max(begin[q], seq)
			}
		}
	}
	// Every queue at once, in an answer of at most boundaryBatchBytes:
	// enough unless the queues' last messages are large. The marker is
	// the newest message, so an answer the server cut short lacks it, as
	// one from a replica behind does; then a chunk of queues at a time,
	// each chunk's answer large enough for its messages at the limit.
	all := []string{mark}
	for q := range ended {
		all = append(all, queueSubject(t.tok, q, cur))
	}
	last, whole, err := e.lastSeqs(ctx, t, all, mark, marker, boundaryBatchBytes)
	if err != nil {
		return nil, err
	}
	if whole {
		apply(last)
	}
	chunk := max(1, min(boundaryChunk, boundaryBatchBytes/(e.maxMsg+1<<10)))
	for lo := 0; !whole && lo < ended; lo += chunk {
		subjects := []string{mark}
		for q := lo; q < min(lo+chunk, ended); q++ {
			subjects = append(subjects, queueSubject(t.tok, q, cur))
		}
		for {
			last, ok, err := e.lastSeqs(ctx, t, subjects, mark, marker, len(subjects)*(e.maxMsg+1<<10))
			if err != nil {
				return nil, err
			}
			if ok {
				apply(last)
				break
			}
			select {
			case <-ctx.Done():
				return nil, e.unavailable("boundaries of "+t.name, ctx.Err())
			case <-time.After(pollEvery):
			}
		}
	}
	if err := e.belowNewEpoch(ctx, t, lay, begin); err != nil {
		return nil, err
	}
	return begin, nil
}

// clockSkew is how far the clocks of the node that began an intent and of
// the stream's servers may disagree: a message of the epoch is looked for
// from this long before the intent's time.
const clockSkew = time.Minute

// belowNewEpoch lowers a boundary that a message of the new epoch in the
// same queue is stored below (resize.go's "what JetStream does not
// close"): readers read the new epoch's queue from its boundary on, and
// must not pass that message by. One question to the stream's leader in
// the usual case (no message of the ended epoch above the new epoch's
// first), one per such queue otherwise.
func (e *Engine) belowNewEpoch(ctx context.Context, t *topicState, lay *layout, begin []int64) error {
	k := lay.cur() + 1
	from := time.Unix(0, lay.intent.Started).Add(-clockSkew)
	first, ok, err := e.firstOf(ctx, t, epochPattern(t.tok, k), from)
	if err != nil || !ok {
		return err
	}
	for q := range begin {
		if q >= lay.intent.Queues || begin[q] < int64(first) {
			continue
		}
		seq, ok, err := e.firstOf(ctx, t, queueSubject(t.tok, q, k), from)
		if err != nil {
			return err
		}
		if ok && int64(seq) <= begin[q] {
			e.log.Error().Str("topic", t.name).Int("queue", q).Int64("last_of_ended_epoch", begin[q]).Uint64("first_of_new_epoch", seq).
				Msg("message of the ended epoch stored after one of the new epoch in its queue: boundary set below the new one, the late one is not read")
			begin[q] = int64(seq) - 1
		}
	}
	return nil
}

// firstOf asks t's stream leader (which has every message it stored) for
// the first message on subject stored at or after from: its sequence, ok
// false when there is none.
func (e *Engine) firstOf(ctx context.Context, t *topicState, subject string, from time.Time) (uint64, bool, error) {
	body, err := json.Marshal(directReq{NextFor: subject, Start: &from})
	if err != nil {
		return 0, false, fmt.Errorf("jetstream: first message of %s: %w", subject, err)
	}
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	m, err := e.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+t.stream, body)
	if err != nil {
		return 0, false, e.unavailable("first message of "+subject, err)
	}
	var resp struct {
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return 0, false, fmt.Errorf("%w: first message of %s: %w", core.ErrCorrupt, subject, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, false, nil
	case resp.Error != nil:
		return 0, false, e.unavailable("first message of "+subject, resp.Error)
	case resp.Message == nil:
		return 0, false, fmt.Errorf("%w: first message of %s: empty answer", core.ErrCorrupt, subject)
	}
	return resp.Message.Seq, true, nil
}

// lastSeqs asks for the last message of each subject, in an answer of at
// most maxBytes (the server sends them in sequence order); ok is false when
// the answer lacks the marker (the replica that answered does not have it
// yet) or was cut short.
func (e *Engine) lastSeqs(ctx context.Context, t *topicState, subjects []string, mark string, marker uint64, maxBytes int) (map[int]int64, bool, error) {
	raws, err := e.get.do(ctx, t.stream, directReq{MultiLast: subjects, Batch: len(subjects), MaxBytes: maxBytes})
	if err != nil {
		return nil, false, err
	}
	last := map[int]int64{}
	ok := false
	for i, nm := range raws {
		r, err := parseDirect(nm)
		if err != nil {
			return nil, false, fmt.Errorf("%w: boundaries of %s: %w", core.ErrCorrupt, t.name, err)
		}
		if i == len(raws)-1 && r.pending > 0 {
			// Cut short: a message of the ended epoch stored after the
			// marker (sorted after it) may be missing.
			return nil, false, nil
		}
		if r.subject == mark {
			ok = r.seq >= marker
			continue
		}
		q, _, valid := queueOf(t.tok, r.subject)
		if !valid {
			return nil, false, fmt.Errorf("%w: boundaries of %s: subject %q", core.ErrCorrupt, t.name, r.subject)
		}
		last[q] = int64(r.seq)
	}
	return last, ok, nil
}

// updateStream writes lay (its epochs, and the subjects of its last epoch
// or intent) into t's stream configuration, the rest as info has it.
func (e *Engine) updateStream(ctx context.Context, t *topicState, info *jetstream.StreamInfo, lay *layout) (*jetstream.StreamInfo, error) {
	raw, err := encodeEpochs(lay)
	if err != nil {
		return nil, err
	}
	cfg := info.Config
	cfg.Metadata = make(map[string]string, len(info.Config.Metadata)+1)
	for k, v := range info.Config.Metadata {
		if !strings.HasPrefix(k, "_nats.") { // the server's own, refreshed by it
			cfg.Metadata[k] = v
		}
	}
	cfg.Metadata[metaEpochs] = raw
	cfg.Metadata[metaQueues] = strconv.Itoa(lay.queues())
	epoch := lay.cur()
	if lay.intent != nil {
		epoch++
	}
	cfg.Subjects = epochSubjects(t.tok, epoch)
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	s, err := e.js.UpdateStream(ctx, cfg)
	if err != nil {
		return nil, e.unavailable("update stream of "+t.name, err)
	}
	return s.CachedInfo(), nil
}

// errNotFenced is resolve's answer when the stream has no newer epoch and
// none in the making: the publish was refused for another reason (the
// stream is gone, or electing a leader).
var errNotFenced = errors.New("jetstream: no new epoch")

// resolve asks t's stream for an epoch newer than the one since publishes
// to — an intent whose fence is up, or a committed epoch — and returns the
// layout; produces to t wait meanwhile (one question).
func (e *Engine) resolve(t *topicState, since *layout) (*layout, error) {
	t.hold()
	defer t.unhold()
	// One question is short: a stream that answers at all answers in
	// milliseconds, and the checker waits on this.
	ctx, cancel := context.WithTimeout(e.ctx, min(e.opts.Timeout, time.Second))
	defer cancel()
	_, lay, err := e.info(ctx, t)
	switch {
	case err == nil:
		if lay.pubEpoch() > since.pubEpoch() {
			return lay, nil
		}
		return nil, errNotFenced
	case errors.Is(err, core.ErrTopicNotFound), errors.Is(err, core.ErrCorrupt):
		return nil, err
	default:
		// The stream does not answer (a leader election, servers down): no
		// fence said no, the service is unavailable. The publish fails now,
		// as any publish then does, and so do the next ones no stream takes
		// for a while (silentUntil): asking again here would hold every
		// produce of the topic, and the checker with them, for each message
		// in flight.
		t.silentUntil.Store(time.Now().Add(silentFor).UnixNano())
		return nil, err
	}
}

// silentFor is how long, after the stream did not answer resolve, a
// publish no stream took fails at once.
const silentFor = time.Second

// finishLater watches an intent of t this node learned of, in a goroutine
// of the engine's, one at a time per topic: once the intent is older than
// graceOf and still not committed, its resizer seems gone; it waits for the
// resize lock to expire and does steps 2 to 4 (nothing if the resizer, or
// another node, committed the epoch meanwhile). Producers do not wait for
// it; readers see the new epoch's messages from the commit on.
func (e *Engine) finishLater(t *topicState, intent *epochRec) {
	if !t.finishing.CompareAndSwap(false, true) {
		return
	}
	e.bgMu.Lock()
	if e.closed.Load() {
		e.bgMu.Unlock()
		t.finishing.Store(false)
		return
	}
	e.wg.Add(1)
	e.bgMu.Unlock()
	go func() {
		defer e.wg.Done()
		defer t.finishing.Store(false)
		stale := time.NewTimer(time.Until(time.Unix(0, intent.Started).Add(e.graceOf())))
		defer stale.Stop()
		for waiting := true; waiting; {
			changed := t.layChange()
			if t.lay.Load().intent == nil {
				return // committed, as this node learned meanwhile
			}
			select {
			case <-e.ctx.Done():
				return
			case <-changed:
			case <-stale.C:
				waiting = false
			}
		}
		ctx, cancel := context.WithTimeout(e.ctx, 2*e.lockTTL()+e.graceOf())
		defer cancel()
		_, lay, err := e.info(ctx, t)
		if err == nil && lay.intent == nil {
			return
		}
		var lk *resizeLock
		if err == nil {
			lk, err = e.lockResize(ctx, t, true)
		}
		if err == nil {
			defer lk.release()
			_, _, err = e.complete(ctx, t, lk, nil, nil, nil)
		}
		if err != nil && !e.closed.Load() {
			e.log.Warn().Err(err).Str("topic", t.name).Msg("resize its node left unfinished not finished yet")
		}
	}()
}

// resizeLock is a topic's resize lock: the bucket key r.<tok> holding
// "<holder> <expiry, unix ns>".
type resizeLock struct {
	e   *Engine
	key string
	rev uint64
	at  time.Time // when it was last written
}

func resizeKey(tok string) string { return "r." + tok }

// lockResize takes t's resize lock, or one expired; wait says to wait for
// it until ctx ends (ErrResizeBusy then and when not waiting).
func (e *Engine) lockResize(ctx context.Context, t *topicState, wait bool) (*resizeLock, error) {
	key := resizeKey(t.tok)
	for {
		val := e.lockValue()
		at := time.Now()
		rev, err := e.meta.Create(ctx, key, val)
		if err == nil {
			return &resizeLock{e: e, key: key, rev: rev, at: at}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, e.unavailable("resize lock of "+t.name, err)
		}
		ent, err := e.meta.Get(ctx, key)
		switch {
		case err == nil && lockExpired(ent.Value()):
			if rev, uerr := e.meta.Update(ctx, key, val, ent.Revision()); uerr == nil {
				e.log.Warn().Str("topic", t.name).Str("holder", string(ent.Value())).Msg("expired resize lock taken over")
				return &resizeLock{e: e, key: key, rev: rev, at: at}, nil
			}
		case err != nil && !errors.Is(err, jetstream.ErrKeyNotFound):
			return nil, e.unavailable("resize lock of "+t.name, err)
		}
		if !wait {
			return nil, fmt.Errorf("%w: %s", ErrResizeBusy, t.name)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s: %w", ErrResizeBusy, t.name, ctx.Err())
		case <-time.After(5 * pollEvery):
		}
	}
}

func (e *Engine) lockValue() []byte {
	return []byte(e.holder + " " + strconv.FormatInt(time.Now().Add(e.lockTTL()).UnixNano(), 10))
}

// lockExpired reads a lock's expiry; a value that does not parse has
// expired.
func lockExpired(v []byte) bool {
	_, exp, _ := strings.Cut(string(v), " ")
	ns, err := strconv.ParseInt(exp, 10, 64)
	return err != nil || time.Now().UnixNano() > ns
}

// renew extends the lock, failing if another holder took it over. A lock
// written less than a third of its life ago is left as it is: nobody may
// take it yet.
func (l *resizeLock) renew(ctx context.Context) error {
	if time.Since(l.at) < l.e.lockTTL()/3 {
		return nil
	}
	at := time.Now()
	rev, err := l.e.meta.Update(ctx, l.key, l.e.lockValue(), l.rev)
	if err != nil {
		return fmt.Errorf("%w: resize lock %s lost: %w", ErrResizeBusy, l.key, err)
	}
	l.rev, l.at = rev, at
	return nil
}

// release deletes the lock if it is still this holder's.
func (l *resizeLock) release() {
	ctx, cancel := context.WithTimeout(context.Background(), l.e.opts.Timeout)
	defer cancel()
	if err := l.e.meta.Delete(ctx, l.key, jetstream.LastRevision(l.rev)); err != nil && !l.e.closed.Load() {
		l.e.log.Warn().Err(err).Str("key", l.key).Msg("resize lock not released; it expires")
	}
}
