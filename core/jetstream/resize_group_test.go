package jetstream_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
)

// TestServicesGroupAcrossResize: a clustering group of two members
// consumes an 8-queue topic behind two producing nodes while it grows to
// 16 and shrinks to 4 queues; the group's barriers (core/gate) work from
// the engine's epochs: no key is delivered out of order and every message
// is delivered. One producing node is not the one that resizes: its stale
// publishes are fenced and published again.
func TestServicesGroupAcrossResize(t *testing.T) {
	ctx := t.Context()
	e := servicesEngine(t)
	const topic, grp, keys, rounds = "elastic", "billing", 60, 10
	_, err := e.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 8})
	require.NoError(t, err)
	stale := openEngine(t, e.Conn().ConnectedUrl())
	c, err := group.New(e, group.Options{HeartbeatTimeout: 5 * time.Second, CheckInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	c.Start()
	t.Cleanup(func() { _ = c.Close() })

	var log deliveryLog
	members := []*gMember{
		newMember(c, grp, "A", group.Clustering, topic, log.record),
		newMember(c, grp, "B", group.Clustering, topic, log.record),
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Go(func() {
			for !stop.Load() {
				if err := m.round(ctx); err != nil {
					t.Errorf("member %s: %v", m.id, err)
					return
				}
				time.Sleep(2 * time.Millisecond) // paces the members' rounds (a client's poll)
			}
		})
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()

	// Each node produces its own keys, a burst per round, so that the old
	// queues hold a backlog when the topic is resized.
	produced := 0
	burst := func(r int) {
		t.Helper()
		for i, node := range []core.Broker{e, stale} {
			msgs := make([]*core.Message, 0, keys)
			for k := range keys {
				key := fmt.Sprintf("n%d-dev-%d", i, k)
				msgs = append(msgs, &core.Message{Topic: topic, ShardingKey: key, Body: fmt.Appendf(nil, "%s/%d", key, r)})
			}
			_, err := node.ProduceBatch(ctx, msgs)
			require.NoError(t, err)
			produced += len(msgs)
		}
	}
	for r := range rounds {
		burst(r)
		switch r {
		case 3:
			_, err := e.ResizeTopic(ctx, topic, 16)
			require.NoError(t, err)
		case 6:
			_, err := e.ResizeTopic(ctx, topic, 4)
			require.NoError(t, err)
		}
	}
	// assert, not require: the members must be stopped before the test ends.
	ok := assert.Eventually(t, func() bool { return log.len() >= produced }, 2*svcWait, 5*time.Millisecond)
	stop.Store(true)
	wg.Wait()
	require.True(t, ok, "delivered %d of %d", log.len(), produced)

	msgs, who := log.snapshot()
	next := map[string]int{}
	dup := 0
	byMember := map[string]int{}
	for i, m := range msgs {
		key, n, _ := strings.Cut(string(m.Body), "/")
		seq, _ := strconv.Atoi(n)
		switch {
		case seq == next[key]:
			next[key]++
		case seq < next[key]:
			dup++ // delivered again after a rebalance: at least once
		default:
			require.Failf(t, "key delivered out of order", "key %s: %d delivered before %d (queue %d offset %d)", key, seq, next[key], m.Queue, m.QueueOffset)
		}
		byMember[who[i]]++
	}
	for i := range 2 {
		for k := range keys {
			key := fmt.Sprintf("n%d-dev-%d", i, k)
			require.Equal(t, rounds, next[key], "key %s", key)
		}
	}
	t.Logf("delivered %d (%d again), A %d, B %d; published again after a fence: %d", len(msgs), dup, byMember["A"], byMember["B"], republished(stale))
	info, err := e.Topic(ctx, topic)
	require.NoError(t, err)
	require.Len(t, info.Epochs, 3)
}
