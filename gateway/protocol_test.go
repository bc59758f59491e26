package gateway_test

import (
	"context"
	"io"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// readPacket reads one MQTT packet with a 1-byte remaining length.
func readPacket(t *testing.T, c io.Reader) []byte {
	t.Helper()
	hdr := make([]byte, 2)
	_, err := io.ReadFull(c, hdr)
	require.NoError(t, err)
	body := make([]byte, hdr[1])
	_, err = io.ReadFull(c, body)
	require.NoError(t, err)
	return append(hdr, body...)
}

// An MQTT 3 client only ever sees CONNACK return codes 0–5 (3.1.1 Table
// 3.1), even where mochi would answer with an MQTT 5 reason code (here 0x80
// for a persistent session without a client ID). A refusal has Session
// Present 0 [MQTT-3.2.2-4] and the connection is closed after it
// [MQTT-3.2.2-5].
func TestV3ConnackCodesStayV3(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	c := rawConn(t, env.TCP, nil)
	_, err := c.Write(packet(0x10, str("MQTT"), []byte{4, 0x00, 0, 60}, str(""))) // clean session 0, empty ID
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	ack := readPacket(t, c)
	require.Equal(t, byte(0x20), ack[0])
	require.Len(t, ack, 4, "an MQTT 3 CONNACK has no properties")
	require.NotZero(t, ack[3])
	require.LessOrEqual(t, ack[3], byte(5), "return code %#x", ack[3])
	require.Zero(t, ack[2], "session present")
	requireClosed(t, c, 10*time.Second)
	healthy(t, env)
}

// MQTT 5 clients asking for no keepalive, or for more than the cap, are
// told the cap in CONNACK (Server Keep Alive, property 0x13), which they
// must use [MQTT-3.2.2-21].
func TestKeepaliveCapped(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Gateway: gateway.Options{MaxKeepalive: 30}})
	for _, ka := range [][2]byte{{0, 0}, {0xFF, 0xFF}} {
		c := rawConn(t, env.TCP, nil)
		_, err := c.Write(packet(0x10, str("MQTT"), []byte{5, 0x02, ka[0], ka[1], 0}, str("ka")))
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		ack := readPacket(t, c)
		require.Equal(t, byte(0), ack[3], "CONNACK success")
		require.Contains(t, string(ack[5:]), string([]byte{0x13, 0, 30}), "server keepalive 30 s")
		_ = c.Close()
	}
}

// MQTT 3.1 ("MQIsdp", level 3) clients are served too.
func TestMQTT31(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	c := dialV3(t, env.TCP, "old-car", func(o *paho3.ClientOptions) { o.SetProtocolVersion(3) })
	tok := c.Publish("telemetry/old-car", 1, false, "v3.1")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	require.Equal(t, []string{"v3.1"}, byKey(readAll(t, env.Store, "telemetry"))["old-car"])
}

// Shutdown publishes the wills of the clients it disconnects
// [MQTT-3.1.2-8], and they reach the core before the gateway says it is
// done.
func TestShutdownBridgesWills(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	dialV3(t, env.TCP, "car-w", func(o *paho3.ClientOptions) {
		o.SetWill("status/car-w", "offline", 1, false)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, env.Gateway.Shutdown(ctx))
	require.Equal(t, []string{"offline"}, byKey(readAll(t, env.Store, "status"))["car-w"])
}

// The bridge acknowledges QoS 1/2 publishes itself (once durable), so it
// must count them against the Receive Maximum it announced: an MQTT 5
// client that sends more QoS 1/2 publishes than that without waiting for
// PUBACK/PUBCOMP gets DISCONNECT 0x93 [MQTT-3.3.4-7] (MQTT 5 §3.2.2.3.3,
// §4.9) and the connection is closed [MQTT-4.13.1-1]; the quota comes back
// with each PUBACK and PUBCOMP. (Paho interoperability test_flow_control2;
// docs/conformance.md. TestLingeringCloseDeliversDisconnect: a client that
// keeps writing still reads the DISCONNECT.)
func TestReceiveMaximumEnforced(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Gateway: gateway.Options{ReceiveMaximum: 2}})
	c := rawConn(t, env.TCP, connectV5("flow"))
	publish := func(qos byte, id uint16) {
		t.Helper()
		_, err := c.Write(packet(0x30|qos<<1, str("telemetry/flow"), []byte{byte(id >> 8), byte(id), 0}, []byte("x")))
		require.NoError(t, err)
	}
	expect := func(typ byte, id uint16) {
		t.Helper()
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		p := readPacket(t, c)
		require.Equal(t, typ, p[0]&0xF0, "packet %x", p)
		require.Equal(t, []byte{byte(id >> 8), byte(id)}, p[2:4])
	}

	// QoS 1: each PUBACK gives the quota back.
	for id := uint16(1); id <= 5; id++ {
		publish(1, id)
		expect(0x40, id)
	}
	// QoS 2: the quota comes back at PUBCOMP, not at PUBREC.
	for round := uint16(0); round < 2; round++ {
		publish(2, 10+round*2)
		publish(2, 11+round*2)
		expect(0x50, 10+round*2)
		expect(0x50, 11+round*2)
		for _, id := range []uint16{10 + round*2, 11 + round*2} {
			_, err := c.Write([]byte{0x62, 2, byte(id >> 8), byte(id)})
			require.NoError(t, err)
			expect(0x70, id)
		}
	}
	// Two QoS 2 publishes left at PUBREC, then a third: over the maximum.
	publish(2, 20)
	publish(2, 21)
	expect(0x50, 20)
	expect(0x50, 21)
	publish(2, 22)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	p := readPacket(t, c)
	require.Equal(t, byte(0xE0), p[0], "DISCONNECT, got %x", p)
	require.Equal(t, byte(0x93), p[2], "Receive Maximum exceeded")
	requireClosed(t, c, 5*time.Second)
	healthy(t, env)
}
