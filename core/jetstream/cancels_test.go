package jetstream_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
)

// TestDelayCancelsOutliveTheNode: a delayed message is cancelled through
// one delay service whose cancellations live in the engine's bucket; that
// service stops (its node lost the core lease) and another one, with an
// empty folder of its own, takes over the same levels: the message is
// still cancelled and never delivered, while its neighbour is.
func TestDelayCancelsOutliveTheNode(t *testing.T) {
	ctx := t.Context()
	e := servicesEngine(t)
	opts := func() delay.Options {
		c, err := e.DelayCancels(ctx, time.Hour)
		require.NoError(t, err)
		return delay.Options{Tick: 250 * time.Millisecond, MaxHold: time.Second, PollInterval: 20 * time.Millisecond, Cancels: c}
	}
	first, err := delay.New(e, t.TempDir(), opts())
	require.NoError(t, err)
	first.Start()
	at := time.Now().Add(2 * time.Second)
	keep, err := first.Broker().Produce(ctx, &core.Message{Topic: "later", ShardingKey: "k", Body: []byte("keep"), DeliverAt: at})
	require.NoError(t, err)
	drop, err := first.Broker().Produce(ctx, &core.Message{Topic: "later", ShardingKey: "k", Body: []byte("drop"), DeliverAt: at})
	require.NoError(t, err)
	_, err = first.Cancel(ctx, drop.ID)
	require.NoError(t, err)
	require.NoError(t, first.Close())

	second, err := delay.New(e, t.TempDir(), opts())
	require.NoError(t, err)
	second.Start()
	t.Cleanup(func() { _ = second.Close() })
	_, err = second.Cancel(ctx, drop.ID)
	require.ErrorIs(t, err, delay.ErrAlreadyCancelled, "the new service knows the cancellation")

	// delivered is how many messages reached the topic (0 on a read error).
	delivered := func() int {
		res, err := e.Read(ctx, core.ReadRequest{Topic: "later", Queue: core.QueueFor("k", 4)})
		if err != nil {
			return 0
		}
		return len(res.Messages)
	}
	require.Eventually(t, func() bool { return delivered() > 0 }, 10*time.Second, 20*time.Millisecond)
	// A wrongly delivered "drop" would follow within the hold (MaxHold 1 s).
	require.Never(t, func() bool { return delivered() > 1 }, time.Second, 20*time.Millisecond, "the cancelled message was delivered")
	res, err := e.Read(ctx, core.ReadRequest{Topic: "later", Queue: core.QueueFor("k", 4)})
	require.NoError(t, err)
	var bodies []string
	for _, m := range res.Messages {
		bodies = append(bodies, string(m.Body))
	}
	require.Equal(t, []string{"keep"}, bodies)
	require.NotEqual(t, keep.ID, drop.ID)
}
