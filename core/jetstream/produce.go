package jetstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferrymq/core"
)

// pending is one ProduceAsync call awaiting its acknowledgements. The acker
// goroutine takes them in call order, so done callbacks run in call order.
type pending struct {
	msgs   []*core.Message
	ts     []*topicState
	queues []int
	futs   []jetstream.PubAckFuture
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
// succeeds: the failed one is reported and a retry lands after it.
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
	p := &pending{msgs: msgs, ts: make([]*topicState, len(msgs)), queues: make([]int, len(msgs)),
		futs: make([]jetstream.PubAckFuture, 0, len(msgs)), done: done}
	out := make([]*nats.Msg, len(msgs))
	for i, m := range msgs {
		nm, t, q, err := e.prepare(ctx, m)
		if err != nil {
			done(nil, err)
			return
		}
		out[i], p.ts[i], p.queues[i] = nm, t, q
	}
	for _, nm := range out {
		f, err := e.js.PublishMsgAsync(nm)
		if err != nil {
			// Those already sent are awaited so their results are not lost
			// to the acker's order; the call fails.
			p.done = func([]core.SendResult, error) {}
			if len(p.futs) > 0 {
				e.acks <- p
			}
			done(nil, e.unavailable("publish", err))
			return
		}
		p.futs = append(p.futs, f)
	}
	e.acks <- p
}

func (e *Engine) prepare(ctx context.Context, m *core.Message) (*nats.Msg, *topicState, int, error) {
	if m == nil {
		return nil, nil, 0, fmt.Errorf("%w: nil message", core.ErrInvalidMessage)
	}
	if err := e.checkName(m.Topic); err != nil {
		return nil, nil, 0, err
	}
	born := m.BornAt
	if born.IsZero() {
		born = time.Now()
	}
	data, err := encodeRecord(m, born)
	if err != nil {
		return nil, nil, 0, err
	}
	if len(data) > e.maxMsg {
		return nil, nil, 0, fmt.Errorf("%w: %d bytes stored, limit %d (store.max_message_bytes, at most the NATS server's max_payload)",
			core.ErrMessageTooLarge, len(data), e.maxMsg)
	}
	t, err := e.topic(ctx, m.Topic, !e.opts.DisableAutoCreate)
	if err != nil {
		return nil, nil, 0, err
	}
	q := 0
	if m.ShardingKey != "" {
		q = core.QueueFor(m.ShardingKey, t.queues)
	} else {
		q = int((t.rr.Add(1) - 1) % uint32(t.queues))
	}
	return &nats.Msg{Subject: queueSubject(t.tok, q), Data: data}, t, q, nil
}

// acker waits for each pending call's acknowledgements in call order,
// publishes the index keys of its messages, and tells the caller.
func (e *Engine) acker() {
	defer e.wg.Done()
	defer close(e.idx.q)
	for p := range e.acks {
		res, err := e.await(p)
		if err == nil {
			e.idx.add(p, res)
		}
		if err != nil {
			p.done(nil, err)
			continue
		}
		seen := ""
		for _, t := range p.ts {
			if t.tok != seen {
				e.arrive.notify(t.tok)
				seen = t.tok
			}
		}
		p.done(res, nil)
	}
}

func (e *Engine) await(p *pending) ([]core.SendResult, error) {
	res := make([]core.SendResult, len(p.futs))
	var first error
	for i, f := range p.futs {
		select {
		case ack := <-f.Ok():
			t := p.ts[i]
			if ack.Stream != t.stream {
				first = cmpErr(first, fmt.Errorf("%w: publish to %s stored in stream %s", core.ErrStoreFailed, t.name, ack.Stream))
				continue
			}
			res[i] = core.SendResult{ID: newID(t.name, ack.Sequence), Topic: t.name, Queue: p.queues[i],
				QueueOffset: int64(ack.Sequence) - 1, CommitLogOffset: int64(ack.Sequence), StoredAt: time.Now()}
		case err := <-f.Err():
			if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
				e.forget(p.ts[i]) // the stream may be gone: look again next time
			}
			if errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
				// The stream was created with a smaller max_msg_size (by an
				// older limit, or a node configured with one): the message is
				// refused, not the service.
				first = cmpErr(first, fmt.Errorf("%w: %d bytes stored, over the max_msg_size of stream %s: %w",
					core.ErrMessageTooLarge, len(p.futs[i].Msg().Data), p.ts[i].stream, err))
				continue
			}
			first = cmpErr(first, e.unavailable("publish to "+p.ts[i].name, err))
		}
	}
	return res, first
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
