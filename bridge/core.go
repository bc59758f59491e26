package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/gate"
	"github.com/ferrymq/ferrymq/core/group"
)

// Core is all the bridge needs of the core queue, so a gateway can run
// with the embedded engine (Embedded) or in front of a remote core server
// (Remote).
type Core interface {
	// ProduceAsync appends msgs in call order and calls done once they are
	// durable under the core's flush policy (see core.Broker).
	ProduceAsync(msgs []*core.Message, done func([]core.SendResult, error))
	// Broadcast calls deliver for every message of topic, queue by queue in
	// order, as member node of group in broadcast mode (each node has its
	// own offsets). A node new to the group starts at the messages stored
	// since since. It returns when ctx ends.
	Broadcast(ctx context.Context, topic, group, node string, since time.Time, deliver func(context.Context, *core.StoredMessage)) error
	// FindByKey returns messages of topic whose sharding key or one of
	// whose Keys is key (core.Broker.FindByKey): the bridge looks up an
	// unsure QoS 2 resend by its client ID (qos2.go).
	FindByKey(ctx context.Context, topic, key string, q core.KeyQuery) ([]*core.StoredMessage, error)
}

// Embedded is the Core of a gateway with the embedded engine in process.
func Embedded(b core.Broker) Core { return embedded{b} }

type embedded struct{ core.Broker }

// Broadcast reads every queue of topic from this node's committed offsets,
// delivers, commits, and waits for arrivals when caught up. A resized
// topic's queues are read behind their epoch barriers (core/gate), so a
// device's commands keep their order across a resize.
func (e embedded) Broadcast(ctx context.Context, topic, grp, _ string, since time.Time, deliver func(context.Context, *core.StoredMessage)) error {
	next := map[int]int64{}
	g := gate.New(e.Broker)
	var lastErr error
	for ctx.Err() == nil {
		arrived := e.Arrivals(topic)
		info, err := e.Topic(ctx, topic)
		progressed := false
		if err == nil {
			for q := range len(info.Ranges) { // retired queues too, until drained
				p, err := e.consumeQueue(ctx, g, topic, grp, q, next, since, deliver)
				progressed = progressed || p
				if err != nil && ctx.Err() == nil && (lastErr == nil || err.Error() != lastErr.Error()) {
					lastErr = err
				}
			}
		} else if !errors.Is(err, core.ErrTopicNotFound) && ctx.Err() == nil {
			lastErr = err
		}
		if progressed {
			continue
		}
		select {
		case <-arrived:
		case <-ctx.Done():
		case <-time.After(time.Second): // retry after an error, re-read the topic's queues
		}
	}
	return lastErr
}

func (e embedded) consumeQueue(ctx context.Context, g *gate.Gate, topic, grp string, q int, next map[int]int64, since time.Time,
	deliver func(context.Context, *core.StoredMessage)) (bool, error) {
	off, ok := next[q]
	if !ok {
		var err error
		off, err = e.CommittedOffset(ctx, grp, topic, q)
		if errors.Is(err, core.ErrNoCommittedOffset) {
			off, err = e.OffsetAt(ctx, topic, q, since)
		}
		if err != nil {
			return false, fmt.Errorf("downlink %s/%d offset: %w", topic, q, err)
		}
	}
	res, held, err := g.Read(ctx, grp, core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 256},
		func(p int) (int64, error) { return e.OffsetAt(ctx, topic, p, since) })
	if err != nil {
		return false, fmt.Errorf("downlink %s/%d read: %w", topic, q, err)
	}
	if held {
		next[q] = off
		return false, nil // the other queues of this loop go first: their commits open the barrier
	}
	for _, m := range res.Messages {
		deliver(ctx, m)
	}
	next[q] = res.NextOffset
	if res.NextOffset == off {
		return false, nil
	}
	if err := e.CommitOffset(ctx, grp, topic, q, res.NextOffset); err != nil {
		return true, fmt.Errorf("downlink %s/%d commit: %w", topic, q, err)
	}
	return true, nil
}

// Remote is the Core of a gateway in front of a core server: produce
// through c's producer, consume downlink topics with a broadcast push
// consumer that delivers one message at a time (the node is c's client ID, so each node keeps its own
// offsets on the server).
func Remote(c *client.Client, log *zerolog.Logger) Core {
	return RemoteVia(c, c.NewProducer(), log)
}

// Sender is what a remote gateway's uplink sends through: a
// client.Producer (one core server) or a client.Cluster (several, each
// behind a circuit breaker).
type Sender interface {
	SendAsync(ctx context.Context, m *core.Message, done func(core.SendResult, error))
}

// RemoteVia is Remote with the uplink sent through up.
func RemoteVia(c *client.Client, up Sender, log *zerolog.Logger) Core {
	return &remote{c: c, p: up, log: log}
}

type remote struct {
	c   *client.Client
	p   Sender
	log *zerolog.Logger
}

// ProduceAsync sends each message asynchronously (the producer coalesces
// them) and calls done when all are answered: with the first error, or the
// results in order.
func (r *remote) ProduceAsync(msgs []*core.Message, done func([]core.SendResult, error)) {
	if len(msgs) == 0 {
		done(nil, nil)
		return
	}
	res := make([]core.SendResult, len(msgs))
	var mu sync.Mutex
	left, first := len(msgs), error(nil)
	for i, m := range msgs {
		r.p.SendAsync(context.Background(), m, func(sr core.SendResult, err error) {
			mu.Lock()
			res[i] = sr
			if err != nil && first == nil {
				first = err
			}
			left--
			last := left == 0
			mu.Unlock()
			if last {
				if first != nil {
					done(nil, first)
				} else {
					done(res, nil)
				}
			}
		})
	}
}

// FindByKey implements Core through the core server.
func (r *remote) FindByKey(ctx context.Context, topic, key string, q core.KeyQuery) ([]*core.StoredMessage, error) {
	return r.c.FindByKey(ctx, topic, key, q)
}

func (r *remote) Broadcast(ctx context.Context, topic, grp, _ string, since time.Time, deliver func(context.Context, *core.StoredMessage)) error {
	// A new member starts at the messages stored since since (at the
	// latest offset without one): the topic must exist first, or the
	// message that creates it would be behind that start.
	if _, err := r.c.Topic(ctx, topic); errors.Is(err, core.ErrTopicNotFound) {
		if _, err := r.c.CreateTopic(ctx, topic, 0); err != nil && !errors.Is(err, core.ErrTopicExists) {
			return fmt.Errorf("downlink %s: create topic: %w", topic, err)
		}
	} else if err != nil {
		return fmt.Errorf("downlink %s: %w", topic, err)
	}
	from := group.FromTimestamp
	if since.IsZero() {
		from = group.FromLatest
	}
	pc, err := r.c.NewPushConsumer(consumer.Options{
		Group:    grp,
		Mode:     group.Broadcast,
		From:     from,
		FromTime: since,
		// Orderly consumption is for clustering mode; one consuming
		// goroutine keeps each queue's order in broadcast mode.
		ConsumeGoroutines: 1,
		Subscriptions:     []group.Subscription{{Topic: topic}},
		Logger:            r.log,
		Listener: func(ctx context.Context, m *core.StoredMessage) consumer.Result {
			deliver(ctx, m)
			return consumer.Success
		},
	})
	if err != nil {
		return fmt.Errorf("downlink %s: %w", topic, err)
	}
	if err := pc.Start(ctx); err != nil {
		return fmt.Errorf("downlink %s: %w", topic, err)
	}
	<-ctx.Done()
	return pc.Close(context.WithoutCancel(ctx))
}
