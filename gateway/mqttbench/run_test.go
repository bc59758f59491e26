package mqttbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/gateway/mqttbench/mqttbenchtest"
)

// syncBuffer is a bytes.Buffer for a progress writer read by the test.
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

// requireComplete checks a pubsub result in which nothing may be lost:
// every message sent was acknowledged and reached every subscriber once.
func requireComplete(t *testing.T, res Result, perPublisher int64) {
	t.Helper()
	sent := perPublisher * int64(res.Publishers)
	require.Equal(t, sent, res.Sent)
	require.Equal(t, sent, res.Acked)
	require.Zero(t, res.Failed)
	require.Positive(t, res.Seconds)
	require.NotNil(t, res.MQTT)
	m := res.MQTT
	require.Equal(t, sent*int64(res.Subscribers), m.Expected)
	require.Equal(t, m.Expected, m.Received, "errors: %v", res.Errors)
	require.Zero(t, m.Lost)
	require.Zero(t, m.Duplicates)
	require.Zero(t, m.Foreign)
	require.Equal(t, uint64(m.Received), m.Latency.N)
	require.Positive(t, m.Latency.P50)
	require.LessOrEqual(t, m.Latency.P50, m.Latency.P99)
	require.LessOrEqual(t, m.Latency.P99, m.Latency.Max)
	require.Positive(t, m.PerSec)
	if res.QoS > 0 {
		require.NotNil(t, res.AckLatency)
		require.Equal(t, uint64(sent), res.AckLatency.N)
		require.Positive(t, res.AckLatency.P50)
	} else {
		require.Nil(t, res.AckLatency)
	}
	require.Empty(t, res.Errors)
}

func TestPubSub(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	for _, c := range []struct {
		name    string
		addr    string
		version int
		qos     byte
	}{
		{"v3 qos0", b.Addr, 3, 0},
		{"v3 qos1", b.Addr, 3, 1},
		{"v3 qos2", b.Addr, 3, 2},
		{"v5 qos0", b.Addr, 5, 0},
		{"v5 qos1", b.Addr, 5, 1},
		{"v3 qos1 websocket", b.WSAddr, 3, 1},
		{"v5 qos1 websocket", b.WSAddr, 5, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var progress syncBuffer
			topic := "t" + strings.ReplaceAll(c.name, " ", "-") + "/dev-%i"
			res, err := Run(t.Context(), Options{Addr: c.addr, Version: c.version, QoS: c.qos, Publishers: 3, Subscribers: 2,
				Count: 150, Inflight: 8, SizeBytes: 64, Topic: topic, ClientPrefix: c.name + "-",
				Progress: &progress, ProgressInterval: 20 * time.Millisecond})
			require.NoError(t, err)
			requireComplete(t, res, 150)
			require.Equal(t, c.version, res.Version)
			require.Contains(t, progress.String(), "pubsub")
			require.Contains(t, progress.String(), "received")
			require.True(t, strings.HasSuffix(progress.String(), "\n"), "the final progress line ends the line")
		})
	}
}

func TestPubSubPaced(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	// A rate and a duration: how many get sent depends on timing, so only
	// the accounting is checked.
	res, err := Run(t.Context(), Options{Addr: b.Addr, QoS: 1, Publishers: 2, Subscribers: 1, Rate: 400,
		Duration: 150 * time.Millisecond, Topic: "paced/%i"})
	require.NoError(t, err)
	require.Positive(t, res.Sent)
	require.Equal(t, res.Sent, res.Acked)
	require.Equal(t, res.Acked, res.MQTT.Received)
	require.Zero(t, res.MQTT.Lost)
}

func TestPubSubCountsForeignPayloads(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	// Retained messages reach each subscriber when it subscribes: one is
	// not a bench payload, one is a bench payload of an earlier run. (At
	// QoS 0: mochi sometimes sends a retained QoS 1 message twice.)
	old := make([]byte, PayloadHeaderBytes)
	EncodePayload(old, Stamp{Publisher: 0, Seq: 0, SentUnixNano: time.Now().Add(-time.Hour).UnixNano()})
	c := paho.NewClient(paho.NewClientOptions().AddBroker(b.Addr).SetClientID("retainer"))
	require.True(t, c.Connect().WaitTimeout(5*time.Second))
	require.NoError(t, c.Publish("foreign/x", 0, true, "21.5 °C").Error())
	tok := c.Publish("foreign/y", 0, true, old)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	c.Disconnect(100)
	// Both are retained once a new subscriber gets them (reading mochi's
	// retained store directly races its writer).
	seen := make(chan string, 4)
	w := paho.NewClient(paho.NewClientOptions().AddBroker(b.Addr).SetClientID("retain-check"))
	require.True(t, w.Connect().WaitTimeout(5*time.Second))
	require.True(t, w.Subscribe("foreign/#", 0, func(_ paho.Client, m paho.Message) { seen <- m.Topic() }).WaitTimeout(5*time.Second))
	for range 2 {
		select {
		case <-seen:
		case <-time.After(5 * time.Second):
			t.Fatal("retained messages not stored")
		}
	}
	w.Disconnect(100)

	res, err := Run(t.Context(), Options{Addr: b.Addr, QoS: 1, Publishers: 2, Subscribers: 2, Count: 50, Topic: "foreign/%i"})
	require.NoError(t, err)
	require.Equal(t, int64(200), res.MQTT.Received)
	require.Equal(t, int64(4), res.MQTT.Foreign, "two retained messages at each of two subscribers")
	require.Zero(t, res.MQTT.Lost)
}

func TestPubSubSubscriberLosesMessages(t *testing.T) {
	// The broker drops every 10th message on its way to subscribers.
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{Uplink: &dropHook{every: 10}})
	res, err := Run(t.Context(), Options{Addr: b.Addr, QoS: 1, Publishers: 2, Subscribers: 1, Count: 100,
		Topic: "lossy/%i", Drain: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, int64(200), res.Acked)
	require.Equal(t, int64(200), res.MQTT.Expected)
	require.Equal(t, int64(180), res.MQTT.Received)
	require.Equal(t, int64(20), res.MQTT.Lost)
	require.InDelta(t, 10.0, res.MQTT.LossPct, 1e-9)
}

// Pairs: subscriber i subscribes to publisher i's topic only, so each
// message is expected once in all, and nobody gets another pair's.
func TestPubSubPairs(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	res, err := Run(t.Context(), Options{Addr: b.Addr, QoS: 1, Publishers: 4, Subscribers: 4, Count: 50,
		Topic: "p2p/%i", Filter: "p2p/%i"})
	require.NoError(t, err)
	require.Equal(t, int64(200), res.Acked)
	require.Equal(t, int64(200), res.MQTT.Expected, "each message once, by its pair")
	require.Equal(t, int64(200), res.MQTT.Received)
	require.Zero(t, res.MQTT.Duplicates)

	_, err = Run(t.Context(), Options{Addr: b.Addr, Publishers: 2, Subscribers: 3, Topic: "p2p/%i", Filter: "p2p/%i"})
	require.ErrorIs(t, err, ErrInvalidOptions, "pairs need as many subscribers as publishers")
}

// A subscriber that never reads: the run still measures the others, and
// says whether the broker cut it off (mochi's test broker keeps it: its
// outbound queue is large, so 0 of 1 here).
func TestPubSubSlowSubscriber(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	res, err := Run(t.Context(), Options{Addr: b.Addr, QoS: 1, Publishers: 2, Subscribers: 1, Count: 200, SizeBytes: 1024,
		Topic: "slow/%i", SlowSubscribers: 1})
	require.NoError(t, err)
	require.Equal(t, 1, res.SlowSubscribers)
	require.Equal(t, int64(400), res.MQTT.Received, "the fast subscriber got everything")
	require.Zero(t, res.SlowDisconnected)

}

// disconnected tells a connection the server closed from one it holds.
func TestSlowSubscribersDisconnected(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var s slowSubs
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		s.conns = append(s.conns, c)
	}
	defer s.close()
	first, err := ln.Accept()
	require.NoError(t, err)
	second, err := ln.Accept()
	require.NoError(t, err)
	defer second.Close()
	_, err = second.Write([]byte("queued, unread"))
	require.NoError(t, err)
	require.Zero(t, s.disconnected())
	require.NoError(t, first.Close())
	require.Eventually(t, func() bool { return s.disconnected() == 1 }, 5*time.Second, 10*time.Millisecond)
}

// dropHook makes the broker drop every n-th publish it receives, after
// acknowledging it.
type dropHook struct {
	mu    sync.Mutex
	every int
	n     int
}

func (h *dropHook) Publish(*engine.Client, *engine.Message, func(engine.Result)) (engine.Decision, engine.Result) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n++
	if h.n%h.every == 0 {
		return engine.Consume, engine.Result{} // acknowledged, not delivered
	}
	return engine.Deliver, engine.Result{}
}

// coreBridge stands in for ferrymq's bridge: it stores every publish in a
// core topic, the way the MQTT bridge does, and delivers it.
type coreBridge struct {
	broker core.Broker
	topic  string
}

func (h *coreBridge) Publish(c *engine.Client, pk *engine.Message, _ func(engine.Result)) (engine.Decision, engine.Result) {
	m := &core.Message{Topic: h.topic, ShardingKey: c.ID(), Body: bytes.Clone(pk.Payload)}
	h.broker.ProduceAsync([]*core.Message{m}, func([]core.SendResult, error) {})
	return engine.Deliver, engine.Result{}
}

func TestPubSubCoreConsumer(t *testing.T) {
	for _, exists := range []bool{true, false} {
		t.Run(fmt.Sprintf("topic exists=%v", exists), func(t *testing.T) {
			env := servertest.Start(t, servertest.Options{})
			if exists {
				// A message from before the run is skipped.
				_, err := env.Store.Produce(t.Context(), &core.Message{Topic: "devices", Body: []byte("earlier")})
				require.NoError(t, err)
			}
			b := mqttbenchtest.Start(t, mqttbenchtest.Options{Uplink: &coreBridge{broker: env.Store, topic: "devices"}})
			var progress syncBuffer
			res, err := Run(t.Context(), Options{Addr: b.Addr, QoS: 1, Publishers: 3, Subscribers: 1, Count: 100,
				Topic: "dev/%i", Core: CoreOptions{Addr: env.Addr, Topic: "devices", Group: "bench-backend"},
				Progress: &progress, ProgressInterval: 20 * time.Millisecond})
			require.NoError(t, err)
			requireComplete(t, res, 100)
			require.NotNil(t, res.Core)
			require.Equal(t, int64(300), res.Core.Expected, "a group receives each message once")
			require.Equal(t, int64(300), res.Core.Received, "errors: %v", res.Errors)
			require.Zero(t, res.Core.Foreign, "the earlier message is not consumed")
			require.Zero(t, res.Core.Duplicates)
			require.Positive(t, res.Core.Latency.P50)
			require.Contains(t, progress.String(), "core")
		})
	}
}

func TestPubSubOnlyCore(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{Uplink: &coreBridge{broker: env.Store, topic: "devices"}})
	res, err := Run(t.Context(), Options{Addr: b.Addr, QoS: 0, Publishers: 2, Count: 50, Topic: "dev/%i",
		Core: CoreOptions{Addr: env.Addr, Topic: "devices", Group: "g"}})
	require.NoError(t, err)
	require.Nil(t, res.MQTT)
	require.Equal(t, int64(100), res.Core.Received)
}

func TestPubSubFailsToConnect(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	addr := b.Addr
	require.NoError(t, b.Engine.Shutdown(t.Context()))
	_, err := Run(t.Context(), Options{Addr: addr, Publishers: 2, Subscribers: 1, Count: 1, ConnectTimeout: time.Second})
	require.ErrorContains(t, err, "subscribers: connect")
}

func TestPubSubStopsWithContext(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	res, err := Run(ctx, Options{Addr: b.Addr, QoS: 1, Publishers: 2, Subscribers: 1, Duration: time.Hour, Topic: "cancel/%i"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Positive(t, res.Sent)
	require.LessOrEqual(t, res.Acked, res.Sent)
}

func TestConnectStorm(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	var progress syncBuffer
	res, err := Run(t.Context(), Options{Mode: ModeConnect, Addr: b.Addr, Conns: 200, Workers: 8,
		Progress: &progress, ProgressInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	c := res.Conns
	require.NotNil(t, c)
	require.Equal(t, 200, c.Asked)
	require.Equal(t, int64(200), c.Connected, "errors: %v", res.Errors)
	require.Zero(t, c.Failed)
	require.Equal(t, uint64(200), c.Latency.N)
	require.Positive(t, c.Latency.P50)
	require.Positive(t, c.PerSec)
	require.Zero(t, c.Held, "closed at once without --hold")
	require.Contains(t, progress.String(), "connected")
	require.Eventually(t, func() bool { return b.Engine.Stats().Connected == 0 }, 5*time.Second, 10*time.Millisecond,
		"every connection is closed when Run returns")
}

func TestConnectStormCountsRefusals(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{Auth: &refuseHook{}})
	res, err := Run(t.Context(), Options{Mode: ModeConnect, Addr: b.Addr, Conns: 20, Workers: 4, ClientPrefix: "c"})
	require.NoError(t, err)
	require.Equal(t, int64(10), res.Conns.Connected)
	require.Equal(t, int64(10), res.Conns.Failed)
	require.Len(t, res.Errors, 1)
	require.Contains(t, res.Errors[0].Err, "return code 5 (not authorized)")
	require.Equal(t, int64(10), res.Errors[0].Count)
}

// refuseHook refuses clients whose identifier ends in an odd digit.
type refuseHook struct{}

func (*refuseHook) Authenticate(_ context.Context, ci *engine.ConnectInfo) (engine.Identity, error) {
	if (ci.ClientID[len(ci.ClientID)-1]-'0')%2 == 0 {
		return engine.Identity{}, nil
	}
	return engine.Identity{}, &engine.Refusal{Code: engine.NotAuthorized, Reason: "odd"}
}

func TestIdleHold(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	var progress syncBuffer
	res, err := Run(t.Context(), Options{Mode: ModeIdle, Addr: b.Addr, Conns: 100, Hold: 300 * time.Millisecond,
		KeepAlive: 200 * time.Millisecond, Progress: &progress, ProgressInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	c := res.Conns
	require.Equal(t, int64(100), c.Connected, "errors: %v", res.Errors)
	require.Equal(t, 100, c.Held)
	require.Equal(t, 100, c.Alive, "PINGREQs keep them alive past 1.5 × keepalive")
	require.Positive(t, c.HeldSeconds)
	require.Contains(t, progress.String(), fmt.Sprintf(HoldingLine, 100)+"\n")
	require.Eventually(t, func() bool { return b.Engine.Stats().Connected == 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestIdleHoldUntilCancelled(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	progress := &holdWatcher{holding: make(chan struct{})}
	done := make(chan Result)
	go func() {
		res, err := Run(ctx, Options{Mode: ModeIdle, Addr: b.Addr, Conns: 50, Progress: progress})
		require.NoError(t, err, "ending ctx ends a hold without a duration")
		done <- res
	}()
	<-progress.holding
	require.Equal(t, int64(50), b.Engine.Stats().Connected)
	// The broker closes some: they are not alive at the end.
	n := 0
	for _, ci := range b.Engine.Clients() {
		if n == 5 {
			break
		}
		require.NoError(t, b.Engine.Disconnect(ci.ID, engine.AdministrativeAction, "kicked"))
		n++
	}
	require.Eventually(t, func() bool { return b.Engine.Stats().Sockets == 45 }, 5*time.Second, 5*time.Millisecond,
		"the kicked clients saw their connection close (Disconnect only asks; the engine lingers until they close)")
	cancel()
	res := <-done
	require.Equal(t, 50, res.Conns.Held)
	require.Equal(t, 45, res.Conns.Alive)
}

// holdWatcher closes holding when the holding line is written.
type holdWatcher struct {
	once    sync.Once
	holding chan struct{}
}

func (w *holdWatcher) Write(p []byte) (int, error) {
	if strings.Contains(string(p), "holding") {
		w.once.Do(func() { close(w.holding) })
	}
	return len(p), nil
}

func TestResultJSON(t *testing.T) {
	r := Result{Mode: ModePubSub, Addr: "tcp://x:1", QoS: 1, AckLatency: &Latency{N: 3, P50: 1500 * time.Nanosecond, P99: 2 * time.Millisecond, Max: time.Second},
		MQTT: &Delivery{Expected: 3, Received: 3}}
	b, err := json.Marshal(r)
	require.NoError(t, err)
	require.Contains(t, string(b), `"ack_latency":{"n":3,"p50_us":1.5,"p99_us":2000,"p999_us":0,"max_us":1000000}`)
	var back Result
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, *r.AckLatency, *back.AckLatency)
}

func TestRunRejectsBadOptions(t *testing.T) {
	_, err := Run(t.Context(), Options{QoS: 7})
	require.ErrorIs(t, err, ErrInvalidOptions)
	for _, o := range []Options{{Mode: ModeConnect, Conns: 1 << 30}, {Publishers: 1 << 23}} {
		_, err = Run(t.Context(), o)
		require.ErrorIs(t, err, ErrInvalidOptions)
		require.ErrorContains(t, err, "file descriptors")
	}
}
