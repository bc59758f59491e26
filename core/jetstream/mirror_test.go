package jetstream_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// consumeAll reads every message of topic as a new group of b, through a
// real group coordinator: the bodies, in delivery order.
func consumeAll(t *testing.T, b core.Broker, topic, grp string, want int) []string {
	t.Helper()
	c, err := group.New(b, group.Options{})
	require.NoError(t, err)
	c.Start()
	defer c.Close()
	var got []string
	m := newMember(c, grp, "m1", group.Clustering, topic, func(_ string, msgs []*core.StoredMessage) {
		for _, sm := range msgs {
			got = append(got, string(sm.Body))
		}
	})
	require.Eventually(t, func() bool {
		require.NoError(t, m.round(t.Context()))
		return len(got) >= want
	}, 30*time.Second, 10*time.Millisecond)
	return got
}

// TestMirrorServesReadsAndRefusesWrites: failover mode 2 on two real
// nats-servers, a primary and a standby in JetStream domains of their own
// joined by a leaf node. A mirror engine on the standby mirrors the
// primary's topic — resized once, so its epochs travel in the metadata —
// and its key index: a group consumes every message there in per-key
// order, lookups by ID and key answer as on the primary, every write is
// refused with core.ErrReadOnly; with the primary shut down, the standby
// still serves a new group everything.
func TestMirrorServesReadsAndRefusesWrites(t *testing.T) {
	ctx := t.Context()
	p, s := natstest.RunLeafPair(t, "primary", "standby", natstest.SyncAlways())
	prim := openEngine(t, p.URL)
	_, err := prim.CreateTopic(ctx, core.TopicConfig{Name: "orders", Queues: 4})
	require.NoError(t, err)
	var ids []core.MessageID
	produce := func(round int) {
		t.Helper()
		for k := range 20 {
			res, err := prim.Produce(ctx, &core.Message{Topic: "orders", ShardingKey: fmt.Sprintf("car-%d", k),
				Keys: []string{fmt.Sprintf("order-%d-%d", round, k)}, Body: fmt.Appendf(nil, "car-%d/%d", k, round)})
			require.NoError(t, err)
			ids = append(ids, res.ID)
		}
	}
	produce(0)
	produce(1)
	_, err = prim.ResizeTopic(ctx, "orders", 8)
	require.NoError(t, err)
	produce(2)

	mirror, err := jetstream.Open(ctx, jetstream.Options{URLs: []string{s.URL}, MirrorOf: "primary", MirrorEvery: 50 * time.Millisecond,
		Timeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = mirror.Close() })
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		info, err := mirror.Topic(ctx, "orders")
		if !assert.NoError(c, err) {
			return
		}
		assert.Equal(c, 8, info.Queues)
		assert.Len(c, info.Epochs, 2)
		last, err := mirror.Get(ctx, ids[len(ids)-1])
		if assert.NoError(c, err) {
			assert.Equal(c, "car-19/2", string(last.Body))
		}
	}, 20*time.Second, 20*time.Millisecond, "the mirror has the topic, its epochs and its messages")

	checkOrder := func(bodies []string) {
		t.Helper()
		next := map[string]int{}
		for _, b := range bodies {
			var k, n int
			_, err := fmt.Sscanf(b, "car-%d/%d", &k, &n)
			require.NoError(t, err, b)
			require.Equal(t, next[fmt.Sprint(k)], n, "car-%d out of order", k)
			next[fmt.Sprint(k)]++
		}
	}
	checkOrder(consumeAll(t, mirror, "orders", "standby-billing", len(ids)))
	found, err := mirror.FindByKey(ctx, "orders", "order-2-7", core.KeyQuery{})
	require.NoError(t, err)
	require.Len(t, found, 1, "the key index is mirrored")
	require.Equal(t, "car-7/2", string(found[0].Body))

	_, err = mirror.Produce(ctx, &core.Message{Topic: "orders", Body: []byte("x")})
	require.ErrorIs(t, err, core.ErrReadOnly)
	_, err = mirror.CreateTopic(ctx, core.TopicConfig{Name: "other", Queues: 1})
	require.ErrorIs(t, err, core.ErrReadOnly)
	_, err = mirror.ResizeTopic(ctx, "orders", 2)
	require.ErrorIs(t, err, core.ErrReadOnly)
	require.ErrorIs(t, mirror.DeleteTopic(ctx, "orders"), core.ErrReadOnly)
	// The system topics of its own groups' retries are the standby's own.
	_, err = mirror.Produce(ctx, &core.Message{Topic: "%RETRY%standby-billing", Body: []byte("again")})
	require.NoError(t, err)

	p.Shutdown() // the primary is gone; the standby never switches and serves reads
	checkOrder(consumeAll(t, mirror, "orders", "after-the-primary", len(ids)))
	got, err := mirror.Get(ctx, ids[3])
	require.NoError(t, err)
	require.Equal(t, "car-3/0", string(got.Body))
}
