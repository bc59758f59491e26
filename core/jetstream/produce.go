package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferrymq/core"
)

// pending is one produce call awaiting its acknowledgements. The checker
// takes them in call order and publishes again, with the new epoch, what a
// fence refused; the acker then awaits what is left and answers, also in
// call order, so done callbacks run in call order.
type pending struct {
	msgs   []*core.Message
	out    []*nats.Msg
	ts     []*topicState
	lays   []*layout // the layout each message was (last) published with
	queues []int
	futs   []jetstream.PubAckFuture
	acks   []*jetstream.PubAck // first answers that were acknowledgements
	errs   []error             // first answers that were errors
	again  []bool              // published again by the checker: await futs[i]
	done   func([]core.SendResult, error)
}

// Produce implements core.Broker.
func (e *Engine) Produce(ctx context.Context, m *core.Message) (core.SendResult, error) {
	res, err := e.ProduceBatch(ctx, []*core.Message{m})
	if err != nil {
		return core.SendResult{}, err
	}
	return res[0], nil
}

// ProduceBatch implements core.Broker. The messages are published in order
// and acknowledged together; JetStream stores each on its own, so on error
// some may be stored (at-least-once, as the contract allows).
func (e *Engine) ProduceBatch(ctx context.Context, msgs []*core.Message) ([]core.SendResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	type result struct {
		res []core.SendResult
		err error
	}
	ch := make(chan result, 1)
	e.produce(ctx, msgs, func(res []core.SendResult, err error) { ch <- result{res, err} })
	select {
	case r := <-ch:
		return r.res, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ProduceAsync implements core.Broker. Publishes leave in call order on the
// engine's one connection, so pipelined calls keep per-key order — unless
// a publish fails (e.g. during a leader election) while a later one
// succeeds: the failed one is reported and a retry lands after it. A
// publish a resize fenced off is published again by the engine, in order.
func (e *Engine) ProduceAsync(msgs []*core.Message, done func([]core.SendResult, error)) {
	e.produce(context.Background(), msgs, done)
}

func (e *Engine) produce(ctx context.Context, msgs []*core.Message, done func([]core.SendResult, error)) {
	e.sendMu.RLock()
	defer e.sendMu.RUnlock()
	if e.closed.Load() {
		done(nil, core.ErrClosed)
		return
	}
	if len(msgs) == 0 {
		done(nil, nil)
		return
	}
	for _, m := range msgs {
		if err := e.readOnly(m.Topic, "produce to "+m.Topic); err != nil {
			done(nil, err)
			return
		}
	}
	n := len(msgs)
	p := &pending{msgs: msgs, out: make([]*nats.Msg, n), ts: make([]*topicState, n), lays: make([]*layout, n),
		queues: make([]int, n), futs: make([]jetstream.PubAckFuture, 0, n), acks: make([]*jetstream.PubAck, n),
		errs: make([]error, n), again: make([]bool, n), done: done}
	for i, m := range msgs {
		nm, t, err := e.prepare(ctx, m)
		if err != nil {
			done(nil, err)
			return
		}
		p.out[i], p.ts[i] = nm, t
	}
	if err := e.claim(ctx, p); err != nil {
		done(nil, err)
		return
	}
	for i, nm := range p.out {
		f, err := e.js.PublishMsgAsync(nm)
		if err != nil {
			// Those already sent are awaited so their results are not lost
			// to the acker's order; the call fails.
			for _, t := range p.ts[i:] {
				t.settle()
			}
			p.done = func([]core.SendResult, error) {}
			if len(p.futs) > 0 {
				p.msgs = p.msgs[:len(p.futs)]
				e.acks <- p
			}
			done(nil, e.unavailable("publish", err))
			return
		}
		p.futs = append(p.futs, f)
	}
	e.acks <- p
}

// prepare checks and encodes a message and finds its topic; claim picks
// its queue and subject.
func (e *Engine) prepare(ctx context.Context, m *core.Message) (*nats.Msg, *topicState, error) {
	if m == nil {
		return nil, nil, fmt.Errorf("%w: nil message", core.ErrInvalidMessage)
	}
	if err := e.checkName(m.Topic); err != nil {
		return nil, nil, err
	}
	born := m.BornAt
	if born.IsZero() {
		born = time.Now()
	}
	data, err := encodeRecord(m, born)
	if err != nil {
		return nil, nil, err
	}
	if len(data) > e.maxMsg {
		return nil, nil, fmt.Errorf("%w: %d bytes stored, limit %d (store.max_message_bytes, at most the NATS server's max_payload)",
			core.ErrMessageTooLarge, len(data), e.maxMsg)
	}
	t, err := e.topic(ctx, m.Topic, !e.opts.DisableAutoCreate)
	if err != nil {
		return nil, nil, err
	}
	return &nats.Msg{Data: data}, t, nil
}

// claim takes, for every message of p, its topic's publishing layout and
// counts the message in flight, for all of p's topics at once: a call
// never waits for a layout change that its own messages hold up. It waits
// while a topic's layout is changing.
func (e *Engine) claim(ctx context.Context, p *pending) error {
	var topics []*topicState
	for _, t := range p.ts {
		if !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	slices.SortFunc(topics, func(a, b *topicState) int { // one lock order for every call
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return a.created.Compare(b.created) // a topic deleted and created again meanwhile
	})
	for {
		var wait chan struct{}
		locked := 0
		for _, t := range topics {
			t.mu.Lock()
			locked++
			if t.next != nil || t.waiters > 0 {
				wait = t.readyLocked()
				break
			}
		}
		if wait == nil {
			for i, t := range p.ts {
				lay := t.pub
				t.inflight++
				q := t.route(p.msgs[i], lay)
				p.lays[i], p.queues[i] = lay, q
				p.out[i].Subject = queueSubject(t.tok, q, lay.pubEpoch())
			}
		}
		for _, t := range topics[:locked] {
			t.mu.Unlock()
		}
		if wait == nil {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		case <-e.closing:
			return core.ErrClosed
		}
	}
}

// route picks m's queue under lay's publishing count: its key's, or the
// next in turn.
func (t *topicState) route(m *core.Message, lay *layout) int {
	if m.ShardingKey != "" {
		return core.QueueFor(m.ShardingKey, lay.pubQueues())
	}
	return int((t.rr.Add(1) - 1) % uint32(lay.pubQueues()))
}

// readyLocked returns the channel closed when produces may go on.
func (t *topicState) readyLocked() chan struct{} {
	if t.ready == nil {
		t.ready = make(chan struct{})
	}
	return t.ready
}

// goLocked lets waiting produces go on if nothing holds them any more.
func (t *topicState) goLocked() {
	if t.next == nil && t.waiters == 0 && t.ready != nil {
		close(t.ready)
		t.ready = nil
	}
}

// settle counts a message of t as checked (acknowledged, refused and
// published again, or failed); the last one lets a newer layout take over.
func (t *topicState) settle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.inflight--
	if t.inflight == 0 {
		if t.next != nil {
			t.pub, t.next = t.next, nil
		}
		if t.drained != nil {
			close(t.drained)
			t.drained = nil
		}
	}
	t.goLocked()
}

// idle waits until no message of t is in flight (the caller holds t).
func (t *topicState) idle(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.inflight == 0 {
			t.mu.Unlock()
			return nil
		}
		if t.drained == nil {
			t.drained = make(chan struct{})
		}
		ch := t.drained
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("jetstream: %s: waiting for produces in flight: %w", t.name, ctx.Err())
		}
	}
}

// hold makes produces to t wait until unhold.
func (t *topicState) hold() {
	t.mu.Lock()
	t.waiters++
	t.mu.Unlock()
}

func (t *topicState) unhold() {
	t.mu.Lock()
	t.waiters--
	t.goLocked()
	t.mu.Unlock()
}

// layChange returns a channel closed when t.lay next changes.
func (t *topicState) layChange() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.layChanged == nil {
		t.layChanged = make(chan struct{})
	}
	return t.layChanged
}

// newest is the newest layout t publishes with or will.
func (t *topicState) newest() *layout {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.newestLocked()
}

func (t *topicState) newestLocked() *layout {
	if t.next != nil {
		return t.next
	}
	return t.pub
}

// learn takes a layout read from t's stream: readers use it at once (its
// committed epochs); publishing switches to its publishing epoch — an
// intent's, once its fence is up — when what was published before has
// been checked; the subjects of ended epochs are fenced.
func (e *Engine) learn(t *topicState, lay *layout) {
	t.mu.Lock()
	if lay.newer(t.lay.Load()) {
		t.lay.Store(lay)
		if t.layChanged != nil {
			close(t.layChanged)
			t.layChanged = nil
		}
	}
	newest := t.newestLocked()
	switch {
	case lay.pubEpoch() > newest.pubEpoch():
		if t.inflight == 0 {
			t.pub, t.next = lay, nil
		} else {
			t.next = lay
		}
	case lay.pubEpoch() == newest.pubEpoch() && newest.intent != nil && lay.intent == nil:
		// The intent it publishes to was committed: the same subjects.
		if t.next != nil {
			t.next = lay
		} else {
			t.pub = lay
		}
	}
	t.goLocked()
	t.mu.Unlock()
	ended := lay.cur()
	if lay.intent != nil {
		ended++
		e.finishLater(t, lay.intent) // if its resizer is gone
	}
	for k := 0; k < ended; k++ {
		if err := e.fence.ensure(epochPattern(t.tok, k)); err != nil && !e.closed.Load() {
			e.log.Warn().Err(err).Str("topic", t.name).Msg("ended epoch not fenced")
		}
	}
}

// checker takes each produce call's first answers in order. A message the
// fence of a resize refused is published again with the new epoch before
// the checker looks at the next one — before anything published after
// the layout change — and its answer is awaited by the acker, which then
// answers the call and every later one until it has caught up. Otherwise
// the checker answers the call itself.
func (e *Engine) checker() {
	defer e.wg.Done()
	defer close(e.checked)
	for p := range e.acks {
		again := false
		for i, f := range p.futs {
			select {
			case ack := <-f.Ok():
				p.acks[i] = ack
			case err := <-f.Err():
				p.errs[i] = e.refusal(p, i, err)
			}
			again = again || p.again[i]
			p.ts[i].settle()
		}
		if !again && e.behind.Load() == 0 {
			e.finish(p)
			continue
		}
		e.behind.Add(1)
		e.checked <- p
	}
}

// refusal handles a publish that was not acknowledged: one a fence refused
// is published again (p.futs[i] replaced); it returns the error to report
// otherwise.
func (e *Engine) refusal(p *pending, i int, err error) error {
	t := p.ts[i]
	if errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
		// The stream was created with a smaller max_msg_size (by an older
		// limit, or a node configured with one): the message is refused,
		// not the service.
		return fmt.Errorf("%w: %d bytes stored, over the max_msg_size of stream %s: %w",
			core.ErrMessageTooLarge, len(p.out[i].Data), t.stream, err)
	}
	if !fenced(err) {
		return e.unavailable("publish to "+t.name, err)
	}
	if !fenceAnswered(err) && time.Now().UnixNano() < t.silentUntil.Load() {
		// No stream took the subject, no fence answered, and the stream
		// did not answer a moment ago either: a stream without a leader
		// (an election, servers down). Asking again would hold the
		// checker, and every produce behind it, for a request timeout per
		// message in flight; the publish fails as any publish then does.
		return e.unavailable("publish to "+t.name, err)
	}
	lay := t.newest()
	if lay.pubEpoch() <= p.lays[i].pubEpoch() {
		var rerr error
		if lay, rerr = e.resolve(t, p.lays[i]); rerr != nil {
			if errors.Is(rerr, errNotFenced) {
				e.forget(t) // the stream may be gone: look again next time
				return e.unavailable("publish to "+t.name, err)
			}
			return rerr
		}
	}
	q := t.route(p.msgs[i], lay)
	nm := &nats.Msg{Subject: queueSubject(t.tok, q, lay.pubEpoch()), Data: p.out[i].Data}
	f, perr := e.js.PublishMsgAsync(nm)
	if perr != nil {
		return e.unavailable("publish to "+t.name, perr)
	}
	p.futs[i], p.lays[i], p.queues[i], p.again[i] = f, lay, q, true
	e.republished.Add(1)
	return nil
}

// fenceAnswered reports whether a fence of a resize refused the publish
// (the servers are up, the topic's subjects moved on).
func fenceAnswered(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Description == fenceDescription
}

// fenced reports whether a publish failed because no stream takes its
// subject: a fence answered, or the servers found no stream (nats.go
// retried that twice already).
func fenced(err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) && api.Description == fenceDescription {
		return true
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// acker awaits what the checker published again and answers the calls the
// checker handed it, in order.
func (e *Engine) acker() {
	defer e.wg.Done()
	defer close(e.idx.q)
	for p := range e.checked {
		e.finish(p)
		e.behind.Add(-1)
	}
}

// finish answers a produce call, publishes the index keys of its messages
// and tells the other nodes of the arrivals. Calls are finished in call
// order, by the checker or, while it is behind, by the acker.
func (e *Engine) finish(p *pending) {
	res, err := e.await(p)
	if err != nil {
		p.done(nil, err)
		return
	}
	e.idx.add(p, res)
	seen := ""
	for _, t := range p.ts {
		if t.tok != seen {
			e.arrive.notify(t.tok)
			seen = t.tok
		}
	}
	p.done(res, nil)
}

func (e *Engine) await(p *pending) ([]core.SendResult, error) {
	res := make([]core.SendResult, len(p.futs))
	var first error
	for i, f := range p.futs {
		ack, err := p.acks[i], p.errs[i]
		if p.again[i] {
			select {
			case ack = <-f.Ok():
			case rerr := <-f.Err():
				err = e.unavailable("publish to "+p.ts[i].name+" after a resize", rerr)
			}
		}
		if err != nil {
			first = cmpErr(first, err)
			continue
		}
		t := p.ts[i]
		if ack.Stream != t.stream {
			first = cmpErr(first, fmt.Errorf("%w: publish to %s stored in stream %s", core.ErrStoreFailed, t.name, ack.Stream))
			continue
		}
		res[i] = core.SendResult{ID: newID(t.name, ack.Sequence), Topic: t.name, Queue: p.queues[i],
			QueueOffset: int64(ack.Sequence) - 1, CommitLogOffset: int64(ack.Sequence), StoredAt: time.Now()}
	}
	return res, first
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
