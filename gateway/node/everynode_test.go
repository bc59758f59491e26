package node_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/gateway/node"
)

// TestNATSEveryNodeServesTheCore: two nodes on one nats-server; the first
// holds the core lease. A client given only the second node's core
// address produces there (stored by the engine, no redirect), consumes a
// group whose services run on the first (the second answers CodeMoved and
// the client follows), and when the first node stops, the second takes
// the lease and the same consumer goes on from the committed offsets:
// every message delivered, none lost.
func TestNATSEveryNodeServesTheCore(t *testing.T) {
	ns := natstest.RunServer(t)
	start := func(name string) (*node.Node, chan net.Addr) {
		o := options(t)
		o.Engine = node.EngineNATS
		o.NodeName = name
		o.NATS = node.NATSOptions{URLs: []string{ns.URL}, LeaseTTL: 2 * time.Second}
		cores := make(chan net.Addr, 4)
		o.OnCore = func(a net.Addr) { cores <- a }
		n, err := node.New(t.Context(), o, nil)
		require.NoError(t, err)
		return n, cores
	}
	n1, cores1 := start("gw-1")
	stopped1 := false
	defer func() {
		if !stopped1 {
			shutdown(t, n1)
		}
	}()
	select {
	case <-cores1:
	case <-time.After(20 * time.Second):
		t.Fatal("the first node did not take the core lease")
	}
	n2, cores2 := start("gw-2")
	defer shutdown(t, n2)
	require.NotNil(t, n2.CoreAddr(), "a node without the lease serves the core port too")

	ctx := t.Context()
	c, err := client.Dial(ctx, client.Options{Addr: n2.CoreAddr().String(), MaxBackoff: 100 * time.Millisecond, RequestTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.CreateTopic(ctx, "orders", 4)
	require.NoError(t, err)
	p := c.NewProducer()
	sent := map[string]bool{}
	produce := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			res, err := p.Send(ctx, &core.Message{Topic: "orders", ShardingKey: "car-" + string(rune('a'+i%7)), Body: []byte{byte(i)}})
			require.NoError(t, err)
			sent[res.ID.String()] = true
		}
	}
	produce(0, 50)

	var mu sync.Mutex
	got := map[string]bool{}
	var deliveries atomic.Int64
	pc, err := c.NewPushConsumer(consumer.Options{Group: "billing", Subscriptions: []group.Subscription{{Topic: "orders"}},
		HeartbeatInterval: 100 * time.Millisecond, PollWait: 200 * time.Millisecond, CommitInterval: 20 * time.Millisecond,
		Listener: func(_ context.Context, m *core.StoredMessage) consumer.Result {
			mu.Lock()
			got[m.ID.String()] = true
			mu.Unlock()
			deliveries.Add(1)
			return consumer.Success
		}})
	require.NoError(t, err)
	require.NoError(t, pc.Start(ctx))
	defer func() { _ = pc.Close(context.Background()) }()
	all := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range sent {
			if !got[id] {
				return false
			}
		}
		return true
	}
	require.Eventually(t, all, 20*time.Second, 10*time.Millisecond, "consumed through the second node's address")
	lag, err := c.Lag(ctx, "billing", "")
	require.NoError(t, err)
	require.NotEmpty(t, lag)

	shutdown(t, n1)
	stopped1 = true
	select {
	case <-cores2:
	case <-time.After(20 * time.Second):
		t.Fatal("the second node did not take the core lease")
	}
	produce(50, 100)
	require.Eventually(t, all, 30*time.Second, 10*time.Millisecond, "the group goes on, served by the second node")
	t.Logf("%d messages, %d deliveries (again after the move: at least once)", len(sent), deliveries.Load())
}
