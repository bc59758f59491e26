package client_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/trace"
)

// step matches one hop of a trace.
type step struct {
	hop   string
	attrs map[string]string // each must be equal
	actor string            // if set, must be equal
}

func (s step) String() string { return fmt.Sprintf("%s %v", s.hop, s.attrs) }

func (s step) match(e trace.Event) bool {
	if e.Hop != s.hop || (s.actor != "" && e.Actor != s.actor) {
		return false
	}
	for k, v := range s.attrs {
		if e.Attrs[k] != v {
			return false
		}
	}
	return true
}

// missing returns the first step of want that evs, in their order, do not
// contain after the steps before it; "" when evs hold all of want as a
// subsequence.
func missing(evs []trace.Event, want []step) string {
	i := 0
	for _, e := range evs {
		if i < len(want) && want[i].match(e) {
			i++
		}
	}
	if i == len(want) {
		return ""
	}
	return want[i].String()
}

func show(evs []trace.Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "\n  %s %s %s %v", e.At.Format("15:04:05.000000"), e.Hop, e.Actor, e.Attrs)
	}
	return b.String()
}

// A traced message produced over the wire and consumed by two push groups,
// one of which fails it once, and by a POP group: its trace shows every hop,
// in order within each group.
func TestTraceEndToEnd(t *testing.T) {
	env := servertest.Start(t, servertest.Options{Trace: &trace.Options{Topics: []string{"orders"}, Node: "n1"}})
	require.NotNil(t, env.Trace)
	ctx := t.Context()
	pcl, err := client.Dial(ctx, client.Options{Addr: env.Addr, ClientID: "shop-1", MaxBackoff: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pcl.Close() })
	for topic, queues := range map[string]int{"orders": 2, "plain": 1} {
		_, err := pcl.CreateTopic(ctx, topic, queues)
		require.NoError(t, err)
	}
	p := pcl.NewProducer()
	plain, err := p.Send(ctx, &core.Message{Topic: "plain", Body: []byte("p")})
	require.NoError(t, err)
	sent, err := p.Send(ctx, &core.Message{Topic: "orders", ShardingKey: "k", Body: []byte("o")})
	require.NoError(t, err)

	var mu sync.Mutex
	done := map[string]int{} // group → messages finished
	start := func(g string, listen consumer.Listener) *consumer.PushConsumer {
		pc, err := dial(t, env.Addr).NewPushConsumer(consumer.Options{Group: g, ClientID: g + "-1",
			Subscriptions:     []group.Subscription{{Topic: "orders"}, {Topic: "plain"}},
			HeartbeatInterval: 50 * time.Millisecond, PollWait: 200 * time.Millisecond, CommitInterval: 10 * time.Millisecond,
			Listener: listen})
		require.NoError(t, err)
		require.NoError(t, pc.Start(ctx))
		t.Cleanup(func() { _ = pc.Close(context.Background()) })
		return pc
	}
	finish := func(g string) consumer.Result {
		mu.Lock()
		done[g]++
		mu.Unlock()
		return consumer.Success
	}
	pa := start("ga", func(_ context.Context, m *core.StoredMessage) consumer.Result { return finish("ga") })
	pb := start("gb", func(_ context.Context, m *core.StoredMessage) consumer.Result {
		if string(m.Body) == "o" && m.ReconsumeCount == 0 {
			return consumer.Retry // sent back, redelivered through the retry topic
		}
		return finish("gb")
	})
	sc := dial(t, env.Addr).NewSimpleConsumer("gc", "orders")
	require.Eventually(t, func() bool {
		rs, err := sc.Receive(ctx, 8, 50*time.Millisecond)
		require.NoError(t, err)
		for _, r := range rs {
			require.NoError(t, sc.Ack(ctx, r.Handle))
		}
		return len(rs) > 0
	}, 20*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return done["ga"] == 2 && done["gb"] == 2
	}, 20*time.Second, time.Millisecond)

	produced := []step{
		{hop: trace.HopProduce, actor: "shop-1"},
		{hop: trace.HopStored, attrs: map[string]string{"topic": "orders", "queue": fmt.Sprint(sent.Queue), "offset": fmt.Sprint(sent.QueueOffset)}},
	}
	q := fmt.Sprint(sent.Queue)
	rt := group.RetryTopic("gb")
	want := map[string][]step{
		"ga": append(produced[:2:2],
			step{hop: trace.HopDelivered, actor: "ga/ga-1", attrs: map[string]string{"group": "ga", "attempt": "1", "mode": "clustering", "topic": "orders", "queue": q}},
			step{hop: trace.HopCommitted, attrs: map[string]string{"group": "ga", "member": "ga-1", "topic": "orders", "queue": q}}),
		"gb": append(produced[:2:2],
			step{hop: trace.HopDelivered, attrs: map[string]string{"group": "gb", "attempt": "1", "topic": "orders"}},
			step{hop: trace.HopRetry, attrs: map[string]string{"group": "gb", "attempt": "1", "outcome": "scheduled"}},
			step{hop: trace.HopDelivered, attrs: map[string]string{"group": "gb", "attempt": "2", "topic": rt}},
			step{hop: trace.HopCommitted, attrs: map[string]string{"group": "gb", "topic": rt}}),
		"gc": append(produced[:2:2],
			step{hop: trace.HopDelivered, attrs: map[string]string{"group": "gc", "mode": "pop", "attempt": "1"}},
			step{hop: trace.HopAcked, attrs: map[string]string{"group": "gc"}}),
	}
	var evs []trace.Event
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		evs, err = trace.Lookup(ctx, env.Store, sent.ID, 0)
		require.NoError(c, err)
		for g, w := range want {
			assert.Empty(c, missing(evs, w), "group %s in %s", g, show(evs))
		}
	}, 20*time.Second, 5*time.Millisecond)
	for _, e := range evs {
		require.Equal(t, "n1", e.Node)
		if e.Hop == trace.HopProduce {
			require.NotEmpty(t, e.Attrs["remote"])
		}
	}

	// Nothing is recorded for an untraced topic: stop (the recorder writes
	// what it holds) and look in the restarted store.
	require.NoError(t, pa.Close(ctx))
	require.NoError(t, pb.Close(ctx))
	env.Stop()
	again := servertest.Start(t, servertest.Options{Dir: env.Dir})
	none, err := trace.Lookup(ctx, again.Store, plain.ID, 0)
	require.NoError(t, err)
	require.Empty(t, none, "plain is not traced: %s", show(none))
	all, err := trace.Lookup(ctx, again.Store, sent.ID, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(all), len(evs))
	t.Log("trace:", show(all))
}

// A delayed message produced over the wire is traced as produced, delayed,
// and stored in its topic when due, under the ID its producer got.
func TestTraceDelayedOverTheWire(t *testing.T) {
	env := servertest.Start(t, servertest.Options{Trace: &trace.Options{All: true}})
	ctx := t.Context()
	c := dial(t, env.Addr)
	_, err := c.CreateTopic(ctx, "later", 1)
	require.NoError(t, err)
	due := time.Now().Add(100 * time.Millisecond)
	sent, err := c.NewProducer().Send(ctx, &core.Message{Topic: "later", Body: []byte("x"), DeliverAt: due})
	require.NoError(t, err)
	require.Equal(t, -1, sent.Queue, "delayed")
	want := []step{
		{hop: trace.HopProduce, actor: c.ClientID()},
		{hop: trace.HopDelayed, attrs: map[string]string{"topic": "later", "due": due.UTC().Format(time.RFC3339Nano)}},
		{hop: trace.HopStored, actor: "delay", attrs: map[string]string{"topic": "later", "queue": "0", "offset": "0"}},
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		evs, err := trace.Lookup(ctx, env.Store, sent.ID, 0)
		require.NoError(c, err)
		assert.Empty(c, missing(evs, want), "in %s", show(evs))
	}, 20*time.Second, 5*time.Millisecond)
}
