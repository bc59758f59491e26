package mqttbench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
)

// coreReceiver consumes the core topic the gateway bridges to: one
// clustering push consumer, each message counted and acknowledged.
type coreReceiver struct {
	c  *client.Client
	pc *consumer.PushConsumer
}

// startCore starts consuming so that exactly the messages stored from now
// on are delivered: an existing topic has the group's offsets moved to its
// end first; a topic that does not exist yet (the gateway creates it on the
// first message) is consumed from its earliest message.
func startCore(ctx context.Context, o CoreOptions, clientID string, tr *tracker) (_ *coreReceiver, err error) {
	c, err := client.Dial(ctx, client.Options{Addr: o.Addr, Token: o.Token, ClientID: clientID})
	if err != nil {
		return nil, fmt.Errorf("core %s: %w", o.Addr, err)
	}
	defer func() {
		if err != nil {
			_ = c.Close()
		}
	}()
	// The topic must exist and the consumer own its queues before the first
	// message is published, or the first messages' latency includes the
	// group's rebalance.
	switch _, err := c.Topic(ctx, o.Topic); {
	case errors.Is(err, core.ErrTopicNotFound):
		if _, err := c.CreateTopic(ctx, o.Topic, 0); err != nil {
			return nil, fmt.Errorf("create core topic %s: %w", o.Topic, err)
		}
	case err != nil:
		return nil, fmt.Errorf("core topic %s: %w", o.Topic, err)
	default:
		if _, err := c.ResetOffsets(ctx, o.Group, o.Topic, time.Time{}, true); err != nil {
			return nil, fmt.Errorf("move offsets of core group %s to the end of %s: %w", o.Group, o.Topic, err)
		}
	}
	from := group.FromLatest
	pc, err := c.NewPushConsumer(consumer.Options{
		Group:         o.Group,
		From:          from,
		Subscriptions: []group.Subscription{{Topic: o.Topic}},
		Listener: func(_ context.Context, m *core.StoredMessage) consumer.Result {
			tr.observe(m.Body, time.Now().UnixNano())
			return consumer.Success
		},
	})
	if err == nil {
		err = pc.Start(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("core consumer of %s: %w", o.Topic, err)
	}
	r := &coreReceiver{c: c, pc: pc}
	if err := r.waitAssigned(ctx, o.Group); err != nil {
		_ = pc.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return r, nil
}

// close commits, leaves the group and closes the connection.
// waitAssigned polls until a member of the group owns queues.
func (r *coreReceiver) waitAssigned(ctx context.Context, grp string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		gs, err := r.c.Groups(ctx)
		if err != nil {
			return fmt.Errorf("core group %s: %w", grp, err)
		}
		for _, g := range gs {
			for _, m := range g.Members {
				if g.Group == grp && len(m.Queues) > 0 {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("core group %s: no queues assigned: %w", grp, ctx.Err())
		case <-t.C:
		}
	}
}

func (r *coreReceiver) close(ctx context.Context) error {
	return errors.Join(r.pc.Close(ctx), r.c.Close())
}
