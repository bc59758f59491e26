package client

import (
	"context"
	"errors"
	"fmt"
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
}

// NewProducer returns a producer over c.
func (c *Client) NewProducer() *Producer {
	return &Producer{c: c, Retries: 3, Backoff: 100 * time.Millisecond}
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

// SendAsync sends m without waiting; done is called once with the outcome.
// Sends on one client are written in call order, and the server appends
// them in that order, so messages of one key keep the order of the calls.
// It blocks only while the client has MaxInflight requests unanswered.
func (p *Producer) SendAsync(ctx context.Context, m *core.Message, done func(core.SendResult, error)) {
	p.sendAsync(ctx, []*core.Message{m}, p.Retries, p.Backoff, func(res []core.SendResult, err error) {
		if err != nil {
			done(core.SendResult{}, err)
			return
		}
		done(res[0], nil)
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
