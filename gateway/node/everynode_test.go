package node_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/rendezvous"
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
		o := natsOptions(t, ns.URL, name)
		cores := reportCores(&o)
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
	n2, cores2 := start("gw-3") // rendezvous keeps the node-wide services on gw-1 (over gw-3) until it stops
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
	code, body := httpGet(t, n2, "/api/v1/topics") // the admin API's core part on the node without the lease
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"orders"`)

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

// TestNATSGroupsSpreadAcrossNodes: three nodes, six consumer groups
// consumed through one node's address. Each group is served by the node
// rendezvous hashing picks among the live nodes (discovery names it, and
// its lease says so), and so are the node-wide services (the core lease
// leaves the first node if another is placed); every group gets every
// message. When one node stops,
// its groups move to the nodes left — again by rendezvous over them — and
// go on where they committed.
func TestNATSGroupsSpreadAcrossNodes(t *testing.T) {
	ns := natstest.RunServer(t)
	names := []string{"gw-1", "gw-2", "gw-3"}
	nodes := map[string]*node.Node{}
	stopped := map[string]bool{}
	for _, name := range names {
		n, err := node.New(t.Context(), natsOptions(t, ns.URL, name), nil)
		require.NoError(t, err)
		nodes[name] = n
	}
	// A gateway-only node (no core port) is live but serves no shard.
	gate := natsOptions(t, ns.URL, "gw-gate")
	gate.Core = nil
	gw, err := node.New(t.Context(), gate, nil)
	require.NoError(t, err)
	nodes["gw-gate"] = gw
	defer func() {
		for name, n := range nodes {
			if !stopped[name] {
				shutdown(t, n)
			}
		}
	}()
	ctx := t.Context()
	c, err := client.Dial(ctx, client.Options{Addr: nodes["gw-1"].CoreAddr().String(), MaxBackoff: 100 * time.Millisecond, RequestTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.CreateTopic(ctx, "orders", 4)
	require.NoError(t, err)
	p := c.NewProducer()
	total := 0
	produce := func(count int) {
		t.Helper()
		for i := range count {
			_, err := p.Send(ctx, &core.Message{Topic: "orders", ShardingKey: "car-" + string(rune('a'+i%7)), Body: []byte{byte(i)}})
			require.NoError(t, err)
		}
		total += count
	}
	produce(30)

	groups := []string{"billing", "audit", "fraud", "search", "metrics", "archive"}
	got := map[string]*atomic.Int64{}
	for _, g := range groups {
		got[g] = &atomic.Int64{}
		defer startCounting(t, c, g, "orders", got[g])()
	}
	allGot := func() bool {
		for _, g := range groups {
			if got[g].Load() < int64(total) {
				return false
			}
		}
		return true
	}
	require.Eventually(t, allGot, 30*time.Second, 10*time.Millisecond)
	listed := func() []string {
		t.Helper()
		gs, err := c.Groups(ctx)
		require.NoError(t, err)
		var names []string
		for _, g := range gs {
			names = append(names, g.Group)
		}
		return names
	}
	require.ElementsMatch(t, groups, listed(), "every node's groups, listed through one address")

	placed := func(live []string) {
		t.Helper()
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			info, err := c.Cluster(ctx)
			if !assert.NoError(ct, err) {
				return
			}
			holder := ""
			for _, n := range info.Nodes {
				if n.Holder {
					holder = n.Name
				}
			}
			assert.Equal(ct, rendezvous.Pick(live, "%services"), holder, "the node-wide services (core lease) are placed like the groups")
			share := map[string]int{}
			for _, g := range groups {
				want := rendezvous.Pick(live, g)
				assert.Equal(ct, want, info.Groups[g], "group %s", g)
				share[want]++
			}
			t.Logf("groups per node: %v", share)
		}, 20*time.Second, 50*time.Millisecond)
	}
	moves := 0
	for _, g := range groups {
		if rendezvous.Pick(append([]string{"gw-gate"}, names...), g) == "gw-gate" {
			moves++
		}
	}
	t.Logf("%d of the groups would go to the gateway-only node if it counted", moves)
	placed(names)

	shutdown(t, nodes["gw-2"])
	stopped["gw-2"] = true
	produce(30)
	require.Eventually(t, allGot, 40*time.Second, 10*time.Millisecond, "the groups of the stopped node go on elsewhere")
	placed([]string{"gw-1", "gw-3"})
	require.Eventually(t, func() bool { return len(listed()) == len(groups) }, 20*time.Second, 50*time.Millisecond)
	require.ElementsMatch(t, groups, listed())
}

// TestNATSMirrorNode: failover mode 2 with two nodes on two nats-servers in
// JetStream domains of their own, joined by a leaf node. The primary node
// takes the writes; the read-only node (NATSOptions.MirrorOf) serves a
// consumer group every message from its mirrors, refuses produce over the
// wire and over HTTP with a clear error, and goes on serving a new group
// everything after the primary node and its nats-server are gone.
func TestNATSMirrorNode(t *testing.T) {
	ps, ss := natstest.RunLeafPair(t, "primary", "standby", natstest.SyncAlways())
	start := func(name, url, mirrorOf string) *node.Node {
		o := natsOptions(t, url, name)
		o.NATS.MirrorOf = mirrorOf
		n, err := node.New(t.Context(), o, nil)
		require.NoError(t, err)
		return n
	}
	primary := start("main-1", ps.URL, "")
	primaryUp := true
	defer func() {
		if primaryUp {
			shutdown(t, primary)
		}
	}()
	standby := start("standby-1", ss.URL, "primary")
	defer shutdown(t, standby)
	ctx := t.Context()
	dial := func(n *node.Node) *client.Client {
		c, err := client.Dial(ctx, client.Options{Addr: n.CoreAddr().String(), MaxBackoff: 100 * time.Millisecond, RequestTimeout: 5 * time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	pc, sc := dial(primary), dial(standby)
	_, err := pc.CreateTopic(ctx, "orders", 4)
	require.NoError(t, err)
	const total = 60
	for i := range total {
		_, err := pc.NewProducer().Send(ctx, &core.Message{Topic: "orders", ShardingKey: fmt.Sprintf("car-%d", i%6), Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}

	consume := func(grp string) {
		t.Helper()
		var got atomic.Int64
		defer startCounting(t, sc, grp, "orders", &got)()
		require.Eventually(t, func() bool { return got.Load() >= total }, 30*time.Second, 10*time.Millisecond, "group %s on the standby", grp)
	}
	consume("standby-billing")

	_, err = sc.NewProducer().Send(ctx, &core.Message{Topic: "orders", Body: []byte("x")})
	require.ErrorIs(t, err, core.ErrReadOnly, "produce to the standby")
	code, body := httpPost(t, standby, "/api/v1/topics/orders/messages", `{"body":"x"}`)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "read_only")
	// A device publishing to the standby is not acknowledged (MQTT 3.1.1:
	// closed, as for any refused publish).
	dev := paho3.NewClient(paho3.NewClientOptions().AddBroker("tcp://" + standby.Addr("tcp").String()).SetClientID("car-on-standby").
		SetAutoReconnect(false).SetConnectRetry(false))
	tok := dev.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	pt := dev.Publish("telemetry/car-on-standby", 1, false, "x")
	acked := pt.WaitTimeout(5*time.Second) && pt.Error() == nil
	require.False(t, acked, "the standby acknowledged a device's publish")
	require.Eventually(t, func() bool { return !dev.IsConnectionOpen() }, 10*time.Second, 10*time.Millisecond)
	dev.Disconnect(0)

	shutdown(t, primary)
	primaryUp = false
	ps.Shutdown()
	consume("after-the-primary")
}

// startCounting starts a push consumer of topic for grp through c, with
// test timings, counting what it gets in n, and returns what closes it
// (before the nodes stop: a consumer left running holds their shutdown
// up).
func startCounting(t *testing.T, c *client.Client, grp, topic string, n *atomic.Int64) (stop func()) {
	t.Helper()
	pc, err := c.NewPushConsumer(consumer.Options{Group: grp, Subscriptions: []group.Subscription{{Topic: topic}},
		HeartbeatInterval: 100 * time.Millisecond, PollWait: 200 * time.Millisecond, CommitInterval: 20 * time.Millisecond,
		Listener: func(context.Context, *core.StoredMessage) consumer.Result {
			n.Add(1)
			return consumer.Success
		}})
	require.NoError(t, err)
	require.NoError(t, pc.Start(t.Context()))
	return func() { _ = pc.Close(context.Background()) }
}
