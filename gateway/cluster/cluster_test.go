package cluster_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/gateway/cluster"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 10 * time.Second

// node is one gateway node: an engine on a loopback port and its router
// on the node's own NATS connection.
type node struct {
	name string
	addr string
	eng  *engine.Engine
	r    *cluster.Router
	nc   *nats.Conn
}

type nodeOptions struct {
	localRetain bool
	sessions    engine.SessionStore
	nats        []nats.Option
}

// startNode starts a node wired as the gateway wires one: the router is
// the engine's Router, attached before the engine starts and started
// after; at the end the engine shuts down first, then the router closes,
// then the NATS connection.
func startNode(t testing.TB, url, name string, no nodeOptions) *node {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond)}, no.nats...)...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	r, err := cluster.New(cluster.Options{Conn: nc, Node: name, LocalRetain: no.localRetain, RetryInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(r.Close)
	e, err := engine.New(engine.Options{
		Listeners: []engine.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}},
		Hooks:     engine.Hooks{Router: r, Sessions: no.sessions},
		Node:      name,
	})
	require.NoError(t, err)
	r.Attach(e)
	require.NoError(t, e.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		require.NoError(t, e.Shutdown(ctx))
	})
	require.NoError(t, r.Start())
	return &node{name: name, addr: e.Addr("tcp").String(), eng: e, r: r, nc: nc}
}

// interest counts the NATS subscriptions of routes that match subject.
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
		SetConnectRetry(false).SetProtocolVersion(4).SetOrderMatters(true).SetWriteTimeout(wait)
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

func persistent(o *paho3.ClientOptions) { o.SetCleanSession(false) }

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

// settle publishes a marker from pub's node and waits until the inboxes
// subscribed to it have it: whatever pub's node forwarded before has
// arrived too (one origin's messages arrive in order), so a test may then
// check that nothing came twice, or at all, without sleeping.
func settle(t testing.TB, pub paho3.Client, topic string, got ...*inbox) {
	t.Helper()
	marker := fmt.Sprintf("marker-%d", time.Now().UnixNano())
	pub3(t, pub, topic, 1, false, marker)
	for _, b := range got {
		require.Eventually(t, func() bool { return b.has(marker) }, wait, 5*time.Millisecond, "marker")
	}
}

func without(ms []msg, prefix string) []msg {
	return slices.DeleteFunc(ms, func(m msg) bool { return strings.HasPrefix(m.body, prefix) })
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

// value is the sum of what c collects (a counter's value), for the series
// whose labels contain every label pair given (name, value, ...).
func value(c prometheus.Collector, labels ...string) float64 {
	ch := make(chan prometheus.Metric, 16)
	go func() { c.Collect(ch); close(ch) }()
	var v float64
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil || d.Counter == nil {
			continue
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			if !slices.ContainsFunc(d.Label, func(l *dto.LabelPair) bool { return l.GetName() == labels[i] && l.GetValue() == labels[i+1] }) {
				match = false
			}
		}
		if match {
			v += d.Counter.GetValue()
		}
	}
	return v
}

// collector returns the router's collector of that name.
func collector(t testing.TB, r *cluster.Router, name string) prometheus.Collector {
	t.Helper()
	for _, c := range r.Collectors() {
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

// A device on node A subscribes, a device on node B publishes at QoS 0, 1
// and 2: A's device gets each once, in order, at min(publish,
// subscription) QoS; B forwarded each once and A delivered each once.
func TestRouteBetweenNodes(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var got inbox
	sub3(t, dial3(t, a.addr, "car-a"), "cars/+/cmd", 2, &got)
	waitInterest(t, ns, "fmqmqtt.cars.c1.cmd", 1)
	require.Equal(t, []string{"cars/+/cmd"}, a.r.Routes())
	require.Empty(t, b.r.Routes())

	pub := dial3(t, b.addr, "car-b")
	for qos := range byte(3) {
		pub3(t, pub, "cars/c1/cmd", qos, false, fmt.Sprintf("q%d", qos))
	}
	settle(t, pub, "cars/c1/cmd", &got)
	require.Equal(t, []msg{
		{topic: "cars/c1/cmd", body: "q0", qos: 0},
		{topic: "cars/c1/cmd", body: "q1", qos: 1},
		{topic: "cars/c1/cmd", body: "q2", qos: 2},
	}, without(got.get(), "marker"))
	require.Equal(t, 4.0, value(collector(t, b.r, "ferrymq_cluster_forwarded_total")))
	require.Equal(t, 4.0, value(collector(t, a.r, "ferrymq_cluster_received_total")))
	require.Zero(t, value(collector(t, a.r, "ferrymq_cluster_dropped_total")))
	require.Zero(t, value(collector(t, b.r, "ferrymq_cluster_dropped_total")))
}

// Subscribers on both nodes, with filters that overlap on one node: each
// gets each message once, whichever node it was published on; the
// publisher's own node delivers as before.
func TestOncePerSubscriber(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var a1, a2, a3, b1 inbox
	sub3(t, dial3(t, a.addr, "a1"), "cars/+/cmd", 1, &a1)
	sub3(t, dial3(t, a.addr, "a2"), "cars/#", 1, &a2)
	// One client, two filters: one handler (paho calls each matching route's).
	both := dial3(t, a.addr, "a3", func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(a3.add3) })
	sub3(t, both, "cars/c1/cmd", 1, nil)
	sub3(t, both, "cars/+/+", 2, nil)
	sub3(t, dial3(t, b.addr, "b1"), "cars/+/cmd", 1, &b1)
	waitInterest(t, ns, "fmqmqtt.cars.c1.cmd", 5) // A: cars.*.cmd, cars.>, cars.c1.cmd, cars.*.* (and cars, no match); B: 1
	pa, pb := dial3(t, a.addr, "pub-a"), dial3(t, b.addr, "pub-b")
	var want []string
	for i := range 10 {
		pub3(t, pa, "cars/c1/cmd", 1, false, fmt.Sprintf("from-a-%d", i))
		pub3(t, pb, "cars/c1/cmd", byte(i%3), false, fmt.Sprintf("from-b-%d", i))
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
	require.Zero(t, value(collector(t, a.r, "ferrymq_cluster_late_copies_total")))
}

// Unsubscribing, and a clean session's disconnect, remove the node's NATS
// interest; nothing arrives for the filter any more.
func TestUnsubscribeRemovesInterest(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var got, markers inbox
	c := dial3(t, a.addr, "u1")
	sub3(t, c, "u/+", 1, &got)
	sub3(t, c, "u/+", 1, &got) // again: still one route
	other := dial3(t, a.addr, "u2")
	sub3(t, other, "u/+", 0, nil)
	sub3(t, dial3(t, a.addr, "m"), "marker", 1, &markers)
	waitInterest(t, ns, "fmqmqtt.u.x", 1)

	tok := c.Unsubscribe("u/+")
	require.True(t, tok.WaitTimeout(wait))
	require.NoError(t, tok.Error())
	require.Never(t, func() bool { return interest(t, ns, "fmqmqtt.u.x") != 1 }, 100*time.Millisecond, 10*time.Millisecond,
		"u2 still holds it")
	other.Disconnect(50) // a clean session: its subscriptions end with it
	waitInterest(t, ns, "fmqmqtt.u.x", 0)
	require.Equal(t, []string{"marker"}, a.r.Routes())

	pb := dial3(t, b.addr, "pub")
	pub3(t, pb, "u/x", 1, false, "nobody")
	settle(t, pb, "marker", &markers)
	require.Never(t, func() bool { return len(got.get()) > 0 }, 200*time.Millisecond, 10*time.Millisecond)
}

// "$share/g/jobs/#" members on A and B: a message published on C goes to
// exactly one of them; one published on A goes to A's member (A serves
// its own); a plain subscriber on B still gets every message once.
func TestSharedSubscription(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})
	c := startNode(t, ns.URL, "gw-c", nodeOptions{})

	var ma, mb, plain inbox
	sub3(t, dial3(t, a.addr, "worker-a"), "$share/g/jobs/#", 1, &ma)
	sub3(t, dial3(t, b.addr, "worker-b"), "$share/g/jobs/#", 1, &mb)
	sub3(t, dial3(t, b.addr, "watcher-b"), "jobs/#", 1, &plain)
	sub3(t, dial3(t, b.addr, "watcher-b2"), "marker", 1, &plain)
	waitInterest(t, ns, "fmqmqtt.jobs.x", 3) // A: share jobs.>; B: share jobs.>, plain jobs.>
	waitInterest(t, ns, "fmqmqtt.marker", 1)
	require.Equal(t, []string{"$share/g/jobs/#"}, a.r.Routes())

	pc := dial3(t, c.addr, "pub-c")
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
	// watcher-b and watcher-b2 are two connections: the marker reaching
	// one says nothing of what the other has been written yet.
	require.Eventually(t, func() bool { return slices.Equal(want, bodiesWithout(&plain, "marker")) }, wait, 5*time.Millisecond,
		"the plain subscriber gets every message: %v", bodiesWithout(&plain, "marker"))

	// Published on A: A's member gets it, B's does not.
	na, nb := len(ma.get()), len(mb.get())
	pa := dial3(t, a.addr, "pub-a")
	for i := range 10 {
		pub3(t, pa, fmt.Sprintf("jobs/a%d", i), 1, false, fmt.Sprintf("a%d", i))
	}
	require.Eventually(t, func() bool { return len(ma.get()) == na+10 }, wait, 5*time.Millisecond)
	settle(t, pa, "marker", &plain)
	require.Len(t, mb.get(), nb)
	require.Eventually(t, func() bool { return len(bodiesWithout(&plain, "marker")) == 50 }, wait, 5*time.Millisecond,
		"the plain subscriber gets A's messages too: %v", bodiesWithout(&plain, "marker"))
	require.Zero(t, value(collector(t, b.r, "ferrymq_cluster_late_copies_total")), "B's copies were collated")
}

// A shared group is served by its connected members only [MQTT-4.8.2-2]:
// while A's only member is offline (a persistent session), A gives up the
// group's interest and B's member gets every message; when it is back, A
// takes its share again — and every message still reaches exactly one.
func TestSharedGroupServedByConnectedMembers(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})
	c := startNode(t, ns.URL, "gw-c", nodeOptions{})

	var ma, mb inbox
	wa := dial3(t, a.addr, "worker-a", persistent)
	sub3(t, wa, "$share/g/jobs/+", 1, &ma)
	sub3(t, dial3(t, b.addr, "worker-b"), "$share/g/jobs/+", 1, &mb)
	waitInterest(t, ns, "fmqmqtt.jobs.x", 2)
	wa.Disconnect(50)
	require.Eventually(t, func() bool { return len(a.r.Routes()) == 0 }, wait, 5*time.Millisecond, "an offline member holds no route")
	waitInterest(t, ns, "fmqmqtt.jobs.x", 1)
	require.True(t, a.eng.HasSession("worker-a"), "the session and its subscription stay")

	pc := dial3(t, c.addr, "pub-c")
	for i := range 20 {
		pub3(t, pc, "jobs/x", 1, false, fmt.Sprintf("m%02d", i))
	}
	require.Eventually(t, func() bool { return len(mb.get()) == 20 }, wait, 5*time.Millisecond, "all to the connected member")

	var back inbox
	dial3(t, a.addr, "worker-a", persistent, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(back.add3) })
	require.Eventually(t, func() bool { return slices.Equal(a.r.Routes(), []string{"$share/g/jobs/+"}) }, wait, 5*time.Millisecond)
	waitInterest(t, ns, "fmqmqtt.jobs.x", 2)
	for i := 20; i < 60; i++ {
		pub3(t, pc, "jobs/x", 1, false, fmt.Sprintf("m%02d", i))
	}
	require.Eventually(t, func() bool { return len(mb.get())+len(back.get()) >= 60 }, wait, 5*time.Millisecond)
	require.Never(t, func() bool { return len(mb.get())+len(back.get()) > 60 }, 200*time.Millisecond, 10*time.Millisecond)
	all := append(mb.bodies(), back.bodies()...)
	sort.Strings(all)
	var want []string
	for i := range 60 {
		want = append(want, fmt.Sprintf("m%02d", i))
	}
	require.Equal(t, want, all)
	require.NotEmpty(t, back.get(), "A's member takes its share again")
	require.Empty(t, ma.get())
}

// '#' matches its parent level; levels with dots, spaces, empty levels,
// unicode and NATS wildcard characters route as themselves.
func TestOddTopics(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	topics := []string{"par", "par/x", "dots.in/level", "sp ace/x y", "a//b", "/lead", "trail/", "ünï/😀", "st*r/gt>", "mid/$dollar", "~/%"}
	var all, exact, parent, plus inbox
	sub3(t, dial3(t, a.addr, "all"), "#", 1, &all)
	ex := dial3(t, a.addr, "exact")
	for _, tp := range topics {
		sub3(t, ex, tp, 1, &exact)
	}
	sub3(t, dial3(t, a.addr, "parent"), "par/#", 1, &parent)
	sub3(t, dial3(t, a.addr, "plus"), "+/+", 1, &plus)
	waitInterest(t, ns, "fmqmqtt.~.lead", 3) // #, the exact one, +/+

	pb := dial3(t, b.addr, "pub")
	for _, tp := range topics {
		pub3(t, pb, tp, 1, false, tp)
	}
	settle(t, pb, "par", &all, &parent, &exact)
	got := func(b *inbox) []string {
		var out []string
		for _, m := range without(b.get(), "marker") {
			require.Equal(t, m.body, m.topic)
			out = append(out, m.topic)
		}
		return out
	}
	require.Equal(t, topics, got(&all), "in the order published")
	require.Equal(t, topics, got(&exact))
	require.Equal(t, []string{"par", "par/x"}, got(&parent))
	var two []string
	for _, tp := range topics {
		if strings.Count(tp, "/") == 1 {
			two = append(two, tp)
		}
	}
	require.Equal(t, two, got(&plus))
}

// With LocalRetain the receiving node retains a retained publish too: its
// live subscribers get it with RETAIN as MQTT says (1 for
// retain-as-published, 0 otherwise [MQTT-3.3.1-12] [MQTT-3.3.1-9]), a
// later subscriber there gets it as retained.
func TestRetainedLocal(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{localRetain: true})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{localRetain: true})

	var rap, plain inbox
	c5, _ := dial5(t, a.addr, &paho.Connect{ClientID: "rap", CleanStart: true, KeepAlive: 30}, &rap)
	_, err := c5.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "status/#", QoS: 1, RetainAsPublished: true}}})
	require.NoError(t, err)
	sub3(t, dial3(t, a.addr, "plain"), "status/#", 1, &plain)
	waitInterest(t, ns, "fmqmqtt.status.c1", 1)

	pub3(t, dial3(t, b.addr, "dev"), "status/c1", 1, true, "online")
	require.Eventually(t, func() bool { return rap.has("online") && plain.has("online") }, wait, 5*time.Millisecond)
	require.True(t, rap.get()[0].retain, "retain as published")
	require.False(t, plain.get()[0].retain, "a live message to a plain subscription: RETAIN 0")

	var later inbox
	sub3(t, dial3(t, a.addr, "later"), "status/+", 1, &later)
	require.Eventually(t, func() bool { return later.has("online") }, wait, 5*time.Millisecond)
	require.True(t, later.get()[0].retain, "retained on A")
	require.Len(t, a.eng.Retained("status/#"), 1)
}

// Without LocalRetain (the nodes share retained messages through their
// store) the receiving node delivers a retained publish live — RETAIN 1
// to retain-as-published subscribers — but does not retain it again.
func TestRetainedNotRetainedAgain(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var live inbox
	c5, _ := dial5(t, a.addr, &paho.Connect{ClientID: "live", CleanStart: true, KeepAlive: 30}, &live)
	_, err := c5.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "status/#", QoS: 1, RetainAsPublished: true}}})
	require.NoError(t, err)
	waitInterest(t, ns, "fmqmqtt.status.c1", 1)
	pub3(t, dial3(t, b.addr, "dev"), "status/c1", 1, true, "online")
	require.Eventually(t, func() bool { return live.has("online") }, wait, 5*time.Millisecond)
	require.True(t, live.get()[0].retain)
	require.Empty(t, a.eng.Retained("status/#"), "not retained on A")
	require.Len(t, b.eng.Retained("status/#"), 1, "retained on its origin")

	var later inbox
	sub3(t, dial3(t, a.addr, "later"), "status/+", 1, &later)
	require.Never(t, func() bool { return len(later.get()) > 0 }, 200*time.Millisecond, 10*time.Millisecond)
}

// A device's offline persistent session on A keeps its route: what B
// publishes at QoS 1 is queued on A (QoS 0 is not [MQTT-3.1.2-5]), and the
// device gets it once when it comes back.
func TestOfflineSessionQueues(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	dev := dial3(t, a.addr, "car1", persistent)
	sub3(t, dev, "cars/car1/cmd", 1, nil)
	waitInterest(t, ns, "fmqmqtt.cars.car1.cmd", 1)
	dev.Disconnect(50)
	require.Eventually(t, func() bool { return !a.eng.Connected("car1") }, wait, 5*time.Millisecond)
	require.Equal(t, []string{"cars/car1/cmd"}, a.r.Routes(), "the offline session stays routed")

	backend := dial3(t, b.addr, "backend")
	pub3(t, backend, "cars/car1/cmd", 0, false, "not queued")
	pub3(t, backend, "cars/car1/cmd", 1, false, "unlock")
	require.Eventually(t, func() bool { _, q, _, _ := a.eng.Window("car1"); return q == 1 }, wait, 5*time.Millisecond)

	var got inbox
	dial3(t, a.addr, "car1", persistent, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add3) })
	require.Eventually(t, func() bool { return got.has("unlock") }, wait, 5*time.Millisecond)
	require.Never(t, func() bool { return len(got.get()) > 1 }, 200*time.Millisecond, 20*time.Millisecond)
}

// Sessions the engine restores at start are routed at once, before any
// client connects: what another node publishes for them is queued.
func TestRestoredSessionsRouted(t *testing.T) {
	ns := natstest.RunServer(t)
	st := &memStore{stored: []engine.StoredSession{{
		Client:        engine.ClientRecord{ID: "car3", Protocol: 4, Expiry: 3600},
		Offline:       time.Now(),
		Subscriptions: []engine.StoredSubscription{{Filter: "cars/car3/cmd", Options: topictree.Options{QoS: 1}}, {Filter: "$share/g/car3/x"}},
	}}}
	a := startNode(t, ns.URL, "gw-a", nodeOptions{sessions: st})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})
	waitInterest(t, ns, "fmqmqtt.cars.car3.cmd", 1)
	require.Equal(t, []string{"cars/car3/cmd"}, a.r.Routes(), "the shared filter waits for its member to connect")

	pub3(t, dial3(t, b.addr, "backend"), "cars/car3/cmd", 1, false, "hello")
	require.Eventually(t, func() bool { _, q, _, _ := a.eng.Window("car3"); return q == 1 }, wait, 5*time.Millisecond)

	var got inbox
	dial3(t, a.addr, "car3", persistent, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add3) })
	require.Eventually(t, func() bool { return got.has("hello") }, wait, 5*time.Millisecond)
	require.Eventually(t, func() bool { return slices.Equal(a.r.Routes(), []string{"$share/g/car3/x", "cars/car3/cmd"}) },
		wait, 5*time.Millisecond, "connected: the shared filter too")
}

// A session another node takes (the engine's Forget, as a shared session
// store calls it) is routed here no more.
func TestForgottenSessionUnrouted(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	dev := dial3(t, a.addr, "car2", persistent)
	sub3(t, dev, "cars/car2/cmd", 1, nil)
	sub3(t, dev, "$share/g/cars/#", 1, nil)
	waitInterest(t, ns, "fmqmqtt.cars.car2.cmd", 2)
	a.eng.Forget("car2")
	waitInterest(t, ns, "fmqmqtt.cars.car2.cmd", 0)
	require.Empty(t, a.r.Routes())
}

// A will published by node A reaches a subscriber on node B once.
func TestWillRouted(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var wills inbox
	sub3(t, dial3(t, b.addr, "watcher"), "wills/#", 1, &wills)
	waitInterest(t, ns, "fmqmqtt.wills.d1", 1)
	_, conn := dial5(t, a.addr, &paho.Connect{ClientID: "d1", CleanStart: true, KeepAlive: 30, WillMessage: &paho.WillMessage{
		Topic: "wills/d1", QoS: 1, Payload: []byte("gone")}}, nil)
	require.NoError(t, conn.Close()) // no DISCONNECT: the will is due
	require.Eventually(t, func() bool { return wills.has("gone") }, wait, 5*time.Millisecond)
	require.Never(t, func() bool { return len(wills.get()) > 1 }, 200*time.Millisecond, 20*time.Millisecond)
}

// MQTT 5 properties travel with the message; no-local compares the
// publisher's client ID across nodes too.
func TestMQTT5Properties(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var got inbox
	sub, _ := dial5(t, a.addr, &paho.Connect{ClientID: "s5", CleanStart: true, KeepAlive: 30}, &got)
	_, err := sub.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "rpc/#", QoS: 2}},
		Properties: &paho.SubscribeProperties{SubscriptionIdentifier: ptr(9)}})
	require.NoError(t, err)
	waitInterest(t, ns, "fmqmqtt.rpc.req", 1)

	pub, _ := dial5(t, b.addr, &paho.Connect{ClientID: "p5", CleanStart: true, KeepAlive: 30}, nil)
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
	require.Equal(t, ptr(9), p.SubscriptionIdentifier, "the receiving node's own subscription identifier")
}

func ptr[T any](v T) *T { return &v }

// The bridge's downlink deliveries (messages with a Ref) are not
// forwarded: every node reads every command and delivers it itself. The
// server's other publishes are.
func TestDownlinkDeliveriesNotForwarded(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var onA, onB inbox
	sub3(t, dial3(t, a.addr, "dev-a"), "commands/#", 1, &onA)
	sub3(t, dial3(t, b.addr, "dev-b"), "commands/#", 1, &onB)
	waitInterest(t, ns, "fmqmqtt.commands.c1", 2)

	require.NoError(t, a.eng.Publish(&engine.Message{Topic: "commands/c1", Payload: []byte("downlink"), QoS: 1, Ref: "core-1"}, false))
	require.NoError(t, a.eng.Publish(&engine.Message{Topic: "commands/c1", Payload: []byte("server"), QoS: 1}, false))
	require.Eventually(t, func() bool { return onA.has("downlink") && onA.has("server") }, wait, 5*time.Millisecond)
	settle(t, dial3(t, a.addr, "pub-a"), "commands/c1", &onB)
	require.Equal(t, []string{"server"}, bodiesWithout(&onB, "marker"))
}

// Topics starting with '$' are never routed: neither their filters nor
// what is published on them.
func TestDollarTopicsStayOnTheirNode(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})

	var onB, markers inbox
	cb := dial3(t, b.addr, "dev-b")
	sub3(t, cb, "$app/#", 1, &onB)
	sub3(t, cb, "marker", 1, &markers)
	waitInterest(t, ns, "fmqmqtt.marker", 1)
	require.Equal(t, []string{"marker"}, b.r.Routes())

	pa := dial3(t, a.addr, "pub-a")
	pub3(t, pa, "$app/x", 1, false, "dollar")
	settle(t, pa, "marker", &markers)
	require.Empty(t, onB.get())
	require.Equal(t, 1.0, value(collector(t, a.r, "ferrymq_cluster_forwarded_total")), "the marker only")
}

// With NATS gone, the engine keeps serving its own clients at full speed:
// publishes for other nodes are dropped and counted, never waited for.
func TestNATSDownEngineNeverBlocks(t *testing.T) {
	ns := natstest.RunServer(t)
	// No reconnect buffer: a publish while disconnected fails at once.
	a := startNode(t, ns.URL, "gw-a", nodeOptions{nats: []nats.Option{nats.ReconnectBufSize(-1)}})
	var local inbox
	sub3(t, dial3(t, a.addr, "local"), "t/#", 1, &local)
	waitInterest(t, ns, "fmqmqtt.t.x", 1)
	ns.Shutdown()
	require.Eventually(t, func() bool { return !a.nc.IsConnected() }, wait, 5*time.Millisecond)

	pub := dial3(t, a.addr, "pub")
	for i := range 200 {
		pub3(t, pub, "t/x", byte(i%2), false, fmt.Sprintf("m%03d", i))
	}
	require.Eventually(t, func() bool { return len(local.get()) == 200 }, wait, 5*time.Millisecond)
	dropped := collector(t, a.r, "ferrymq_cluster_dropped_total")
	require.Eventually(t, func() bool { return value(dropped, "reason", "publish_error") == 200 }, wait, 5*time.Millisecond)
	require.Zero(t, value(collector(t, a.r, "ferrymq_cluster_forwarded_total")))

	// Subscriptions made meanwhile are kept for the reconnect; the engine
	// does not wait for them either.
	sub3(t, dial3(t, a.addr, "late"), "late/#", 1, nil)
	require.Eventually(t, func() bool { return slices.Contains(a.r.Routes(), "late/#") }, wait, 5*time.Millisecond)
}

// When the NATS server comes back, the NATS client subscribes the routes
// again — those made while it was away too — and messages flow again.
func TestRoutesSurviveNATSRestart(t *testing.T) {
	ns := runPlain(t, server.RANDOM_PORT)
	port := ns.Addr().(*net.TCPAddr).Port
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})
	var before, during inbox
	sa := dial3(t, a.addr, "sub")
	sub3(t, sa, "before/#", 1, &before)
	waitInterest(t, ns, "fmqmqtt.before.x", 1)

	ns.Shutdown()
	sub3(t, sa, "during/#", 1, &during)
	require.Eventually(t, func() bool { return len(a.r.Routes()) == 2 }, wait, 5*time.Millisecond)
	ns = runPlain(t, port)
	waitInterest(t, ns, "fmqmqtt.before.x", 1)
	waitInterest(t, ns, "fmqmqtt.during.x", 1)

	pb := dial3(t, b.addr, "pub")
	pub3(t, pb, "before/x", 1, false, "b")
	pub3(t, pb, "during/x", 1, false, "d")
	require.Eventually(t, func() bool { return before.has("b") && during.has("d") }, wait, 5*time.Millisecond)
}

// runPlain starts a nats-server without JetStream on loopback port port
// (server.RANDOM_PORT: any), stopped when the test ends: one that can be
// started again on the same port.
func runPlain(t testing.TB, port int) *natstest.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	s.Start()
	require.True(t, s.ReadyForConnections(wait), "nats server on port %d", port)
	ns := &natstest.Server{Server: s, URL: s.ClientURL()}
	t.Cleanup(ns.Shutdown)
	return ns
}

// Closing the router removes its routes from NATS.
func TestCloseRemovesRoutes(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	sub3(t, dial3(t, a.addr, "x"), "x/#", 1, nil)
	waitInterest(t, ns, "fmqmqtt.x.y", 1)
	a.r.Close()
	waitInterest(t, ns, "fmqmqtt.x.y", 0)
	a.r.Close() // again: nothing
	require.ErrorIs(t, a.r.Start(), cluster.ErrClosed)
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
	sub3(t, dial3(t, a.addr, "a1"), "cars/+/cmd", 1, &a1)
	sub3(t, dial3(t, a.addr, "a2"), "cars/#", 1, &a2)
	sub3(t, dial3(t, a.addr, "ma"), "$share/g/cars/#", 1, &ma)
	sub3(t, dial3(t, b.addr, "b1"), "cars/c1/cmd", 1, &b1)
	sub3(t, dial3(t, b.addr, "mb"), "$share/g/cars/#", 1, &mb)
	waitInterest(t, nc.Servers[0], "fmqmqtt.cars.c1.cmd", 3) // A: cars.*.cmd and cars.> (its queue group), the group's cars.>
	waitInterest(t, nc.Servers[1], "fmqmqtt.cars.c1.cmd", 2) // B: cars.c1.cmd, the group's cars.>
	// C's server knows them through its routes: A's group, B's, the
	// shared one.
	require.Eventually(t, func() bool { return accountInterest(t, nc.Servers[2], "fmqmqtt.cars.c1.cmd") == 3 },
		wait, 5*time.Millisecond)

	pc := dial3(t, c.addr, "pub-c")
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
		require.Zero(t, value(collector(t, n.r, "ferrymq_cluster_late_copies_total")), n.name)
	}
}

// BenchmarkForwardInject measures a publish on one node reaching the
// engine of another: forward queue, NATS, collation, PublishRouted (which
// delivers it to one QoS 0 subscriber).
func BenchmarkForwardInject(b *testing.B) {
	ns := natstest.RunServer(b)
	a := startNode(b, ns.URL, "gw-a", nodeOptions{})
	rb := startNode(b, ns.URL, "gw-b", nodeOptions{})
	sub3(b, dial3(b, rb.addr, "sink"), "bench/#", 0, nil)
	waitInterest(b, ns, "fmqmqtt.bench.x", 1)
	received := collector(b, rb.r, "ferrymq_cluster_received_total")
	base := value(received)
	payload := make([]byte, 256)
	pub := dial3(b, a.addr, "src")
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		pub.Publish("bench/x", 0, false, payload)
		if n++; n%1000 == 0 { // keep at most a few thousand in flight
			require.Eventually(b, func() bool { return value(received)-base >= float64(n-5000) }, wait, 100*time.Microsecond)
		}
	}
	require.Eventually(b, func() bool { return value(received)-base >= float64(n) }, wait, 100*time.Microsecond)
}

// memStore is a SessionStore in memory that starts with stored sessions:
// enough for the engine to restore them and keep their messages.
type memStore struct {
	stored []engine.StoredSession

	mu   sync.Mutex
	msgs map[string][]engine.StoredMessage
}

func (s *memStore) Load() ([]engine.StoredSession, []*engine.Message, error) {
	return s.stored, nil, nil
}
func (s *memStore) SaveClient(engine.ClientRecord)                     {}
func (s *memStore) SaveOffline(string, time.Time)                      {}
func (s *memStore) SaveSubscription(string, string, topictree.Options) {}
func (s *memStore) DeleteSubscription(string, string)                  {}
func (s *memStore) MessageReleased(string, uint16)                     {}
func (s *memStore) SaveInbound(string, uint16, uint64, bool)           {}
func (s *memStore) SaveRetained(*engine.Message)                       {}

func (s *memStore) Delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.msgs, id)
}

func (s *memStore) SaveMessage(id string, pid uint16, m *engine.Message, subIDs []uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.msgs == nil {
		s.msgs = map[string][]engine.StoredMessage{}
	}
	s.msgs[id] = append(s.msgs[id], engine.StoredMessage{PID: pid, Message: m, SubIDs: subIDs})
}

func (s *memStore) DeleteMessage(id string, pid uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs[id] = slices.DeleteFunc(s.msgs[id], func(m engine.StoredMessage) bool { return m.PID == pid })
}

func (s *memStore) LoadMessages(id string) ([]engine.StoredMessage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs[id]), nil
}
