package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// Issue #21: a 4 MiB message body (core.MaxBodyBytes) through MQTT with the
// default settings, both ways, and a clear refusal past the limits.

// bigBody is n bytes of a pattern seeded by seed, so that a cut, shifted or
// mixed-up payload shows.
func bigBody(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return b
}

// publishPayload is the payload length that makes a QoS 1 PUBLISH to topic
// exactly packet bytes long (fixed header with a 4-byte remaining length,
// topic, packet identifier and, for MQTT 5, an empty property block).
func publishPayload(packet int, topic string, v5 bool) int {
	n := packet - 1 - 4 - (2 + len(topic)) - 2
	if v5 {
		n--
	}
	return n
}

// publishAsyncV5 publishes p on its own goroutine; the channel gets the result.
func publishAsyncV5(ctx context.Context, c *paho.Client, p *paho.Publish) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Publish(ctx, p)
		done <- err
	}()
	return done
}

func TestDefaultMaxPacketIsTheCoreMessageLimit(t *testing.T) {
	require.Equal(t, core.DefaultMaxMessageBytes, engine.DefaultMaxPacketBytes,
		"the MQTT packet limit and the engines' message limit are one number")
}

// TestFourMiBUplink: with the default options a 4 MiB payload published at
// QoS 1 over MQTT 3.1.1 (TCP and WebSocket) and MQTT 5 (with user
// properties) is acknowledged and in the core whole, under the device's
// key, with the MQTT metadata; MQTT 5 clients are told the Maximum Packet
// Size in CONNACK.
func TestFourMiBUplink(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})

	v3 := dialV3(t, env.TCP, "car-v3")
	tok := v3.Publish("telemetry/car-v3", 1, false, bigBody(core.MaxBodyBytes, 3))
	require.True(t, tok.WaitTimeout(30*time.Second), "PUBACK of a 4 MiB MQTT 3.1.1 publish")
	require.NoError(t, tok.Error())

	ws := dialV3(t, env.WS, "car-ws", func(o *paho3.ClientOptions) {
		o.Servers = nil
		o.AddBroker("ws://" + env.WS + "/mqtt")
	})
	tok = ws.Publish("telemetry/car-ws", 1, false, bigBody(core.MaxBodyBytes, 7))
	require.True(t, tok.WaitTimeout(30*time.Second), "PUBACK of a 4 MiB MQTT 3.1.1 publish over WebSocket")
	require.NoError(t, tok.Error())

	conn, err := net.DialTimeout("tcp", env.TCP, 5*time.Second)
	require.NoError(t, err)
	v5 := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ca, err := v5.Connect(ctx, &paho.Connect{ClientID: "car-v5", KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = v5.Disconnect(&paho.Disconnect{})
		<-v5.Done()
	})
	require.NotNil(t, ca.Properties.MaximumPacketSize, "CONNACK announces the Maximum Packet Size [MQTT-3.2.2-15]")
	require.Equal(t, uint32(core.DefaultMaxMessageBytes), *ca.Properties.MaximumPacketSize)
	res, err := v5.Publish(ctx, &paho.Publish{Topic: "telemetry/car-v5", QoS: 1, Payload: bigBody(core.MaxBodyBytes, 5),
		Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "fw", Value: "1.2"}}, ContentType: "application/octet-stream"}})
	require.NoError(t, err)
	require.Equal(t, byte(0), res.ReasonCode)

	for _, c := range []struct {
		id   string
		seed byte
	}{{"car-v3", 3}, {"car-ws", 7}, {"car-v5", 5}} {
		var got *core.StoredMessage
		for _, sm := range readAll(t, env.Store, "telemetry") {
			if sm.ShardingKey == c.id {
				got = &sm
			}
		}
		require.NotNil(t, got, "%s: in the core", c.id)
		require.True(t, bytes.Equal(bigBody(core.MaxBodyBytes, c.seed), got.Body), "%s: the body whole", c.id)
		require.Equal(t, "telemetry/"+c.id, got.Properties[bridge.PropTopic])
	}
}

// TestFourMiBDownlink: a 4 MiB command reaches an MQTT 3.1.1 subscriber
// and an MQTT 5 client (point to point) whole, and both receipts say
// delivered.
func TestFourMiBDownlink(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	got3 := make(chan []byte, 1)
	v3 := dialV3(t, env.TCP, "car42")
	tok := v3.Subscribe("cars/car42/cmd", 1, func(_ paho3.Client, m paho3.Message) { got3 <- m.Payload() })
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	got5 := make(chan []byte, 1)
	dialV5(t, env.TCP, "car7", func(p paho.PublishReceived) (bool, error) {
		got5 <- p.Packet.Payload
		return true, nil
	})

	id3 := command(t, env, "car42", string(bigBody(core.MaxBodyBytes, 1)), map[string]string{bridge.PropTopic: "cars/car42/cmd"})
	id5 := command(t, env, "car7", string(bigBody(core.MaxBodyBytes, 2)), map[string]string{bridge.PropClientID: "car7"})
	for _, w := range []struct {
		ch   chan []byte
		seed byte
	}{{got3, 1}, {got5, 2}} {
		select {
		case b := <-w.ch:
			require.True(t, bytes.Equal(bigBody(core.MaxBodyBytes, w.seed), b), "the command whole (%d bytes)", len(b))
		case <-time.After(30 * time.Second):
			require.FailNow(t, "a 4 MiB command did not arrive")
		}
	}
	require.Eventually(t, func() bool {
		rs := receipts(t, env)
		return rs[id3].Outcome == bridge.OutcomeDelivered && rs[id5].Outcome == bridge.OutcomeDelivered
	}, 10*time.Second, 10*time.Millisecond, "delivered receipts")
}

// TestFourMiBToOfflineSession: a 4 MiB command for a device offline with a
// persistent session is queued (the default offline bound holds it),
// survives a restart of the gateway in the session store, and arrives
// whole when the device returns.
func TestFourMiBToOfflineSession(t *testing.T) {
	dir := t.TempDir()
	env := gatewaytest.Start(t, gatewaytest.Options{Dir: dir, Sessions: true})
	persistent := func(o *paho3.ClientOptions) { o.SetCleanSession(false) }
	c := dialV3(t, env.TCP, "car9", persistent)
	tok := c.Subscribe("cars/car9/cmd", 1, nil)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	c.Disconnect(100)

	id := command(t, env, "car9", string(bigBody(core.MaxBodyBytes, 9)), map[string]string{bridge.PropTopic: "cars/car9/cmd"})
	require.Eventually(t, func() bool { return queued(env, "car9") == 1 }, 10*time.Second, 10*time.Millisecond,
		"the command is queued for the offline car, not dropped")
	env.Stop(t)

	env = gatewaytest.Start(t, gatewaytest.Options{Dir: dir, Sessions: true})
	got := make(chan []byte, 1)
	dialV3(t, env.TCP, "car9", persistent, func(o *paho3.ClientOptions) {
		o.SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got <- m.Payload() })
	})
	select {
	case b := <-got:
		require.True(t, bytes.Equal(bigBody(core.MaxBodyBytes, 9), b), "the command whole (%d bytes)", len(b))
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the queued 4 MiB command did not arrive")
	}
	require.Eventually(t, func() bool { return receipts(t, env)[id].Outcome == bridge.OutcomeDelivered },
		10*time.Second, 10*time.Millisecond)
}

// TestAboveMaxPacketRefused: a PUBLISH one byte over the default maximum
// packet size ends its connection — MQTT 5 with DISCONNECT 0x95 Packet too
// large [MQTT-3.2.2-15] (MQTT 5 §3.14.2.1), MQTT 3.1.1 by closing it
// [MQTT-4.8.0-1] — from the fixed header, before the body is read; nothing
// is stored and the other clients carry on. A packet within the limit
// whose core message exceeds store.max_message_bytes gets 0x95 too, from
// the bridge, with the store's error (both sizes) as the reason string.
func TestAboveMaxPacketRefused(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	check := bystanders(t, env.TCP)
	over := engine.DefaultMaxPacketBytes + 1

	t.Run("MQTT 5 over max packet", func(t *testing.T) {
		disc := make(chan *paho.Disconnect, 1)
		c := dialV5With(t, env.TCP, &paho.Connect{ClientID: "big-v5", KeepAlive: 30, CleanStart: true}, func(cfg *paho.ClientConfig) {
			cfg.OnServerDisconnect = func(d *paho.Disconnect) { disc <- d }
		})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		payload := bigBody(publishPayload(over, "telemetry/big-v5", true), 1)
		published := publishAsyncV5(ctx, c, &paho.Publish{Topic: "telemetry/big-v5", QoS: 1, Payload: payload})
		select {
		case d := <-disc:
			require.Equal(t, byte(engine.PacketTooLarge), d.ReasonCode, "DISCONNECT 0x95")
		case <-time.After(10 * time.Second):
			require.FailNow(t, "no DISCONNECT")
		}
		cancel() // paho waits for an ack that cannot come
		require.Error(t, <-published, "no PUBACK")
	})

	t.Run("MQTT 3.1.1 over max packet", func(t *testing.T) {
		lost := make(chan error, 1)
		c := dialV3(t, env.TCP, "big-v3", func(o *paho3.ClientOptions) {
			o.SetConnectionLostHandler(func(_ paho3.Client, err error) { lost <- err })
		})
		c.Publish("telemetry/big-v3", 1, false, bigBody(publishPayload(over, "telemetry/big-v3", false), 2))
		select {
		case <-lost:
		case <-time.After(20 * time.Second):
			require.FailNow(t, "the connection was not closed")
		}
	})

	t.Run("MQTT 5 within max packet, over the store's limit", func(t *testing.T) {
		disc := make(chan *paho.Disconnect, 1)
		c := dialV5With(t, env.TCP, &paho.Connect{ClientID: "c5", KeepAlive: 30, CleanStart: true}, func(cfg *paho.ClientConfig) {
			cfg.OnServerDisconnect = func(d *paho.Disconnect) { disc <- d }
		})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		// 40 bytes under the packet limit: the core record (header, topic,
		// key, the mqtt.* properties) is over the store's.
		payload := bigBody(core.DefaultMaxMessageBytes-40, 3)
		published := publishAsyncV5(ctx, c, &paho.Publish{Topic: "telemetry/c5", QoS: 1, Payload: payload})
		select {
		case d := <-disc:
			require.Equal(t, byte(engine.PacketTooLarge), d.ReasonCode, "DISCONNECT 0x95")
			require.NotNil(t, d.Properties)
			require.Contains(t, d.Properties.ReasonString, "message too large")
			require.Contains(t, d.Properties.ReasonString, fmt.Sprintf("limit %d", core.DefaultMaxMessageBytes))
		case <-time.After(10 * time.Second):
			require.FailNow(t, "no DISCONNECT")
		}
		cancel()
		require.Error(t, <-published, "no PUBACK")
	})

	for _, m := range readAll(t, env.Store, "telemetry") {
		require.Less(t, len(m.Body), core.MaxBodyBytes, "nothing of the refused publishes is stored: %s", m.ShardingKey)
	}
	check()
	healthy(t, env)
}

// TestFourMiBHeldForAClientNotYetSeen: a 4 MiB point-to-point command for
// a client ID with no session here is held (the default per-client bound
// holds it) and handed over when the client connects.
func TestFourMiBHeldForAClientNotYetSeen(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	ids := []string{
		command(t, env, "car11", string(bigBody(core.MaxBodyBytes, 11)), map[string]string{bridge.PropClientID: "car11"}),
		command(t, env, "car11", string(bigBody(core.MaxBodyBytes, 12)), map[string]string{bridge.PropClientID: "car11"}),
	}
	require.Eventually(t, func() bool { return downlinkCount(t, env, "held") == 2 }, 10*time.Second, 10*time.Millisecond,
		"both commands are held, neither dropped")
	got := make(chan []byte, 2)
	dialV3(t, env.TCP, "car11", func(o *paho3.ClientOptions) {
		o.SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got <- m.Payload() })
	})
	for _, seed := range []byte{11, 12} {
		select {
		case b := <-got:
			require.True(t, bytes.Equal(bigBody(core.MaxBodyBytes, seed), b), "the command whole (%d bytes)", len(b))
		case <-time.After(30 * time.Second):
			require.FailNow(t, "a held 4 MiB command did not arrive")
		}
	}
	require.Eventually(t, func() bool {
		rs := receipts(t, env)
		return rs[ids[0]].Outcome == bridge.OutcomeDelivered && rs[ids[1]].Outcome == bridge.OutcomeDelivered
	}, 10*time.Second, 10*time.Millisecond)
}

// downlinkCount reads ferrymq_downlink_messages_total{outcome} from the
// gateway's registry.
func downlinkCount(t testing.TB, env *gatewaytest.Env, outcome string) float64 {
	t.Helper()
	mfs, err := env.Gateway.Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "ferrymq_downlink_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestFourMiBQueuedInTheSessionBucket: with sessions in a NATS key-value
// bucket (a real nats-server with the max_payload ferrymq documents), a
// 4 MiB message queued for an offline device on node A is written to the
// bucket whole, and the device gets it whole from node B.
func TestFourMiBQueuedInTheSessionBucket(t *testing.T) {
	ns := natstest.RunServer(t)
	a := kvNode(t, ns.URL, "gw-a", kvFast)
	b := kvNode(t, ns.URL, "gw-b", kvFast)
	dev := dialV3(t, a.TCP, "car1", persistent3)
	subscribe3(t, dev, "cars/car1/cmd", 1, nil)
	dev.Disconnect(100)
	require.Eventually(t, func() bool { _, p := holds(a, "car1"); return p }, 10*time.Second, 10*time.Millisecond, "parked on A")

	tok := dialV3(t, a.TCP, "backend-a").Publish("cars/car1/cmd", 1, false, bigBody(core.MaxBodyBytes, 4))
	require.True(t, tok.WaitTimeout(30*time.Second))
	require.NoError(t, tok.Error())
	require.Eventually(t, func() bool { return queued(a, "car1") == 1 && a.Sessions.Stats().Backlog == 0 },
		10*time.Second, 10*time.Millisecond, "queued on A, in the bucket")
	require.Empty(t, a.Sessions.Stats().WriteErrors, "no write refused")

	got := make(chan []byte, 1)
	dialV3(t, b.TCP, "car1", persistent3, func(o *paho3.ClientOptions) {
		o.SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got <- m.Payload() })
	})
	select {
	case p := <-got:
		require.True(t, bytes.Equal(bigBody(core.MaxBodyBytes, 4), p), "the message whole (%d bytes)", len(p))
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the 4 MiB message queued in the bucket did not arrive")
	}
}
