package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
)

// ferryTarget drives a ferrymq server over the core TCP protocol with the
// Go client: one client.Client per producer and per consumer.
type ferryTarget struct {
	o     *benchOptions
	group string // consumer group of this run
	msgs  []*core.Message
}

func newFerryTarget(o *benchOptions) *ferryTarget {
	t := &ferryTarget{o: o, group: fmt.Sprintf("bench-%d", time.Now().UnixNano())}
	body := make([]byte, o.size)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range body {
		body[i] = byte(r.UintN(256))
	}
	// The messages are shared by every send: the client encodes a message
	// when the send starts and does not change it.
	if o.keys == 0 {
		t.msgs = []*core.Message{{Topic: o.topic, Body: body}}
	} else {
		t.msgs = make([]*core.Message, o.keys)
		for i := range t.msgs {
			t.msgs[i] = &core.Message{Topic: o.topic, ShardingKey: fmt.Sprintf("key-%d", i), Body: body}
		}
	}
	return t
}

func (t *ferryTarget) dial(ctx context.Context, id string) (*client.Client, error) {
	return client.Dial(ctx, client.Options{Addr: t.o.server, Token: t.o.token,
		ClientID: fmt.Sprintf("bench-%d-%s", os.Getpid(), id), MaxInflight: max(256, t.o.pipeline)})
}

// admin runs f on a short-lived client.
func (t *ferryTarget) admin(ctx context.Context, f func(c *client.Client) error) error {
	c, err := t.dial(ctx, "admin")
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

// ensureBenchTopic creates the topic with --queues queues unless it exists.
func ensureBenchTopic(ctx context.Context, c *client.Client, name string, queues int) error {
	_, err := c.Topic(ctx, name)
	if errors.Is(err, core.ErrTopicNotFound) {
		_, err = c.CreateTopic(ctx, name, queues)
	}
	if err != nil {
		return fmt.Errorf("topic %s: %w", name, err)
	}
	return nil
}

func (t *ferryTarget) prepareProduce(ctx context.Context) error {
	return t.admin(ctx, func(c *client.Client) error { return ensureBenchTopic(ctx, c, t.o.topic, t.o.queues) })
}

// prepareFill moves the group's offsets to the end of the topic, so that it
// consumes exactly the backlog produced next.
func (t *ferryTarget) prepareFill(ctx context.Context) error {
	return t.admin(ctx, func(c *client.Client) error {
		if err := ensureBenchTopic(ctx, c, t.o.topic, t.o.queues); err != nil {
			return err
		}
		if _, err := c.ResetOffsets(ctx, t.group, t.o.topic, time.Time{}, true); err != nil {
			return fmt.Errorf("reset offsets of group %s: %w", t.group, err)
		}
		return nil
	})
}

func (t *ferryTarget) prepareConsume(context.Context) error { return nil }
func (t *ferryTarget) finishConsume(context.Context) error  { return nil }

type ferrySender struct {
	c    *client.Client
	p    *client.Producer
	msgs []*core.Message
}

func (t *ferryTarget) newSender(ctx context.Context, i int) (benchSender, error) {
	c, err := t.dial(ctx, fmt.Sprintf("p%d", i))
	if err != nil {
		return nil, err
	}
	return &ferrySender{c: c, p: c.NewProducer(), msgs: t.msgs}, nil
}

func (s *ferrySender) send(ctx context.Context, seq int64, done func(error)) {
	s.p.SendAsync(ctx, s.msgs[seq%int64(len(s.msgs))], func(_ core.SendResult, err error) { done(err) })
}

func (s *ferrySender) close() error { return s.c.Close() }

type ferryReceiver struct {
	c  *client.Client
	pc *consumer.PushConsumer
}

// newReceiver starts a clustering push consumer of the run's group
// (orderly with --ordered) with default options: it commits offsets as it goes (every 200 ms) and when
// it closes.
func (t *ferryTarget) newReceiver(ctx context.Context, i int, onMsg func(part int, pos uint64)) (benchReceiver, error) {
	c, err := t.dial(ctx, fmt.Sprintf("c%d", i))
	if err != nil {
		return nil, err
	}
	pc, err := c.NewPushConsumer(consumer.Options{Group: t.group, Subscriptions: []group.Subscription{{Topic: t.o.topic}},
		Orderly: t.o.ordered,
		Listener: func(_ context.Context, m *core.StoredMessage) consumer.Result {
			onMsg(m.Queue, uint64(m.QueueOffset))
			return consumer.Success
		}})
	if err == nil {
		err = pc.Start(ctx)
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &ferryReceiver{c: c, pc: pc}, nil
}

func (r *ferryReceiver) close(ctx context.Context) error {
	return errors.Join(r.pc.Close(ctx), r.c.Close())
}
