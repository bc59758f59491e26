package gateway_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
	"github.com/ferrymq/ferrymq/session"
)

// Two (or more) gateway nodes — each an MQTT engine with its bridge and its
// own embedded core — keep their sessions in one NATS JetStream
// key-value bucket, on a real nats-server.

const kvBucket = "ferrymq_sessions"

// kvFast are the session options of the nodes (the defaults: a session is
// offline, its messages queued, as soon as its connection ends).
var kvFast = session.Options{}

// jsConnect connects to the NATS server at url (one connection per node,
// as separate processes would have).
func jsConnect(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// kvNode starts a gateway node named node whose sessions are in the
// bucket of the NATS server at url.
func kvNode(t testing.TB, url, node string, so session.Options) *gatewaytest.Env {
	t.Helper()
	return gatewaytest.Start(t, gatewaytest.Options{SessionsKV: jsConnect(t, url), SessionOptions: so,
		KVOptions: session.KVOptions{NodeID: node}})
}

// bucket opens the sessions bucket (for the test's own checks).
func bucket(t testing.TB, url string) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js := jsConnect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, kvBucket)
	require.NoError(t, err)
	return js, kv
}

func tok(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// holds reports whether env's engine holds clientID's session, and whether
// it is offline (parked).
func holds(env *gatewaytest.Env, clientID string) (held, parked bool) {
	e := env.Gateway.Engine()
	held = e.HasSession(clientID)
	return held, held && !e.Connected(clientID)
}

// subscriptions is how many subscriptions clientID's session has on env.
func subscriptions(env *gatewaytest.Env, clientID string) int {
	if ci, ok := env.Gateway.Engine().Client(clientID); ok {
		return len(ci.Subscriptions)
	}
	return -1
}

func persistent3(o *paho3.ClientOptions) { o.SetCleanSession(false) }

func subscribe3(t testing.TB, c paho3.Client, filter string, qos byte, h paho3.MessageHandler) {
	t.Helper()
	tok := c.Subscribe(filter, qos, h)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
}

func publish3(t testing.TB, c paho3.Client, topic string, qos byte, retained bool, body string) {
	t.Helper()
	tok := c.Publish(topic, qos, retained, body)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
}

// A device with a persistent session subscribes on node A and goes
// offline; a QoS 1 publish on A is queued for it in the bucket; it
// reconnects to node B and gets it there, with its subscription: B now
// serves the session, A forgot it.
func TestKVSessionResumesOnAnotherNode(t *testing.T) {
	ns := natstest.RunServer(t)
	a := kvNode(t, ns.URL, "gw-a", kvFast)
	b := kvNode(t, ns.URL, "gw-b", kvFast)

	dev := dialV3(t, a.TCP, "car1", persistent3)
	subscribe3(t, dev, "cars/car1/cmd", 1, nil)
	dev.Disconnect(100)
	require.Eventually(t, func() bool { _, p := holds(a, "car1"); return p }, 10*time.Second, 10*time.Millisecond, "parked on A")

	other := dialV3(t, a.TCP, "backend-a")
	publish3(t, other, "cars/car1/cmd", 1, false, "unlock")
	require.Eventually(t, func() bool { return queued(a, "car1") == 1 && a.Sessions.Stats().Backlog == 0 },
		10*time.Second, 10*time.Millisecond, "queued on A, in the bucket")

	var got received
	dialV3(t, b.TCP, "car1", persistent3, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add) })
	require.Eventually(t, func() bool { return len(got.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"cars/car1/cmd=unlock"}, got.get())
	held, parked := holds(b, "car1")
	require.True(t, held)
	require.False(t, parked)
	require.Eventually(t, func() bool { held, _ := holds(a, "car1"); return !held }, 10*time.Second, 10*time.Millisecond,
		"A forgot the session B took")
	require.Eventually(t, func() bool { return queued(b, "car1") == 0 && b.Sessions.Stats().Backlog == 0 },
		10*time.Second, 10*time.Millisecond, "acknowledged on B: gone from the bucket")

	// The subscription came along: a publish on B reaches the device.
	publish3(t, dialV3(t, b.TCP, "backend-b"), "cars/car1/cmd", 1, false, "lock")
	require.Eventually(t, func() bool { return len(got.get()) == 2 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, "cars/car1/cmd=lock", got.get()[1])
}

// A device on node A receives a QoS 1 message and does not acknowledge it;
// node A stops. The device connects to node B: the message comes again
// with DUP set; once acknowledged, nothing further comes and nothing of it
// stays in the bucket.
func TestKVInflightResentByAnotherNode(t *testing.T) {
	ns := natstest.RunServer(t)
	a := kvNode(t, ns.URL, "gw-a", kvFast)
	b := kvNode(t, ns.URL, "gw-b", kvFast)
	_, kv := bucket(t, ns.URL)

	var first atomic.Int32
	dev := dialV3(t, a.TCP, "meter9", persistent3, func(o *paho3.ClientOptions) { o.SetAutoAckDisabled(true) })
	subscribe3(t, dev, "meters/9/cmd", 1, func(_ paho3.Client, m paho3.Message) { first.Add(1) }) // never acked
	publish3(t, dialV3(t, a.TCP, "backend-a"), "meters/9/cmd", 1, false, "read")
	require.Eventually(t, func() bool { return first.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return queued(a, "meter9") == 1 && a.Sessions.Stats().Backlog == 0 },
		10*time.Second, 10*time.Millisecond, "inflight, stored")
	a.Stop(t)

	type msg struct {
		body string
		dup  bool
	}
	var mu sync.Mutex
	var again []msg
	dialV3(t, b.TCP, "meter9", persistent3, func(o *paho3.ClientOptions) {
		o.SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) {
			mu.Lock()
			again = append(again, msg{string(m.Payload()), m.Duplicate()})
			mu.Unlock()
		})
	})
	got := func() []msg { mu.Lock(); defer mu.Unlock(); return append([]msg(nil), again...) }
	require.Eventually(t, func() bool { return len(got()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, msg{"read", true}, got()[0], "resent with DUP")
	require.Eventually(t, func() bool { return queued(b, "meter9") == 0 && b.Sessions.Stats().Backlog == 0 },
		10*time.Second, 10*time.Millisecond, "acknowledged")
	require.Never(t, func() bool { return len(got()) > 1 }, 300*time.Millisecond, 20*time.Millisecond, "nothing further")
	keys, err := kv.ListKeysFiltered(t.Context(), "i."+tok("meter9")+".*")
	require.NoError(t, err)
	var left []string
	for k := range keys.Keys() {
		left = append(left, k)
	}
	require.Empty(t, left, "no inflight message left in the bucket")
	owner, err := kv.Get(t.Context(), "o."+tok("meter9"))
	require.NoError(t, err)
	require.Contains(t, string(owner.Value()), "gw-b")
}

// A device connected to node A connects with the same client ID to node B:
// A sends DISCONNECT 0x8E (session taken over) and closes the old
// connection without its will, B owns the session (owner record and
// revision), and A writes nothing of it afterwards — not even when a
// publish on A matches the subscription it had.
func TestKVTakeoverAcrossNodes(t *testing.T) {
	ns := natstest.RunServer(t)
	js, _ := bucket0(t, ns.URL) // full history, so that every write after the takeover can be inspected
	a := kvNode(t, ns.URL, "gw-a", kvFast)
	b := kvNode(t, ns.URL, "gw-b", kvFast)
	kv, err := js.KeyValue(t.Context(), kvBucket)
	require.NoError(t, err)

	var will received
	watcher := dialV3(t, b.TCP, "watcher")
	subscribe3(t, watcher, "wills/#", 1, will.add)

	var reason atomic.Int32
	reason.Store(-1)
	expiry := uint32(300)
	cp := &paho.Connect{ClientID: "phone5", KeepAlive: 30, CleanStart: false,
		Properties:  &paho.ConnectProperties{SessionExpiryInterval: &expiry},
		WillMessage: &paho.WillMessage{Topic: "wills/phone5", QoS: 1, Payload: []byte("gone")}}
	old := dialV5With(t, a.TCP, cp, func(cfg *paho.ClientConfig) {
		cfg.OnServerDisconnect = func(d *paho.Disconnect) { reason.Store(int32(d.ReasonCode)) }
	})
	_, err = old.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "phones/5/#", QoS: 1}}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return subscriptions(a, "phone5") == 1 },
		10*time.Second, 10*time.Millisecond)
	before, err := kv.Get(t.Context(), "o."+tok("phone5"))
	require.NoError(t, err)
	require.Contains(t, string(before.Value()), "gw-a")

	var got received
	dialV3(t, b.TCP, "phone5", persistent3, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add) })
	require.Eventually(t, func() bool { return reason.Load() == 0x8E }, 10*time.Second, 10*time.Millisecond,
		"the old connection got DISCONNECT 0x8E")
	select {
	case <-old.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the old connection was not closed")
	}
	after, err := kv.Get(t.Context(), "o."+tok("phone5"))
	require.NoError(t, err)
	require.Contains(t, string(after.Value()), "gw-b")
	require.Greater(t, after.Revision(), before.Revision())
	require.Eventually(t, func() bool { held, _ := holds(a, "phone5"); return !held }, 10*time.Second, 10*time.Millisecond)
	held, _ := holds(b, "phone5")
	require.True(t, held)
	require.Equal(t, int64(1), a.Sessions.Stats().TakenOver)
	require.False(t, a.Gateway.Engine().HasSession("phone5"), "A's engine forgot it")

	// A publish on A matching what the session subscribed: A no longer
	// serves the session, so nothing is queued or written there; B's
	// device (on another node, another mochi) is not reached by it.
	publish3(t, dialV3(t, a.TCP, "backend-a"), "phones/5/ring", 1, false, "ring")
	publish3(t, dialV3(t, b.TCP, "backend-b"), "phones/5/ring", 1, false, "ring-b")
	require.Eventually(t, func() bool { return len(got.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"phones/5/ring=ring-b"}, got.get(), "B has the subscription")
	require.Never(t, func() bool { return len(will.get()) > 0 }, 300*time.Millisecond, 20*time.Millisecond,
		"no will for a session taken over")

	// Every message of this session's keys after B's claim is B's.
	str, err := js.Stream(t.Context(), "KV_"+kvBucket)
	require.NoError(t, err)
	info, err := str.Info(t.Context())
	require.NoError(t, err)
	mine := 0
	for seq := after.Revision() + 1; seq <= info.State.LastSeq; seq++ {
		m, err := str.GetMsg(t.Context(), seq)
		if err != nil {
			continue
		}
		if strings.Contains(m.Subject, "."+tok("phone5")) {
			require.Equal(t, "gw-b", m.Header.Get("Ferrymq-Node"), "%s at %d", m.Subject, seq)
			mine++
		}
	}
	require.Positive(t, mine, "B wrote the session (its client record at least)")
	require.Zero(t, a.Sessions.Stats().WriteErrors["fenced"], "A did not even try")
}

// bucket0 creates the sessions bucket before any node does, with history,
// so that a test can read every write (OpenKV uses an existing bucket as
// it is).
func bucket0(t testing.TB, url string) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js := jsConnect(t, url)
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: kvBucket, History: 64,
		Storage: jetstream.FileStorage, LimitMarkerTTL: time.Minute})
	require.NoError(t, err)
	return js, kv
}

// Client IDs, filters and topics of any shape — dots, slashes, spaces,
// wildcard characters, other scripts, very long — are stored under valid
// keys and resume on another node.
func TestKVArbitraryClientIDs(t *testing.T) {
	ns := natstest.RunServer(t)
	a := kvNode(t, ns.URL, "gw-a", kvFast)
	b := kvNode(t, ns.URL, "gw-b", kvFast)
	other := dialV3(t, a.TCP, "backend-a")
	for i, id := range []string{"car.1.2", "fleet/7/car", "車両-ü-🚗", "a*b>c d", strings.Repeat("long.id/", 40)} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			topic := fmt.Sprintf("ü/%d/命令.x", i)
			dev := dialV3(t, a.TCP, id, persistent3)
			subscribe3(t, dev, topic, 1, nil)
			dev.Disconnect(100)
			require.Eventually(t, func() bool { _, p := holds(a, id); return p }, 10*time.Second, 10*time.Millisecond)
			publish3(t, other, topic, 1, false, "hello "+id)
			require.Eventually(t, func() bool { return queued(a, id) == 1 && a.Sessions.Stats().Backlog == 0 },
				10*time.Second, 10*time.Millisecond, "queued on A (the bridge republishes after the PUBACK)")

			var got received
			c := dialV3(t, b.TCP, id, persistent3, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add) })
			require.Eventually(t, func() bool { return len(got.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
			require.Equal(t, []string{topic + "=hello " + id}, got.get())
			c.Disconnect(100)
		})
	}
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// NATS goes away under a running node: the session writes fail with an
// error that is logged and counted, and the gateway keeps serving — the
// connected device subscribes and receives, a new persistent client
// connects, and the node shuts down cleanly.
func TestKVNATSUnavailable(t *testing.T) {
	ns := natstest.RunServer(t)
	var logs syncBuffer
	log := zerolog.New(&logs)
	so := kvFast
	so.Logger = &log
	a := kvNode(t, ns.URL, "gw-a", so)

	var got received
	dev := dialV3(t, a.TCP, "tracker3", persistent3, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add) })
	subscribe3(t, dev, "trackers/3/a", 1, nil)
	ns.Shutdown()

	subscribe3(t, dev, "trackers/3/b", 1, nil)
	require.Eventually(t, func() bool { return a.Sessions.Stats().WriteErrors["unavailable"] > 0 },
		10*time.Second, 10*time.Millisecond, "the failed write is counted")
	require.Eventually(t, func() bool {
		l := logs.String()
		return strings.Contains(l, "session change not stored") && strings.Contains(l, session.ErrUnavailable.Error())
	}, 10*time.Second, 10*time.Millisecond, "the failed write is logged with its cause")

	publish3(t, dialV3(t, a.TCP, "backend-a"), "trackers/3/b", 1, false, "ping")
	require.Eventually(t, func() bool { return len(got.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, "trackers/3/b=ping", got.get()[0])
	require.True(t, dev.IsConnectionOpen())

	late := dialV3(t, a.TCP, "tracker4", persistent3)
	subscribe3(t, late, "trackers/4/#", 1, nil)
	late.Disconnect(100)
	dev.Disconnect(100)
	a.Stop(t)
}

// A retained message set on node A reaches a subscriber on node B at
// subscribe time, and one on a node started afterwards; cleared on B, it
// is gone on A too.
func TestKVRetainedSharedByNodes(t *testing.T) {
	ns := natstest.RunServer(t)
	a := kvNode(t, ns.URL, "gw-a", kvFast)
	b := kvNode(t, ns.URL, "gw-b", kvFast)

	publish3(t, dialV3(t, a.TCP, "lamp"), "lamps/1/state", 1, true, "on")
	require.Eventually(t, func() bool { return b.Sessions.Stats().Retained == 1 }, 10*time.Second, 10*time.Millisecond)
	var onB received
	subscribe3(t, dialV3(t, b.TCP, "app-b"), "lamps/#", 1, onB.add)
	require.Eventually(t, func() bool { return len(onB.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"lamps/1/state=on"}, onB.get())

	c := kvNode(t, ns.URL, "gw-c", kvFast)
	var onC received
	subscribe3(t, dialV3(t, c.TCP, "app-c"), "lamps/+/state", 1, onC.add)
	require.Eventually(t, func() bool { return len(onC.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"lamps/1/state=on"}, onC.get())

	publish3(t, dialV3(t, b.TCP, "lamp-b"), "lamps/1/state", 1, true, "")
	require.Eventually(t, func() bool {
		return len(a.Gateway.Engine().Retained("lamps/#")) == 0
	}, 10*time.Second, 10*time.Millisecond, "cleared on A too")
	var onA received
	subscribe3(t, dialV3(t, a.TCP, "app-a"), "lamps/#", 1, onA.add)
	require.Never(t, func() bool { return len(onA.get()) > 0 }, 200*time.Millisecond, 20*time.Millisecond)
}

// A node that restarts with the same node ID takes back the offline
// sessions it owned: parked again, they get what is published and the
// point-to-point commands sent meanwhile, and the device collects them on
// another node.
func TestKVNodeRestartTakesBackSessions(t *testing.T) {
	ns := natstest.RunServer(t)
	a := kvNode(t, ns.URL, "gw-a", kvFast)
	dev := dialV3(t, a.TCP, "car9", persistent3)
	subscribe3(t, dev, "cars/car9/#", 1, nil)
	dev.Disconnect(100)
	require.Eventually(t, func() bool { _, p := holds(a, "car9"); return p }, 10*time.Second, 10*time.Millisecond)
	a.Stop(t)

	a = kvNode(t, ns.URL, "gw-a", kvFast)
	held, parked := holds(a, "car9")
	require.True(t, held, "taken back at start")
	require.True(t, parked)
	b := kvNode(t, ns.URL, "gw-b", kvFast)
	held, _ = holds(b, "car9")
	require.False(t, held, "another node ID does not take it")

	publish3(t, dialV3(t, a.TCP, "backend-a"), "cars/car9/door", 1, false, "open")
	command(t, a, "car9", "wake", map[string]string{bridge.PropClientID: "car9"})
	require.Eventually(t, func() bool { return queued(a, "car9") == 2 && a.Sessions.Stats().Backlog == 0 },
		10*time.Second, 10*time.Millisecond, "queued in the bucket by the restarted node")

	var got received
	dialV3(t, b.TCP, "car9", persistent3, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add) })
	require.Eventually(t, func() bool { return len(got.get()) == 2 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"cars/car9/door=open", "commands/car9=wake"}, got.get())
}

// On a three-node NATS cluster with a replicated bucket (R3), sessions move
// between gateway nodes as on one server, also after the bucket's stream
// leader died.
func TestKVSessionsOnCluster(t *testing.T) {
	c := natstest.RunCluster(t, 3)
	ko := session.KVOptions{Replicas: 3}
	start := func(node string) *gatewaytest.Env {
		ko := ko
		ko.NodeID = node
		return gatewaytest.Start(t, gatewaytest.Options{SessionsKV: jsConnect(t, c.URLs()), SessionOptions: kvFast, KVOptions: ko})
	}
	a, b := start("gw-a"), start("gw-b")
	move := func(from, to *gatewaytest.Env, body string) {
		t.Helper()
		dev := dialV3(t, from.TCP, "van2", persistent3)
		subscribe3(t, dev, "vans/2/cmd", 1, nil)
		dev.Disconnect(100)
		require.Eventually(t, func() bool { _, p := holds(from, "van2"); return p }, 10*time.Second, 10*time.Millisecond)
		publish3(t, dialV3(t, from.TCP, "backend"), "vans/2/cmd", 1, false, body)
		require.Eventually(t, func() bool { return queued(from, "van2") == 1 && from.Sessions.Stats().Backlog == 0 },
			10*time.Second, 10*time.Millisecond)
		var got received
		again := dialV3(t, to.TCP, "van2", persistent3, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add) })
		require.Eventually(t, func() bool { return len(got.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
		require.Equal(t, []string{"vans/2/cmd=" + body}, got.get())
		require.Eventually(t, func() bool { return queued(to, "van2") == 0 && to.Sessions.Stats().Backlog == 0 },
			10*time.Second, 10*time.Millisecond)
		again.Disconnect(100)
	}
	move(a, b, "one")
	leader := c.WaitStreamLeader(t, "KV_"+kvBucket, 10*time.Second)
	c.Stop(leader)
	c.WaitStreamLeader(t, "KV_"+kvBucket, 30*time.Second)
	move(b, a, "two")
}

// With its sessions in a bucket, a QoS 2 publish goes to the core only
// once the bucket holds its QoS2ID: a node killed after the core stored
// the message would otherwise leave the client's resend, on another node,
// nothing to find it by. NATS gone, the ID cannot be stored: the publish
// is refused (PUBREC 0x80), and nothing reaches the core; a QoS 1 publish
// still does.
func TestKVQoS2NotStoredBeforeItsID(t *testing.T) {
	ns := natstest.RunServer(t)
	a := kvNode(t, ns.URL, "gw-a", kvFast)
	expiry := uint32(300)
	dev := dialV5With(t, a.TCP, &paho.Connect{ClientID: "meter-9", KeepAlive: 30, CleanStart: true,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err := dev.Publish(ctx, &paho.Publish{Topic: "meters/9", QoS: 2, Payload: []byte("before")})
	require.NoError(t, err, "NATS up: stored")
	ns.Shutdown()

	r, err := dev.Publish(ctx, &paho.Publish{Topic: "meters/9", QoS: 2, Payload: []byte("during")})
	require.NotNil(t, r, "%v", err)
	require.Equal(t, byte(0x80), r.ReasonCode, "its QoS2ID could not be stored: %v", err)
	_, err = dev.Publish(ctx, &paho.Publish{Topic: "meters/9", QoS: 1, Payload: []byte("qos1")})
	require.NoError(t, err)

	var bodies []string
	for _, m := range readAll(t, a.Store, "meters") {
		bodies = append(bodies, string(m.Body))
	}
	require.Equal(t, []string{"before", "qos1"}, bodies)
}
