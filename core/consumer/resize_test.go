package consumer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
)

// keyOrder records deliveries and finds the first message delivered before
// an earlier one of its key had been delivered at least once.
type keyOrder struct {
	mu        sync.Mutex
	next      map[string]int // per key: every sequence below it was delivered
	seen      map[string]map[int]bool
	violation string
	count     int
	// base is every key's first sequence (a replay from a time: not 0).
	base int
}

func newKeyOrder() *keyOrder {
	return &keyOrder{next: map[string]int{}, seen: map[string]map[int]bool{}}
}

func (o *keyOrder) add(m *core.StoredMessage) {
	seq, _ := strconv.Atoi(strings.TrimPrefix(string(m.Body), m.ShardingKey+"/"))
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen[m.ShardingKey] == nil {
		o.seen[m.ShardingKey] = map[int]bool{}
		o.next[m.ShardingKey] = max(o.next[m.ShardingKey], o.base)
	}
	if !o.seen[m.ShardingKey][seq] {
		o.count++
	}
	o.seen[m.ShardingKey][seq] = true
	if seq > o.next[m.ShardingKey] && o.violation == "" {
		o.violation = fmt.Sprintf("key %s: %d delivered before %d (queue %d offset %d)", m.ShardingKey, seq, o.next[m.ShardingKey], m.Queue, m.QueueOffset)
	}
	for o.seen[m.ShardingKey][o.next[m.ShardingKey]] {
		o.next[m.ShardingKey]++
	}
}

func (o *keyOrder) distinct() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.count
}

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

	slow := func(o *keyOrder) Listener {
		return func(ctx context.Context, m *core.StoredMessage) Result {
			o.add(m)
			time.Sleep(20 * time.Microsecond) // the scenario: consumers behind the producers
			return Success
		}
	}
	orderly, concurrent := newKeyOrder(), newKeyOrder()
	bcast := map[string]*keyOrder{"b1": newKeyOrder(), "b2": newKeyOrder()}
	sub := []group.Subscription{{Topic: topic}}
	for _, id := range []string{"o1", "o2"} {
		e.consumer(id, Options{Group: "ord", Orderly: true, Subscriptions: sub, Listener: slow(orderly)})
	}
	for _, id := range []string{"c1", "c2"} {
		e.consumer(id, Options{Group: "conc", Subscriptions: sub, Listener: func(ctx context.Context, m *core.StoredMessage) Result {
			concurrent.add(m)
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
		assert.Equal(c, total, orderly.distinct(), "orderly")
		assert.Equal(c, total, concurrent.distinct(), "concurrent")
		for id, o := range bcast {
			assert.Equal(c, total, o.distinct(), "broadcast %s", id)
		}
	}, 90*time.Second, 50*time.Millisecond)
	require.Empty(t, orderly.violation, "orderly group")
	for id, o := range bcast {
		require.Empty(t, o.violation, "broadcast member %s", id)
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
	first := newKeyOrder()
	p := e.consumer("r1", Options{Group: "rp", Orderly: true, Subscriptions: sub, Listener: func(ctx context.Context, m *core.StoredMessage) Result {
		first.add(m)
		return Success
	}})
	require.Eventually(t, func() bool { return first.distinct() == keys*perKey }, 60*time.Second, 20*time.Millisecond)
	require.NoError(t, p.Close(ctx))

	_, err = e.coord.ResetOffsets(ctx, "rp", topic, group.ResetTarget{Time: replayFrom})
	require.NoError(t, err)
	again := newKeyOrder()
	again.base = 2 // replayFrom is just before round 2
	e.consumer("r2", Options{Group: "rp", Orderly: true, Subscriptions: sub, Listener: func(ctx context.Context, m *core.StoredMessage) Result {
		again.add(m)
		return Success
	}})
	require.Eventually(t, func() bool { return again.distinct() == keys*(perKey-2) }, 60*time.Second, 20*time.Millisecond)
	require.Empty(t, first.violation)
	require.Empty(t, again.violation, "the replay")
	require.Never(t, func() bool { return again.distinct() > keys*(perKey-2) }, 200*time.Millisecond, 20*time.Millisecond,
		"nothing from before the replay time")
}
