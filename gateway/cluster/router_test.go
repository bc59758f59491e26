package cluster

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// unstarted is a router on a real NATS server whose goroutines do not
// run: a test drives its steps (apply, receive) itself.
func unstarted(t testing.TB, o Options) *Router {
	t.Helper()
	ns := natstest.RunServer(t)
	nc, err := nats.Connect(ns.URL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	o.Conn, o.Node = nc, "gw-me"
	r, err := New(o)
	require.NoError(t, err)
	t.Cleanup(func() {
		r.unsubscribeAll()
		r.Close()
	})
	return r
}

func TestNewRefusesBadOptions(t *testing.T) {
	_, err := New(Options{Prefix: "a..b", MaxPendingMessages: -1, CollateWait: -time.Second})
	require.ErrorIs(t, err, ErrBadOptions)
	for _, want := range []string{"no NATS connection", "node name", `prefix "a..b"`, "max pending", "collate wait"} {
		require.ErrorContains(t, err, want)
	}
}

func TestLifecycle(t *testing.T) {
	r := unstarted(t, Options{})
	require.ErrorIs(t, r.Start(), ErrNotAttached)
	r.Attach(&engine.Engine{}) // never called: nothing arrives
	require.NoError(t, r.Start())
	require.ErrorIs(t, r.Start(), ErrStarted)
	r.Close()
	r.Close()
	require.ErrorIs(t, r.Start(), ErrClosed)
}

func count(c prometheus.Counter) float64 {
	var d dto.Metric
	_ = c.Write(&d)
	return d.GetCounter().GetValue()
}

func dropped(r *Router, reason string) float64 { return count(r.m.dropped.WithLabelValues(reason)) }

// Routed never blocks: past the forward queue's bound a publish is dropped
// and counted; downlink deliveries (a Ref), '$' topics and topics too
// long for a subject are not forwarded.
func TestRoutedNeverBlocks(t *testing.T) {
	r := unstarted(t, Options{MaxPendingMessages: 2, MaxSubjectBytes: 32})
	for i := range 3 {
		r.Routed(&engine.Message{Topic: "a/b", Payload: []byte{byte(i)}}, nil)
	}
	require.Equal(t, 1.0, dropped(r, dropForwardFull))
	r.Routed(&engine.Message{Topic: "commands/c1", Ref: "core-1"}, nil)
	r.Routed(&engine.Message{Topic: "$SYS/x"}, nil)
	r.Routed(&engine.Message{Topic: strings.Repeat("x", 40)}, nil)
	require.Equal(t, 1.0, dropped(r, dropLong))
	msgs, _ := r.fwd.take(nil)
	require.Len(t, msgs, 2)
}

// What Routed puts on the wire: the message, its publisher, what is left
// of its expiry, its MQTT 5 properties, and the queue groups of the shared
// groups served here.
func TestRoutedWire(t *testing.T) {
	r := unstarted(t, Options{})
	m := &engine.Message{Topic: "jobs/x", Payload: []byte("p"), QoS: 2, Retain: true, Origin: "car 1",
		Expiry: time.Now().Unix() + 60, Props: &engine.Props{ContentType: "text/plain", User: []engine.UserProperty{{Key: "k", Value: "v"}}}}
	r.Routed(m, []string{"g/jobs/#"})
	msgs, _ := r.fwd.take(nil)
	require.Len(t, msgs, 1)
	require.Equal(t, "fmqmqtt.jobs.x", msgs[0].Subject)
	w, err := decodeMessage(msgs[0].Header)
	require.NoError(t, err)
	require.Equal(t, "gw-me", w.origin)
	require.Equal(t, "car 1", w.client)
	require.Equal(t, byte(2), w.qos)
	require.True(t, w.retain)
	require.InDelta(t, 60, w.expiry, 2)
	require.Equal(t, "text/plain", w.contentType)
	require.Equal(t, []engine.UserProperty{{Key: "k", Value: "v"}}, w.user)
	require.Equal(t, []string{shareQueue(pfx, "g", "$share/g/jobs/#")}, w.served)
}

// Routes are counted per session and filter: the first session holding a
// filter subscribes it, the last one gone unsubscribes it; a shared
// filter is held only while its session is connected; the "$share" prefix
// is matched in any case, as the engine matches it; filters that are not
// routed are ignored.
func TestRouteBookkeeping(t *testing.T) {
	r := unstarted(t, Options{})
	routes := func() []string { r.apply(); return r.Routes() }

	r.Subscribed("a", "cars/+/cmd")
	r.Subscribed("b", "cars/+/cmd")
	r.Subscribed("a", "cars/+/cmd") // again
	r.Subscribed("a", "$SYS/#")
	r.Subscribed("a", "$share//x")
	r.Subscribed("a", "$share/g/$SYS/x")
	require.Equal(t, []string{"cars/+/cmd"}, routes())
	r.Unsubscribed("a", "cars/+/cmd")
	require.Equal(t, []string{"cars/+/cmd"}, routes(), "b holds it")
	r.Unsubscribed("b", "cars/+/cmd")
	require.Empty(t, routes())
	require.Empty(t, r.routes, "forgotten")

	r.Subscribed("w", "$SHARE/g/jobs/#") // restored, offline
	require.Empty(t, routes())
	r.Online("w", true)
	require.Equal(t, []string{"$share/g/jobs/#"}, routes())
	r.Subscribed("w", "jobs/x")
	r.Online("w", false)
	require.Equal(t, []string{"jobs/x"}, routes(), "an offline session keeps its plain routes")
	r.Unsubscribed("w", "$share/g/jobs/#")
	r.Unsubscribed("w", "jobs/x")
	require.Empty(t, routes())
	require.Empty(t, r.routes)
	require.Empty(t, r.sessions)
	r.amu.RLock()
	defer r.amu.RUnlock()
	require.Zero(t, r.table.n)
	require.Empty(t, r.byQueue)
	require.Zero(t, r.nActive)
}

// collating sets up an unstarted router whose sessions hold "jobs/#" and
// members of the shared groups g and h on "jobs/#", all active on NATS.
func collating(t *testing.T) *Router {
	t.Helper()
	r := unstarted(t, Options{})
	r.Online("m", true)
	r.Subscribed("p", "jobs/#")
	r.Subscribed("m", "$share/g/jobs/#")
	r.Subscribed("m", "$share/h/jobs/#")
	r.apply()
	require.Len(t, r.Routes(), 3)
	return r
}

// copyOf is one copy of message id from origin on topic, as NATS hands it
// to the subscription of queue group q.
func copyOf(origin string, id uint64, topic, q string, served ...string) *nats.Msg {
	subj, _ := Subject(pfx, topic)
	w := message{origin: origin, id: id, client: "pub", qos: 1, served: served}
	return &nats.Msg{Subject: subj, Header: w.header(), Data: []byte(topic), Sub: &nats.Subscription{Subject: subj, Queue: q}}
}

func deliveries(r *Router) []delivery {
	d, _ := r.in.take(nil)
	return d
}

func skips(ds []delivery) [][]string {
	var out [][]string
	for _, d := range ds {
		s := slices.Clone(d.skip)
		slices.Sort(s)
		out = append(out, s)
	}
	return out
}

func TestCollation(t *testing.T) {
	gq, hq := shareQueue(pfx, "g", "$share/g/jobs/#"), shareQueue(pfx, "h", "$share/h/jobs/#")
	t.Run("every copy came", func(t *testing.T) {
		r := collating(t)
		last := map[string]*pending{}
		r.receive(last, copyOf("gw-o", 1, "jobs/x", r.plainQ))
		r.receive(last, copyOf("gw-o", 1, "jobs/x", gq))
		require.Empty(t, deliveries(r), "h's copy may still come")
		r.receive(last, copyOf("gw-o", 1, "jobs/x", hq))
		ds := deliveries(r)
		require.Len(t, ds, 1, "once however many copies")
		require.Empty(t, ds[0].skip)
		require.Equal(t, "jobs/x", ds[0].m.Topic)
		require.Equal(t, "pub", ds[0].m.Origin)
	})
	t.Run("a group's copy went elsewhere", func(t *testing.T) {
		r := collating(t)
		last := map[string]*pending{}
		r.receive(last, copyOf("gw-o", 1, "jobs/x", r.plainQ))
		r.receive(last, copyOf("gw-o", 1, "jobs/x", gq))
		r.receive(last, copyOf("gw-o", 2, "jobs/y", r.plainQ)) // the origin's next: 1 is complete
		require.Equal(t, [][]string{{"h/jobs/#"}}, skips(deliveries(r)))
	})
	t.Run("served at the origin", func(t *testing.T) {
		r := collating(t)
		last := map[string]*pending{}
		r.receive(last, copyOf("gw-o", 1, "jobs/x", gq, gq, hq))
		r.receive(last, copyOf("gw-o", 1, "jobs/x", r.plainQ, gq, hq))
		require.Equal(t, [][]string{{"g/jobs/#", "h/jobs/#"}}, skips(deliveries(r)), "complete at once: no other copy can come")
	})
	t.Run("late copies", func(t *testing.T) {
		r := collating(t)
		last := map[string]*pending{}
		r.receive(last, copyOf("gw-o", 1, "jobs/x", gq))
		r.deliver(last["gw-o"]) // CollateWait passed
		require.Equal(t, [][]string{{"h/jobs/#"}}, skips(deliveries(r)))
		r.receive(last, copyOf("gw-o", 1, "jobs/x", r.plainQ))
		require.Empty(t, deliveries(r), "the plain subscribers had it with the message")
		r.receive(last, copyOf("gw-o", 1, "jobs/x", hq))
		require.Empty(t, deliveries(r), "a plain subscriber here would get it twice")
		require.Equal(t, 1.0, dropped(r, dropLate))
		require.Equal(t, 2.0, count(r.m.late))
	})
	t.Run("late shared copy, no plain subscriber", func(t *testing.T) {
		r := collating(t)
		r.Unsubscribed("p", "jobs/#")
		r.apply()
		last := map[string]*pending{}
		r.receive(last, copyOf("gw-o", 1, "jobs/x", gq))
		r.deliver(last["gw-o"])
		require.Equal(t, [][]string{{"h/jobs/#"}}, skips(deliveries(r)))
		r.receive(last, copyOf("gw-o", 1, "jobs/x", hq))
		ds := deliveries(r)
		require.Equal(t, [][]string{{"g/jobs/#"}}, skips(ds), "to h alone")
		require.False(t, ds[0].retain, "retained with the first delivery if at all")
	})
	t.Run("own and unreadable", func(t *testing.T) {
		r := collating(t)
		last := map[string]*pending{}
		r.receive(last, copyOf("gw-me", 1, "jobs/x", r.plainQ))
		bad := copyOf("gw-o", 1, "jobs/x", r.plainQ)
		bad.Header.Set(hdrVersion, "9")
		r.receive(last, bad)
		notRouted := copyOf("gw-o", 2, "jobs/x", r.plainQ)
		notRouted.Subject = "fmqmqtt.~JA"
		r.receive(last, notRouted)
		for i, topic := range []string{"a/\xff", "a/\x00"} { // no engine publishes these [MQTT-1.5.4-1] [MQTT-1.5.4-2]
			r.receive(last, copyOf("gw-o", uint64(3+i), topic, r.plainQ))
		}
		require.Empty(t, deliveries(r))
		require.Equal(t, 4.0, dropped(r, dropBad))
	})
}
