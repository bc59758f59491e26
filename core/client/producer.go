package client

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/wire"
)

// Producer sends messages over a Client.
type Producer struct {
	c *Client
	// Retries is how many more attempts a send gets after a retryable
	// failure (lost connection, server shutting down or overloaded);
	// default 3. A retried send may store the message twice
	// (at-least-once), and a retried async send may land after sends made
	// later.
	Retries int
	// Backoff is the pause before the first retry, doubled each time;
	// default 100 ms.
	Backoff time.Duration
	// MaxCoalesce bounds how many queued SendAsync messages travel in one
	// request; default 128, 1 sends each on its own. Messages are coalesced
	// only when several are waiting at once, so it adds no delay.
	MaxCoalesce int

	once  sync.Once
	queue chan pendingSend
}

type pendingSend struct {
	m    *core.Message
	done func(core.SendResult, error)
}

// NewProducer returns a producer over c.
func (c *Client) NewProducer() *Producer {
	return &Producer{c: c, Retries: 3, Backoff: 100 * time.Millisecond, MaxCoalesce: 128}
}

// retryable reports whether another attempt may succeed.
func retryable(err error) bool {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Retryable()
	}
	return errors.Is(err, ErrConnLost)
}

// Send stores one message and returns once the server acknowledged it
// (durable under its flush policy).
func (p *Producer) Send(ctx context.Context, m *core.Message) (core.SendResult, error) {
	res, err := p.SendBatch(ctx, []*core.Message{m})
	if err != nil {
		return core.SendResult{}, err
	}
	return res[0], nil
}

// SendBatch stores msgs as one request (at most wire.MaxBatch).
func (p *Producer) SendBatch(ctx context.Context, msgs []*core.Message) ([]core.SendResult, error) {
	payload, err := wire.EncodeProduce(msgs)
	if err != nil {
		return nil, err
	}
	backoff := p.Backoff
	for attempt := 0; ; attempt++ {
		b, err := p.c.call(ctx, wire.OpProduce, payload)
		if err == nil {
			return decodeSend(b, msgs)
		}
		if attempt >= p.Retries || !retryable(err) || ctx.Err() != nil {
			return nil, err
		}
		if !sleep(ctx, backoff) {
			return nil, err
		}
		backoff *= 2
	}
}

func decodeSend(b []byte, msgs []*core.Message) ([]core.SendResult, error) {
	res, err := wire.DecodeSendResults(b)
	if err != nil {
		return nil, err
	}
	if len(res) != len(msgs) {
		return nil, fmt.Errorf("%w: %d results for %d messages", wire.ErrBadPayload, len(res), len(msgs))
	}
	for i := range res {
		res[i].Topic = msgs[i].Topic
	}
	return res, nil
}

// SendAsync sends m without waiting; done is called once with the outcome
// (on a client goroutine: it must not block). Async sends of one producer
// are written in call order, and the server appends them in that order, so
// messages of one key keep the order of the calls. Several sends waiting at
// once go in one request (MaxCoalesce); if the server refuses such a
// request because of one bad message, the others are sent again on their
// own and may then land after later sends. It blocks only while the client has
// MaxInflight requests unanswered and the producer's queue is full.
func (p *Producer) SendAsync(ctx context.Context, m *core.Message, done func(core.SendResult, error)) {
	if _, err := wire.AppendMessage(nil, m); err != nil {
		done(core.SendResult{}, err) // a message that cannot be encoded never joins a batch
		return
	}
	p.once.Do(func() {
		p.queue = make(chan pendingSend, max(p.MaxCoalesce, 1)*4)
		p.c.wg.Add(1)
		go p.coalesce()
	})
	select {
	case p.queue <- pendingSend{m: m, done: done}:
	case <-ctx.Done():
		done(core.SendResult{}, ctx.Err())
	case <-p.c.ctx.Done():
		done(core.SendResult{}, ErrClosed)
	}
}

// coalesce sends queued async messages, as many per request as are waiting.
// It runs until the client closes; what is still queued then fails.
func (p *Producer) coalesce() {
	defer p.c.wg.Done()
	limit := max(p.MaxCoalesce, 1)
	for {
		var first pendingSend
		select {
		case first = <-p.queue:
		case <-p.c.ctx.Done():
			for {
				select {
				case ps := <-p.queue:
					ps.done(core.SendResult{}, ErrClosed)
				default:
					return
				}
			}
		}
		// Let callers that are about to queue more do so: this is what
		// fills a request when few cores run many producers.
		runtime.Gosched()
		batch := []pendingSend{first}
		size := len(first.m.Body)
	more:
		for len(batch) < limit && size < 1<<20 {
			select {
			case ps := <-p.queue:
				batch = append(batch, ps)
				size += len(ps.m.Body)
			default:
				break more
			}
		}
		p.sendBatch(batch, true)
	}
}

// sendBatch sends one coalesced request. If the server refuses it for a
// reason that is not retryable, each message is sent again on its own, so
// that one bad message fails alone.
func (p *Producer) sendBatch(batch []pendingSend, split bool) {
	msgs := make([]*core.Message, len(batch))
	for i, ps := range batch {
		msgs[i] = ps.m
	}
	p.sendAsync(p.c.ctx, msgs, p.Retries, p.Backoff, func(res []core.SendResult, err error) {
		if err != nil && split && len(batch) > 1 && !retryable(err) && !errors.Is(err, ErrClosed) {
			// Not on the connection's reader goroutine: sending may wait
			// for an in-flight slot that only the reader frees.
			p.c.wg.Add(1)
			go func() {
				defer p.c.wg.Done()
				for _, ps := range batch {
					p.sendBatch([]pendingSend{ps}, false)
				}
			}()
			return
		}
		for i, ps := range batch {
			if err != nil {
				ps.done(core.SendResult{}, err)
			} else {
				ps.done(res[i], nil)
			}
		}
	})
}

func (p *Producer) sendAsync(ctx context.Context, msgs []*core.Message, retries int, backoff time.Duration, done func([]core.SendResult, error)) {
	payload, err := wire.EncodeProduce(msgs)
	if err != nil {
		done(nil, err)
		return
	}
	err = p.c.start(ctx, wire.OpProduce, payload, 0, func(r result) {
		if r.err == nil {
			done(decodeSend(r.payload, msgs))
			return
		}
		if retries > 0 && retryable(r.err) && ctx.Err() == nil {
			// Retried off the connection's goroutine, after a pause.
			p.c.wg.Add(1)
			go func() {
				defer p.c.wg.Done()
				if !sleep(ctx, backoff) {
					done(nil, r.err)
					return
				}
				p.sendAsync(ctx, msgs, retries-1, backoff*2, done)
			}()
			return
		}
		done(nil, r.err)
	})
	if err != nil {
		done(nil, err)
	}
}

// SendOneWay sends m with no acknowledgement at all: fastest, and lost if
// anything goes wrong. It returns once the request is queued.
func (p *Producer) SendOneWay(ctx context.Context, m *core.Message) error {
	payload, err := wire.EncodeProduce([]*core.Message{m})
	if err != nil {
		return err
	}
	return p.c.start(ctx, wire.OpProduce, payload, wire.FlagNoReply, func(result) {})
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
