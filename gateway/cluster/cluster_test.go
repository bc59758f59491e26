package cluster_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/cluster"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
	"github.com/ferrymq/ferrymq/session"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 10 * time.Second

// node is one gateway node: the real gateway (mochi, bridge, embedded
// core; sessions in the NATS bucket with kv) and the cluster hook on its
// own NATS connection.
type node struct {
	*gatewaytest.Env
	hook *cluster.Hook
	name string
}

type nodeOptions struct {
	kv            bool // sessions in the bucket (parked after 50 ms)
	localRetain   bool
	parkedFilters func() map[string][]string
}

func startNode(t testing.TB, url, name string, no nodeOptions) *node {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close) // after the gateway (cleanups run last first)
	var sessions atomic.Pointer[session.Store]
	h, err := cluster.New(nc, cluster.Options{
		Node: name, LocalRetain: no.localRetain, SweepInterval: 100 * time.Millisecond,
		Parked:        func(id string) bool { s := sessions.Load(); return s != nil && s.Parked(id) },
		ParkedFilters: no.parkedFilters,
	})
	require.NoError(t, err)
	o := gatewaytest.Options{Gateway: gateway.Options{Hooks: []mqtt.Hook{h}}}
	if no.kv {
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		o.SessionsKV, o.KVOptions = js, session.KVOptions{NodeID: name}
		o.SessionOptions = session.Options{ParkAfter: 50 * time.Millisecond, SweepInterval: 100 * time.Millisecond}
	}
	env := gatewaytest.Start(t, o)
	sessions.Store(env.Sessions)
	return &node{Env: env, hook: h, name: name}
}

// interest counts the NATS subscriptions that match subject.
func interest(t testing.TB, ns *natstest.Server, subject string) int {
	t.Helper()
	sz, err := ns.Subsz(&server.SubszOptions{Test: subject, Subscriptions: true, Limit: 1000})
	require.NoError(t, err)
	n := 0
	for _, s := range sz.Subs {
		if strings.HasPrefix(s.Subject, cluster.DefaultPrefix+".") {
			n++
		}
	}
	return n
}

func waitInterest(t testing.TB, ns *natstest.Server, subject string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return interest(t, ns, subject) == n }, wait, 5*time.Millisecond,
		"%d subscriptions for %s", n, subject)
}

type msg struct {
	topic, body string
	qos         byte
	retain, dup bool
	props       *paho.PublishProperties
}

// inbox records what one client receives.
type inbox struct {
	mu   sync.Mutex
	msgs []msg
}

func (b *inbox) add3(_ paho3.Client, m paho3.Message) {
	b.mu.Lock()
	b.msgs = append(b.msgs, msg{topic: m.Topic(), body: string(m.Payload()), qos: m.Qos(), retain: m.Retained(), dup: m.Duplicate()})
	b.mu.Unlock()
}

func (b *inbox) add5(pr paho.PublishReceived) (bool, error) {
	p := pr.Packet
	b.mu.Lock()
	b.msgs = append(b.msgs, msg{topic: p.Topic, body: string(p.Payload), qos: p.QoS, retain: p.Retain, dup: p.Duplicate(), props: p.Properties})
	b.mu.Unlock()
	return true, nil
}

func (b *inbox) get() []msg {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.msgs)
}

// bodies are the received bodies, sorted.
func (b *inbox) bodies() []string {
	var out []string
	for _, m := range b.get() {
		out = append(out, m.body)
	}
	sort.Strings(out)
	return out
}

func (b *inbox) has(body string) bool {
	return slices.ContainsFunc(b.get(), func(m msg) bool { return m.body == body })
}

func dial3(t testing.TB, addr, id string, tune ...func(*paho3.ClientOptions)) paho3.Client {
	t.Helper()
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetAutoReconnect(false).
		SetConnectRetry(false).SetProtocolVersion(4).SetOrderMatters(true).SetWriteTimeout(10 * time.Second)
	for _, f := range tune {
		f(o)
	}
	c := paho3.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(wait), "connect %s", id)
	require.NoError(t, tok.Error(), "connect %s", id)
	t.Cleanup(func() { c.Disconnect(50) })
	return c
}

func sub3(t testing.TB, c paho3.Client, filter string, qos byte, b *inbox) {
	t.Helper()
	var h paho3.MessageHandler
	if b != nil {
		h = b.add3
	}
	tok := c.Subscribe(filter, qos, h)
	require.True(t, tok.WaitTimeout(wait))
	require.NoError(t, tok.Error())
}

func pub3(t testing.TB, c paho3.Client, topic string, qos byte, retain bool, body string) {
	t.Helper()
	tok := c.Publish(topic, qos, retain, body)
	require.True(t, tok.WaitTimeout(wait))
	require.NoError(t, tok.Error())
}

// dial5 connects an MQTT 5 client; conn is its TCP connection.
func dial5(t testing.TB, addr string, cp *paho.Connect, b *inbox) (*paho.Client, net.Conn) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, wait)
	require.NoError(t, err)
	cfg := paho.ClientConfig{Conn: conn}
	if b != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){b.add5}
	}
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ca, err := c.Connect(ctx, cp)
	require.NoError(t, err)
	require.Equal(t, byte(0), ca.ReasonCode)
	t.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{})
		<-c.Done()
	})
	return c, conn
}

// settle publishes a marker from pub's node and waits until the inbox
// subscribed to it has it: whatever pub published before has arrived too
// (one origin's messages arrive in order), so a test may then check that
// nothing came twice without sleeping.
func settle(t testing.TB, pub paho3.Client, topic string, got ...*inbox) {
	t.Helper()
	marker := fmt.Sprintf("marker-%d", time.Now().UnixNano())
	pub3(t, pub, topic, 1, false, marker)
	for _, b := range got {
		require.Eventually(t, func() bool { return b.has(marker) }, wait, 5*time.Millisecond, "marker")
	}
}

func without(ms []msg, body string) []msg {
	return slices.DeleteFunc(ms, func(m msg) bool { return strings.HasPrefix(m.body, body) })
}

// (1) A device on node A subscribes, a device on node B publishes QoS 1:
// A's device gets it once with QoS 1; B's core stored it, A's did not.
func TestRouteBetweenNodes(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var got inbox
	sub3(t, dial3(t, a.TCP, "car-a"), "cars/+/cmd", 1, &got)
	waitInterest(t, ns, "fmqmqtt.cars.c1.cmd", 1)
	require.Equal(t, []string{"cars/+/cmd"}, a.hook.Routes())

	pub := dial3(t, b.TCP, "car-b")
	pub3(t, pub, "cars/c1/cmd", 1, false, "unlock")
	require.Eventually(t, func() bool { return got.has("unlock") }, wait, 5*time.Millisecond)
	settle(t, pub, "cars/c1/cmd", &got)
	require.Equal(t, []msg{{topic: "cars/c1/cmd", body: "unlock", qos: 1}}, without(got.get(), "marker"))

	bt, err := b.Store.Topic(t.Context(), "cars")
	require.NoError(t, err, "bridged on the origin node")
	require.NotZero(t, bt.Queues)
	_, err = a.Store.Topic(t.Context(), "cars")
	require.Error(t, err, "not bridged again on the receiving node")
	require.Equal(t, 2.0, value(collector(t, b.hook, "ferrymq_cluster_forwarded_total")))
	require.Equal(t, 2.0, value(collector(t, a.hook, "ferrymq_cluster_received_total")))
}

// value is the sum of what c collects (a counter's value).
func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 16)
	go func() { c.Collect(ch); close(ch) }()
	var v float64
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) == nil && d.Counter != nil {
			v += d.Counter.GetValue()
		}
	}
	return v
}

// collector returns the hook's collector of that name.
func collector(t testing.TB, h *cluster.Hook, name string) prometheus.Collector {
	t.Helper()
	for _, c := range h.Collectors() {
		ch := make(chan *prometheus.Desc, 4)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			if strings.Contains(d.String(), `"`+name+`"`) {
				return c
			}
		}
	}
	t.Fatalf("no collector %s", name)
	return nil
}

// (2, 7) Subscribers on both nodes, with filters that overlap on one node:
// each gets each message once, whichever node it was published on; the
// publisher's own node delivers as before.
func TestOncePerSubscriber(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var a1, a2, a3, b1 inbox
	sub3(t, dial3(t, a.TCP, "a1"), "cars/+/cmd", 1, &a1)
	sub3(t, dial3(t, a.TCP, "a2"), "cars/#", 1, &a2)
	// One client, two filters: one handler (paho calls each matching route's).
	both := dial3(t, a.TCP, "a3", func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(a3.add3) })
	sub3(t, both, "cars/c1/cmd", 1, nil)
	sub3(t, both, "cars/+/+", 2, nil)
	sub3(t, dial3(t, b.TCP, "b1"), "cars/+/cmd", 1, &b1)
	waitInterest(t, ns, "fmqmqtt.cars.c1.cmd", 5) // A: cars.*.cmd, cars, cars.>, cars.c1.cmd, cars.*.*; B: 1 — minus "cars" (no match)
	pa, pb := dial3(t, a.TCP, "pub-a"), dial3(t, b.TCP, "pub-b")
	var want []string
	for i := range 10 {
		pub3(t, pa, "cars/c1/cmd", 1, false, fmt.Sprintf("from-a-%d", i))
		pub3(t, pb, "cars/c1/cmd", byte(i%2), false, fmt.Sprintf("from-b-%d", i))
		want = append(want, fmt.Sprintf("from-a-%d", i), fmt.Sprintf("from-b-%d", i))
	}
	sort.Strings(want)
	settle(t, pa, "cars/c1/cmd", &a1, &a2, &a3, &b1)
	settle(t, pb, "cars/c1/cmd", &a1, &a2, &a3, &b1)
	for name, in := range map[string]*inbox{"a1": &a1, "a2": &a2, "a3": &a3, "b1": &b1} {
		var bodies []string
		for _, m := range without(in.get(), "marker") {
			bodies = append(bodies, m.body)
			require.False(t, m.dup, name)
		}
		sort.Strings(bodies)
		require.Equal(t, want, bodies, name)
	}
	require.Zero(t, value(collector(t, a.hook, "ferrymq_cluster_late_copies_total")))
}

// (3) Unsubscribing, and a clean session's disconnect, remove the node's
// NATS interest; nothing arrives for the filter any more.
func TestUnsubscribeRemovesInterest(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var got, markers inbox
	c := dial3(t, a.TCP, "u1")
	sub3(t, c, "u/+", 1, &got)
	sub3(t, c, "u/+", 1, &got) // again: still one route
	other := dial3(t, a.TCP, "u2")
	sub3(t, other, "u/+", 0, nil)
	sub3(t, dial3(t, a.TCP, "m"), "marker", 1, &markers)
	waitInterest(t, ns, "fmqmqtt.u.x", 1)

	tok := c.Unsubscribe("u/+")
	require.True(t, tok.WaitTimeout(wait))
	require.NoError(t, tok.Error())
	require.Never(t, func() bool { return interest(t, ns, "fmqmqtt.u.x") != 1 }, 100*time.Millisecond, 10*time.Millisecond,
		"u2 still holds it")
	other.Disconnect(50) // a clean session: its subscriptions end with it
	waitInterest(t, ns, "fmqmqtt.u.x", 0)
	require.Equal(t, []string{"marker"}, a.hook.Routes())

	pb := dial3(t, b.TCP, "pub")
	pub3(t, pb, "u/x", 1, false, "nobody")
	settle(t, pb, "marker", &markers)
	require.Empty(t, got.get())
}

// (4) "$share/g/jobs/#" members on A and B: a message published on C goes
// to exactly one of them; one published on A goes to A's member (A serves
// its own); a plain subscriber on B still gets every message once.
func TestSharedSubscription(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})
	c := startNode(t, ns.URL, "gw-c", nodeOptions{})

	var ma, mb, plain inbox
	sub3(t, dial3(t, a.TCP, "worker-a"), "$share/g/jobs/#", 1, &ma)
	sub3(t, dial3(t, b.TCP, "worker-b"), "$share/g/jobs/#", 1, &mb)
	sub3(t, dial3(t, b.TCP, "watcher-b"), "jobs/#", 1, &plain)
	sub3(t, dial3(t, b.TCP, "watcher-b2"), "marker", 1, &plain)
	waitInterest(t, ns, "fmqmqtt.jobs.x", 3) // A: share jobs.>; B: share jobs.>, plain jobs.>
	waitInterest(t, ns, "fmqmqtt.marker", 1)

	pc := dial3(t, c.TCP, "pub-c")
	var want []string
	for i := range 40 {
		body := fmt.Sprintf("c%02d", i)
		pub3(t, pc, "jobs/"+body, 1, false, body)
		want = append(want, body)
	}
	require.Eventually(t, func() bool { return len(ma.get())+len(mb.get()) >= 40 }, wait, 5*time.Millisecond)
	settle(t, pc, "marker", &plain)
	all := append(ma.bodies(), mb.bodies()...)
	sort.Strings(all)
	require.Equal(t, want, all, "each message to exactly one member")
	require.NotEmpty(t, ma.get(), "NATS spreads the group over the nodes")
	require.NotEmpty(t, mb.get())
	require.Equal(t, want, bodiesWithout(&plain, "marker"))

	// Published on A: A's member gets it, B's does not.
	na, nb := len(ma.get()), len(mb.get())
	pa := dial3(t, a.TCP, "pub-a")
	for i := range 10 {
		pub3(t, pa, fmt.Sprintf("jobs/a%d", i), 1, false, fmt.Sprintf("a%d", i))
	}
	require.Eventually(t, func() bool { return len(ma.get()) == na+10 }, wait, 5*time.Millisecond)
	settle(t, pa, "marker", &plain)
	require.Len(t, mb.get(), nb)
	require.Len(t, bodiesWithout(&plain, "marker"), 50)
	require.Zero(t, value(collector(t, b.hook, "ferrymq_cluster_late_copies_total")), "B's copies were collated")
}

// bodiesWithout are b's bodies but those starting with prefix, sorted.
func bodiesWithout(b *inbox, prefix string) []string {
	var out []string
	for _, m := range without(b.get(), prefix) {
		out = append(out, m.body)
	}
	sort.Strings(out)
	return out
}

// (5) '#' matches its parent level; levels with dots, spaces, empty
// levels, unicode and NATS wildcard characters route as themselves.
func TestOddTopics(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	topics := []string{"par", "par/x", "dots.in/level", "sp ace/x y", "a//b", "/lead", "trail/", "ünï/😀", "st*r/gt>", "mid/$dollar", "~/%"}
	var all, exact, parent, plus inbox
	sub3(t, dial3(t, a.TCP, "all"), "#", 1, &all)
	ex := dial3(t, a.TCP, "exact")
	for _, tp := range topics {
		sub3(t, ex, tp, 1, &exact)
	}
	sub3(t, dial3(t, a.TCP, "parent"), "par/#", 1, &parent)
	sub3(t, dial3(t, a.TCP, "plus"), "+/+", 1, &plus)
	waitInterest(t, ns, "fmqmqtt.~.lead", 3) // #, the exact one, +/+

	pb := dial3(t, b.TCP, "pub")
	for _, tp := range topics {
		pub3(t, pb, tp, 1, false, tp)
	}
	settle(t, pb, "par", &all, &parent)
	// Sorted: the bridge holds bridged QoS 1 publishes until stored, so
	// their order with unbridged ones (a first level that is no core
	// topic) is not the publisher's, on any node.
	got := func(b *inbox) []string {
		var out []string
		for _, m := range without(b.get(), "marker") {
			require.Equal(t, m.body, m.topic)
			out = append(out, m.topic)
		}
		sort.Strings(out)
		return out
	}
	sort.Strings(topics)
	require.Eventually(t, func() bool { return len(got(&exact)) == len(topics) }, wait, 5*time.Millisecond)
	require.Equal(t, topics, got(&all))
	require.Equal(t, topics, got(&exact))
	require.Equal(t, []string{"par", "par/x"}, got(&parent))
	var two []string
	for _, tp := range topics {
		if strings.Count(tp, "/") == 1 {
			two = append(two, tp)
		}
	}
	require.Eventually(t, func() bool { return len(got(&plus)) == len(two) }, wait, 5*time.Millisecond)
	require.Equal(t, two, got(&plus))
}

// (6) The retained flag travels: with LocalRetain the receiving node
// retains the message, an MQTT 5 subscriber with retain-as-published sees
// RETAIN 1, and a later subscriber there gets it as retained.
func TestRetainedLocal(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{localRetain: true})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{localRetain: true})

	var live inbox
	c5, _ := dial5(t, a.TCP, &paho.Connect{ClientID: "live", CleanStart: true, KeepAlive: 30}, &live)
	_, err := c5.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "status/#", QoS: 1, RetainAsPublished: true}}})
	require.NoError(t, err)
	waitInterest(t, ns, "fmqmqtt.status.c1", 1)

	pub3(t, dial3(t, b.TCP, "dev"), "status/c1", 1, true, "online")
	require.Eventually(t, func() bool { return live.has("online") }, wait, 5*time.Millisecond)
	require.True(t, live.get()[0].retain, "retain as published")

	var later inbox
	sub3(t, dial3(t, a.TCP, "later"), "status/+", 1, &later)
	require.Eventually(t, func() bool { return later.has("online") }, wait, 5*time.Millisecond)
	require.True(t, later.get()[0].retain, "retained on A")
}

// With the sessions in the bucket (the nats engine), retained messages
// reach every node through the bucket: the receiving node delivers a
// retained publish live but does not write it again.
func TestRetainedShared(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{kv: true})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{kv: true})

	var live inbox
	sub3(t, dial3(t, a.TCP, "live"), "status/#", 1, &live)
	waitInterest(t, ns, "fmqmqtt.status.c1", 1)
	pub3(t, dial3(t, b.TCP, "dev"), "status/c1", 1, true, "online")
	require.Eventually(t, func() bool { return live.has("online") }, wait, 5*time.Millisecond)
	require.Len(t, live.get(), 1)

	var later inbox
	sub3(t, dial3(t, a.TCP, "later"), "status/+", 1, &later)
	require.Eventually(t, func() bool { return later.has("online") }, wait, 5*time.Millisecond)
	require.True(t, later.get()[0].retain)

	js, err := jetstream.New(natsConn(t, ns.URL))
	require.NoError(t, err)
	kv, err := js.KeyValue(t.Context(), "ferrymq_sessions")
	require.NoError(t, err)
	lister, err := kv.ListKeys(t.Context())
	require.NoError(t, err)
	writes := 0
	for k := range lister.Keys() {
		if strings.HasPrefix(k, "r.") {
			hist, err := kv.History(t.Context(), k)
			require.NoError(t, err)
			writes += len(hist)
		}
	}
	require.Equal(t, 1, writes, "the retained message was written by its origin only")
}

func natsConn(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// A device's session parked on A keeps its route: what B publishes is
// queued on A, and the device gets it once when it comes back.
func TestParkedSessionQueues(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{kv: true})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{kv: true})

	persistent := func(o *paho3.ClientOptions) { o.SetCleanSession(false) }
	dev := dial3(t, a.TCP, "car1", persistent)
	sub3(t, dev, "cars/car1/cmd", 1, nil)
	waitInterest(t, ns, "fmqmqtt.cars.car1.cmd", 1)
	dev.Disconnect(50)
	require.Eventually(t, func() bool { return a.Sessions.Parked("car1") }, wait, 5*time.Millisecond)
	require.Never(t, func() bool { return interest(t, ns, "fmqmqtt.cars.car1.cmd") != 1 }, 300*time.Millisecond, 20*time.Millisecond,
		"several sweeps: the parked session stays routed")

	pub3(t, dial3(t, b.TCP, "backend"), "cars/car1/cmd", 1, false, "unlock")
	require.Eventually(t, func() bool { in, _ := a.Sessions.Session("car1"); return in.Queued == 1 }, wait, 5*time.Millisecond)

	var got inbox
	dial3(t, a.TCP, "car1", persistent, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add3) })
	require.Eventually(t, func() bool { return got.has("unlock") }, wait, 5*time.Millisecond)
	require.Never(t, func() bool { return len(got.get()) > 1 }, 200*time.Millisecond, 20*time.Millisecond)
}

// A session that moves to another node is routed there (its subscription
// came along, no SUBSCRIBE) and no longer where it was.
func TestSessionMovesNode(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{kv: true})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{kv: true})

	persistent := func(o *paho3.ClientOptions) { o.SetCleanSession(false) }
	dev := dial3(t, a.TCP, "car2", persistent)
	sub3(t, dev, "cars/car2/cmd", 1, nil)
	dev.Disconnect(50)
	var got inbox
	dial3(t, b.TCP, "car2", persistent, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add3) })
	require.Eventually(t, func() bool { return slices.Equal(b.hook.Routes(), []string{"cars/car2/cmd"}) }, wait, 5*time.Millisecond)
	require.Eventually(t, func() bool { return len(a.hook.Routes()) == 0 }, wait, 5*time.Millisecond, "swept from A")
	waitInterest(t, ns, "fmqmqtt.cars.car2.cmd", 1)

	pub3(t, dial3(t, a.TCP, "backend"), "cars/car2/cmd", 1, false, "lock")
	require.Eventually(t, func() bool { return got.has("lock") }, wait, 5*time.Millisecond)
	require.Never(t, func() bool { return len(got.get()) > 1 }, 200*time.Millisecond, 20*time.Millisecond)
}

// A will sent by node A reaches a subscriber on node B once.
func TestWillRouted(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var wills inbox
	sub3(t, dial3(t, b.TCP, "watcher"), "wills/#", 1, &wills)
	waitInterest(t, ns, "fmqmqtt.wills.d1", 1)
	_, conn := dial5(t, a.TCP, &paho.Connect{ClientID: "d1", CleanStart: true, KeepAlive: 30, WillMessage: &paho.WillMessage{
		Topic: "wills/d1", QoS: 1, Payload: []byte("gone")}}, nil)
	require.NoError(t, conn.Close()) // no DISCONNECT: the will is due
	require.Eventually(t, func() bool { return wills.has("gone") }, wait, 5*time.Millisecond)
	require.Never(t, func() bool { return len(wills.get()) > 1 }, 200*time.Millisecond, 20*time.Millisecond)
}

// MQTT 5 properties travel with the message.
func TestMQTT5Properties(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var got inbox
	sub, _ := dial5(t, a.TCP, &paho.Connect{ClientID: "s5", CleanStart: true, KeepAlive: 30}, &got)
	_, err := sub.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "rpc/#", QoS: 2}}})
	require.NoError(t, err)
	waitInterest(t, ns, "fmqmqtt.rpc.req", 1)

	pub, _ := dial5(t, b.TCP, &paho.Connect{ClientID: "p5", CleanStart: true, KeepAlive: 30}, nil)
	expiry, format := uint32(600), byte(1)
	_, err = pub.Publish(t.Context(), &paho.Publish{Topic: "rpc/req", QoS: 2, Payload: []byte(`{"x":1}`), Properties: &paho.PublishProperties{
		ContentType: "application/json", ResponseTopic: "rpc/resp/p5", CorrelationData: []byte{0, 1, 2},
		MessageExpiry: &expiry, PayloadFormat: &format,
		User: paho.UserProperties{{Key: "trace", Value: "a=b c"}, {Key: "trace", Value: "two"}, {Key: "ü", Value: "\n"}},
	}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(got.get()) == 1 }, wait, 5*time.Millisecond)
	m := got.get()[0]
	require.Equal(t, byte(2), m.qos)
	p := m.props
	require.Equal(t, "application/json", p.ContentType)
	require.Equal(t, "rpc/resp/p5", p.ResponseTopic)
	require.Equal(t, []byte{0, 1, 2}, p.CorrelationData)
	require.NotNil(t, p.MessageExpiry)
	require.InDelta(t, 600, *p.MessageExpiry, 5)
	require.Equal(t, &format, p.PayloadFormat)
	require.Equal(t, paho.UserProperties{{Key: "trace", Value: "a=b c"}, {Key: "trace", Value: "two"}, {Key: "ü", Value: "\n"}}, p.User)
}

// Stopping a node removes its routes from NATS.
func TestStopRemovesRoutes(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	sub3(t, dial3(t, a.TCP, "x"), "x/#", 1, nil)
	waitInterest(t, ns, "fmqmqtt.x.y", 1)
	a.Stop(t)
	waitInterest(t, ns, "fmqmqtt.x.y", 0)
	a.hook.Close() // again: nothing
}

// BenchmarkForwardInject measures a publish on one node reaching the
// local server of another: forward queue, NATS, collation, injection into
// mochi (which delivers it to one QoS 0 subscriber).
func BenchmarkForwardInject(b *testing.B) {
	ns := natstest.RunServer(b)
	a := startNode(b, ns.URL, "gw-a", nodeOptions{})
	rb := startNode(b, ns.URL, "gw-b", nodeOptions{})
	sub3(b, dial3(b, rb.TCP, "sink"), "bench/#", 0, nil)
	waitInterest(b, ns, "fmqmqtt.bench.x", 1)
	received := collector(b, rb.hook, "ferrymq_cluster_received_total")
	base := value(received)
	payload := make([]byte, 256)
	pub := dial3(b, a.TCP, "src")
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		pub.Publish("bench/x", 0, false, payload) // QoS 0: mochi forwards it as it reads it
		if n++; n%1000 == 0 {
			for value(received)-base < float64(n-5000) {
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	deadline := time.Now().Add(wait)
	for value(received)-base < float64(n) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
	b.ReportMetric(value(received)-base, "received")
}

// accountInterest counts the interest, local and routed from other
// servers, in subject on server s: plain subscriptions, and one per queue
// group.
func accountInterest(t testing.TB, s *natstest.Server, subject string) int {
	t.Helper()
	acc, err := s.LookupAccount(server.DEFAULT_GLOBAL_ACCOUNT)
	require.NoError(t, err)
	return acc.Interest(subject)
}

// Across a three-server NATS cluster (each gateway on its own server, the
// messages crossing routes): overlapping filters and shared groups still
// get each message once, the copies to one node collated.
func TestAcrossNATSCluster(t *testing.T) {
	nc := natstest.RunCluster(t, 3)
	a := startNode(t, nc.Servers[0].URL, "gw-a", nodeOptions{})
	b := startNode(t, nc.Servers[1].URL, "gw-b", nodeOptions{})
	c := startNode(t, nc.Servers[2].URL, "gw-c", nodeOptions{})

	var a1, a2, b1, ma, mb inbox
	sub3(t, dial3(t, a.TCP, "a1"), "cars/+/cmd", 1, &a1)
	sub3(t, dial3(t, a.TCP, "a2"), "cars/#", 1, &a2)
	sub3(t, dial3(t, a.TCP, "ma"), "$share/g/cars/#", 1, &ma)
	sub3(t, dial3(t, b.TCP, "b1"), "cars/c1/cmd", 1, &b1)
	sub3(t, dial3(t, b.TCP, "mb"), "$share/g/cars/#", 1, &mb)
	waitInterest(t, nc.Servers[0], "fmqmqtt.cars.c1.cmd", 3) // A: cars.*.cmd and cars.> (its queue group), the group's cars.>
	waitInterest(t, nc.Servers[1], "fmqmqtt.cars.c1.cmd", 2) // B: cars.c1.cmd, the group's cars.>
	// C's server knows them through its routes: A's group, B's, the
	// shared one.
	require.Eventually(t, func() bool { return accountInterest(t, nc.Servers[2], "fmqmqtt.cars.c1.cmd") == 3 },
		wait, 5*time.Millisecond)

	pc := dial3(t, c.TCP, "pub-c")
	var want []string
	for i := range 30 {
		body := fmt.Sprintf("m%02d", i)
		pub3(t, pc, "cars/c1/cmd", 1, false, body)
		want = append(want, body)
	}
	settle(t, pc, "cars/c1/cmd", &a1, &a2, &b1)
	for name, in := range map[string]*inbox{"a1": &a1, "a2": &a2, "b1": &b1} {
		require.Equal(t, want, bodiesWithout(in, "marker"), name)
	}
	require.Eventually(t, func() bool { return len(ma.get())+len(mb.get()) == 31 }, wait, 5*time.Millisecond)
	shared := append(bodiesWithout(&ma, "marker"), bodiesWithout(&mb, "marker")...)
	sort.Strings(shared)
	require.Equal(t, want, shared)
	require.Never(t, func() bool { return len(ma.get())+len(mb.get()) > 31 }, 100*time.Millisecond, 10*time.Millisecond)
	for _, n := range []*node{a, b} {
		require.Zero(t, value(collector(t, n.hook, "ferrymq_cluster_late_copies_total")), n.name)
	}
}

// TestParkedFiltersRouted: sessions the store parked without mochi ever
// holding them here (taken back at start, adopted from a gone node) are
// routed from Options.ParkedFilters — at once on Resync — and no longer
// once the store stops listing them.
func TestParkedFiltersRouted(t *testing.T) {
	ns := natstest.RunServer(t)
	var parked atomic.Pointer[map[string][]string]
	empty := map[string][]string{}
	parked.Store(&empty)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{parkedFilters: func() map[string][]string { return *parked.Load() }})
	waitInterest(t, ns, "fmqmqtt.ghost.cmd", 0)
	adopted := map[string][]string{"ghost": {"ghost/cmd", "$share/g/ghost/x"}}
	parked.Store(&adopted)
	a.hook.Resync()
	waitInterest(t, ns, "fmqmqtt.ghost.cmd", 1)
	require.NotContains(t, a.hook.Routes(), "$share/g/ghost/x", "a parked session's shared filters are not routed")
	parked.Store(&empty)
	waitInterest(t, ns, "fmqmqtt.ghost.cmd", 0)
}
