package node_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/wire"
	"github.com/ferrymq/ferrymq/gateway/node"
	"github.com/ferrymq/ferrymq/session"
)

func TestMain(m *testing.M) {
	natstest.MaybeChild() // RunProcessServer's nats-server children
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}

// options is a node as serve runs it by default, on loopback ports the
// kernel picks, in a temporary folder.
func options(t testing.TB) node.Options {
	t.Helper()
	return node.Options{
		DataDir:  t.TempDir(),
		Store:    store.Options{FlushPolicy: store.FlushSync},
		Core:     &node.CoreOptions{Addr: "127.0.0.1:0"},
		Delay:    &delay.Options{},
		Trace:    &trace.Options{},
		Sessions: &session.Options{},
		HTTPAddr: "127.0.0.1:0",
		MQTTAddr: "127.0.0.1:0",
		WSAddr:   "127.0.0.1:0",
	}
}

// natsOptions is options for a node named name on the JetStream engine of
// the nats-server at url (lease TTL 2 s).
func natsOptions(t testing.TB, url, name string) node.Options {
	t.Helper()
	o := options(t)
	o.Engine, o.NodeName = node.EngineNATS, name
	o.NATS = node.NATSOptions{URLs: []string{url}, LeaseTTL: 2 * time.Second}
	return o
}

// reportCores sets o.OnCore to send each address the core services start
// on (every term) to the channel it returns.
func reportCores(o *node.Options) chan net.Addr {
	cores := make(chan net.Addr, 4)
	o.OnCore = func(a net.Addr) { cores <- a }
	return cores
}

func shutdown(t testing.TB, n *node.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, n.Shutdown(ctx))
	require.NoError(t, n.Shutdown(ctx), "a second Shutdown does nothing")
}

// publish connects an MQTT 3.1.1 client as id and publishes body at QoS 1
// to topic: once it returns, the node acknowledged it.
func publish(t testing.TB, addr net.Addr, id, topic, body string) {
	t.Helper()
	c := paho3.NewClient(paho3.NewClientOptions().AddBroker("tcp://" + addr.String()).SetClientID(id).
		SetAutoReconnect(false).SetConnectRetry(false))
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	defer c.Disconnect(250)
	tok = c.Publish(topic, 1, false, body)
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
}

// A node with the embedded engine: what a device publishes over MQTT is in
// the core, read back over the core port; the HTTP server answers; and
// Shutdown leaves no goroutine behind (TestMain's goleak).
func TestEmbeddedNodeMQTTToCore(t *testing.T) {
	n, err := node.New(t.Context(), options(t), nil)
	require.NoError(t, err)
	defer shutdown(t, n)

	for _, name := range []string{"tcp", "ws"} {
		require.NotNil(t, n.Addr(name), name)
		require.NotContains(t, n.Addr(name).String(), ":0", "%s: the bound port", name)
	}
	require.NotNil(t, n.CoreAddr())
	require.NotNil(t, n.HTTPAddr())
	require.NotNil(t, n.Store())
	require.NotNil(t, n.Sessions())
	require.NotNil(t, n.Delay())
	require.NotNil(t, n.Groups())
	require.Empty(t, n.Token(), "loopback only: no token needed")

	publish(t, n.Addr("tcp"), "car-1", "telemetry/car-1", "hello")

	c, err := client.Dial(t.Context(), client.Options{Addr: n.CoreAddr().String(), ClientID: "reader"})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	// Flush sync: acknowledged means stored, so no waiting.
	msgs, err := c.FindByKey(t.Context(), "telemetry", "car-1", core.KeyQuery{})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, "hello", string(msgs[0].Body))
	require.Equal(t, "car-1", msgs[0].ShardingKey, "the client ID is the sharding key")

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+n.HTTPAddr().String()+"/healthz", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	http.DefaultClient.CloseIdleConnections()
}

// A bad option is an error from New, not a panic, and leaves nothing
// running.
func TestNewRejectsBadOptions(t *testing.T) {
	for name, change := range map[string]func(*node.Options){
		"unknown flush policy": func(o *node.Options) { o.Store.FlushPolicy = "sometimes" },
		"unknown engine":       func(o *node.Options) { o.Engine = "carrier-pigeon" },
		"nats without URLs":    func(o *node.Options) { o.Engine = node.EngineNATS },
		"no data dir":          func(o *node.Options) { o.DataDir = "" },
		"no mqtt listener":     func(o *node.Options) { o.MQTTAddr, o.WSAddr = "", "" },
		"core without address": func(o *node.Options) { o.Core = &node.CoreOptions{} },
		"tls without cert":     func(o *node.Options) { o.TLS = []node.TLSListener{{Type: "tcp", Addr: "127.0.0.1:0"}} },
		"auth nobody":          func(o *node.Options) { o.Auth = &node.AuthOptions{} },
		"taken mqtt port": func(o *node.Options) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { _ = ln.Close() })
			o.MQTTAddr = ln.Addr().String()
		},
	} {
		t.Run(name, func(t *testing.T) {
			o := options(t)
			change(&o)
			n, err := node.New(t.Context(), o, nil)
			require.Error(t, err)
			require.Nil(t, n)
		})
	}
}

// Without the core services (what package gatewaytest runs), the node is
// the store, the bridge and the gateway: no core port, no HTTP.
func TestGatewayOnlyNode(t *testing.T) {
	o := options(t)
	o.Core, o.HTTPAddr, o.Delay, o.Trace = nil, "", nil, nil
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	defer shutdown(t, n)
	require.Nil(t, n.CoreAddr())
	require.Nil(t, n.HTTPAddr())
	require.Nil(t, n.Delay())
	publish(t, n.Addr("tcp"), "car-2", "telemetry/car-2", "x")
	msgs, err := n.Store().FindByKey(t.Context(), "telemetry", "car-2", core.KeyQuery{})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
}

// A node on the JetStream engine starts against an in-process
// nats-server, takes the core lease (OnCore), accepts an MQTT publish into
// JetStream and stops.
func TestNATSNodeStartsAndStops(t *testing.T) {
	ns := natstest.RunServer(t)
	o := natsOptions(t, ns.URL, "gw-1")
	cores := reportCores(&o)
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	defer shutdown(t, n)
	require.Equal(t, "gw-1", n.NodeName())
	require.Nil(t, n.Store())
	var coreAddr net.Addr
	select {
	case coreAddr = <-cores:
	case <-time.After(20 * time.Second):
		t.Fatal("the only node did not take the core lease")
	}

	publish(t, n.Addr("tcp"), "car-3", "telemetry/car-3", "over nats")
	msgs, err := n.Broker().FindByKey(t.Context(), "telemetry", "car-3", core.KeyQuery{})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, "over nats", string(msgs[0].Body))
	require.NotNil(t, coreAddr)
}

// A gateway-only node in front of another node's core port (CoreRemote):
// what a device publishes to it is stored by the other node.
func TestRemoteCoreNode(t *testing.T) {
	core1, err := node.New(t.Context(), options(t), nil)
	require.NoError(t, err)
	defer shutdown(t, core1)
	o := options(t)
	o.CoreRemote = core1.CoreAddr().String()
	gw, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	defer shutdown(t, gw) // first: deferred last
	require.Nil(t, gw.Store())
	require.Nil(t, gw.CoreAddr(), "no core port of its own")
	require.NotNil(t, gw.Sessions(), "sessions stay local")

	publish(t, gw.Addr("tcp"), "car-4", "telemetry/car-4", "via remote")
	msgs, err := core1.Store().FindByKey(t.Context(), "telemetry", "car-4", core.KeyQuery{})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, "via remote", string(msgs[0].Body))
}

// A gateway in front of two core nodes (CoreRemote "a,b") sends its uplink
// through a client.Cluster: the second node's store refuses every write
// (fault injected in its broker), so its breaker opens, /metrics says so,
// and every device publish is acknowledged and stored on the first.
func TestRemoteCoreBreaker(t *testing.T) {
	core1, err := node.New(t.Context(), options(t), nil)
	require.NoError(t, err)
	defer shutdown(t, core1)
	faults := &servertest.Faults{}
	faults.Set(servertest.FailProduce)
	core2 := servertest.Start(t, servertest.Options{ServerBroker: faults.Wrap})
	o := options(t)
	o.CoreRemote = core1.CoreAddr().String() + "," + core2.Addr
	gw, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	defer shutdown(t, gw)

	for i := range 30 {
		publish(t, gw.Addr("tcp"), fmt.Sprintf("car-%d", i), fmt.Sprintf("telemetry/car-%d", i), "via the breaker")
	}
	for i := range 30 {
		msgs, err := core1.Store().FindByKey(t.Context(), "telemetry", fmt.Sprintf("car-%d", i), core.KeyQuery{})
		require.NoError(t, err)
		require.Len(t, msgs, 1, "car-%d", i)
	}
	_, metrics := httpGet(t, gw, "/metrics")
	require.Contains(t, metrics, fmt.Sprintf(`ferrymq_core_remote_breaker_state{node=%q} 1`, core2.Addr))
	require.Contains(t, metrics, fmt.Sprintf(`ferrymq_core_remote_breaker_state{node=%q} 0`, core1.CoreAddr().String()))
	require.Contains(t, metrics, fmt.Sprintf(`ferrymq_core_remote_breaker_changes_total{node=%q,to="open"} 1`, core2.Addr))
}

// freeAddr is a loopback address with a port nothing listens on now (a
// node with a fixed core port: discovery names it before it listens).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// Discovery on the JetStream engine: two nodes, the first holding the core
// lease (named so that rendezvous hashing places the node-wide services on
// it: gw-1 over gw-3). A client given only its address learns the second's (wire
// OpCluster: the live nodes and their advertised core addresses); when the
// first node stops, the second takes the lease and listens, and the client
// reconnects there by itself.
func TestNATSDiscovery(t *testing.T) {
	ns := natstest.RunServer(t)
	nodeOpts := func(name string) (node.Options, chan net.Addr) {
		o := natsOptions(t, ns.URL, name)
		o.Core.Addr = freeAddr(t)
		return o, reportCores(&o)
	}
	o1, cores1 := nodeOpts("gw-1")
	n1, err := node.New(t.Context(), o1, nil)
	require.NoError(t, err)
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
	o2, cores2 := nodeOpts("gw-3")
	n2, err := node.New(t.Context(), o2, nil)
	require.NoError(t, err)
	defer shutdown(t, n2)

	c, err := client.Dial(t.Context(), client.Options{Addr: o1.Core.Addr, Discover: true, DiscoverEvery: 100 * time.Millisecond,
		MaxBackoff: 100 * time.Millisecond})
	require.NoError(t, err)
	defer c.Close()
	var info wire.ClusterInfo
	require.Eventually(t, func() bool {
		info, err = c.Cluster(t.Context())
		return err == nil && len(info.Nodes) == 2
	}, 10*time.Second, 20*time.Millisecond, "both nodes named")
	require.Equal(t, []wire.NodeInfo{{Name: "gw-1", Core: o1.Core.Addr, Holder: true}, {Name: "gw-3", Core: o2.Core.Addr}}, info.Nodes)
	require.Eventually(t, func() bool { return slices.Contains(c.Addrs(), o2.Core.Addr) }, 10*time.Second, 10*time.Millisecond)

	shutdown(t, n1)
	stopped1 = true
	select {
	case <-cores2:
	case <-time.After(20 * time.Second):
		t.Fatal("the second node did not take the core lease")
	}
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := c.NewProducer().Send(ctx, &core.Message{Topic: "after-failover", ShardingKey: "car-1", Body: []byte("x")})
		return err == nil
	}, 20*time.Second, 20*time.Millisecond, "the client found the new holder by the address it learned")
	msgs, err := n2.Broker().FindByKey(t.Context(), "after-failover", "car-1", core.KeyQuery{})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
}

// Discovery on the embedded engine: the node names itself, at the address
// it advertises (core.advertise when set).
func TestEmbeddedDiscovery(t *testing.T) {
	clusterOf := func(o node.Options) (*node.Node, wire.ClusterInfo) {
		n, err := node.New(t.Context(), o, nil)
		require.NoError(t, err)
		t.Cleanup(func() { shutdown(t, n) })
		c, err := client.Dial(t.Context(), client.Options{Addr: n.CoreAddr().String()})
		require.NoError(t, err)
		defer c.Close()
		info, err := c.Cluster(t.Context())
		require.NoError(t, err)
		return n, info
	}
	o := options(t)
	o.NodeName = "solo"
	n, info := clusterOf(o)
	require.Equal(t, []wire.NodeInfo{{Name: "solo", Core: n.CoreAddr().String(), Holder: true}}, info.Nodes)

	o = options(t)
	o.Core.Advertise = "core.example.test:10911"
	_, info = clusterOf(o)
	require.Equal(t, "core.example.test:10911", info.Nodes[0].Core)
}
