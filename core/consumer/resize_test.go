package consumer

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/brokertest"
	"github.com/ferrymq/ferrymq/core/group"
)

// TestResizeKeepsKeyOrder: while producers write 1,000 keys, the topic
// grows 8 → 16 and shrinks 16 → 4. An orderly group, a broadcast group and
// a concurrent group consume throughout, slower than the producers so that
// the old queues still hold a backlog at each resize. No key's message is
// delivered to the orderly or the broadcast members before an earlier one
// of its key; the concurrent group gets every message.
func TestResizeKeepsKeyOrder(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	const topic, keys, perKey = "elastic", 1000, 12
	_, err := e.store.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 8})
	require.NoError(t, err)

	slow := func(o *brokertest.KeyOrder) Listener {
		return func(ctx context.Context, m *core.StoredMessage) Result {
			o.Add(m)
			time.Sleep(20 * time.Microsecond) // the scenario: consumers behind the producers
			return Success
		}
	}
	orderly, concurrent := brokertest.NewKeyOrder(), brokertest.NewKeyOrder()
	bcast := map[string]*brokertest.KeyOrder{"b1": brokertest.NewKeyOrder(), "b2": brokertest.NewKeyOrder()}
	sub := []group.Subscription{{Topic: topic}}
	for _, id := range []string{"o1", "o2"} {
		e.consumer(id, Options{Group: "ord", Orderly: true, Subscriptions: sub, Listener: slow(orderly)})
	}
	for _, id := range []string{"c1", "c2"} {
		e.consumer(id, Options{Group: "conc", Subscriptions: sub, Listener: func(ctx context.Context, m *core.StoredMessage) Result {
			concurrent.Add(m)
			return Success
		}})
	}
	for id, o := range bcast {
		e.consumer(id, Options{Group: "bc", Mode: group.Broadcast, ConsumeGoroutines: 1, Subscriptions: sub, Listener: slow(o)})
	}

	produce := func(round int) {
		batch := make([]*core.Message, 0, keys)
		for k := range keys {
			key := "car-" + strconv.Itoa(k)
			batch = append(batch, &core.Message{Topic: topic, ShardingKey: key, Body: []byte(key + "/" + strconv.Itoa(round))})
		}
		_, err := e.store.ProduceBatch(ctx, batch)
		require.NoError(t, err)
	}
	for round := range perKey {
		produce(round)
		switch round {
		case 3:
			_, err := e.store.ResizeTopic(ctx, topic, 16)
			require.NoError(t, err)
		case 7:
			_, err := e.store.ResizeTopic(ctx, topic, 4)
			require.NoError(t, err)
		}
	}
	total := keys * perKey
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, total, orderly.Distinct(), "orderly")
		assert.Equal(c, total, concurrent.Distinct(), "concurrent")
		for id, o := range bcast {
			assert.Equal(c, total, o.Distinct(), "broadcast %s", id)
		}
	}, 90*time.Second, 50*time.Millisecond)
	require.Empty(t, orderly.Violation(), "orderly group")
	for id, o := range bcast {
		require.Empty(t, o.Violation(), "broadcast member %s", id)
	}
	info, err := e.store.Topic(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, 4, info.Queues)
	require.Len(t, info.Ranges, 16)
}

// TestResizeReplayFromTimeKeepsKeyOrder: a group that consumed a topic
// through 8 → 16 → 4 is reset to a time before the first resize and
// consumes again: from where each key starts, it gets its messages in
// order, retired queues included.
func TestResizeReplayFromTimeKeepsKeyOrder(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	const topic, keys, perKey = "replay", 300, 9
	_, err := e.store.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 8})
	require.NoError(t, err)
	var replayFrom time.Time
	for round := range perKey {
		if round == 2 {
			replayFrom = time.Now()
		}
		batch := make([]*core.Message, 0, keys)
		for k := range keys {
			key := "car-" + strconv.Itoa(k)
			batch = append(batch, &core.Message{Topic: topic, ShardingKey: key, Body: []byte(key + "/" + strconv.Itoa(round))})
		}
		_, err := e.store.ProduceBatch(ctx, batch)
		require.NoError(t, err)
		switch round {
		case 3:
			_, err = e.store.ResizeTopic(ctx, topic, 16)
		case 6:
			_, err = e.store.ResizeTopic(ctx, topic, 4)
		}
		require.NoError(t, err)
	}
	sub := []group.Subscription{{Topic: topic}}
	first := brokertest.NewKeyOrder()
	p := e.consumer("r1", Options{Group: "rp", Orderly: true, Subscriptions: sub, Listener: func(ctx context.Context, m *core.StoredMessage) Result {
		first.Add(m)
		return Success
	}})
	require.Eventually(t, func() bool { return first.Distinct() == keys*perKey }, 60*time.Second, 20*time.Millisecond)
	require.NoError(t, p.Close(ctx))

	_, err = e.coord.ResetOffsets(ctx, "rp", topic, group.ResetTarget{Time: replayFrom})
	require.NoError(t, err)
	again := brokertest.NewKeyOrder()
	again.Base = 2 // replayFrom is just before round 2
	e.consumer("r2", Options{Group: "rp", Orderly: true, Subscriptions: sub, Listener: func(ctx context.Context, m *core.StoredMessage) Result {
		again.Add(m)
		return Success
	}})
	require.Eventually(t, func() bool { return again.Distinct() == keys*(perKey-2) }, 60*time.Second, 20*time.Millisecond)
	require.Empty(t, first.Violation())
	require.Empty(t, again.Violation(), "the replay")
	require.Never(t, func() bool { return again.Distinct() > keys*(perKey-2) }, 200*time.Millisecond, 20*time.Millisecond,
		"nothing from before the replay time")
}
