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

// An MQTT 3 client only ever sees CONNACK return codes 0–5, even where
// mochi would answer with an MQTT 5 reason code (here 0x80 for a
// persistent session without a client ID).
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
	healthy(t, env)
}

// MQTT 5 clients asking for no keepalive, or for more than the cap, are
// told the cap in CONNACK (Server Keep Alive, property 0x13).
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

// Shutdown publishes the wills of the clients it disconnects, and they
// reach the core before the gateway says it is done.
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
