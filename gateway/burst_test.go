package gateway_test

import (
	"bufio"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// A QoS 0 subscriber that stops reading for a moment, during a burst of
// ~5 MB, gets all of it afterwards, in order, with the gateway's default
// options: what its socket does not take waits in its write queue, which
// holds up to mqtt.max_pending_writes packets (and 16 MiB). With the old
// default of 256 packets most of the burst was dropped — a new user's
// `mosquitto_sub` behind ten `mosquitto_pub -l` lost four messages of five
// (docs/BENCHMARKS.md, QoS 0 fan-in).
func TestQoS0BurstWaitsForAPausedSubscriber(t *testing.T) {
	const n, size = 20000, 256
	env := gatewaytest.Start(t, gatewaytest.Options{})

	// The subscriber: raw MQTT 3.1.1 over a socket with a small receive
	// buffer, so the kernel holds little of the burst and the rest must
	// wait in the engine.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	sub, err := d.Dial("tcp", env.TCP)
	require.NoError(t, err)
	defer sub.Close()
	subscribe := packet(0x82, []byte{0, 1}, str("burst/#"), []byte{0}) // packet ID 1, QoS 0
	_, err = sub.Write(append(connectV4("burst-sub"), subscribe...))
	require.NoError(t, err)
	r := bufio.NewReaderSize(sub, 64<<10)
	require.NoError(t, sub.SetReadDeadline(time.Now().Add(10*time.Second)))
	first, body := readFrame(t, r)
	require.Equal(t, byte(0x20), first, "CONNACK")
	require.Equal(t, []byte{0, 0}, body)
	first, body = readFrame(t, r)
	require.Equal(t, byte(0x90), first, "SUBACK")
	require.Equal(t, []byte{0, 1, 0}, body)

	pub := dialV3(t, env.TCP, "burst-pub")
	payload := make([]byte, size)
	for i := range n {
		copy(payload, strconv.Itoa(i)+" ")
		tok := pub.Publish("burst/x", 0, false, payload)
		require.True(t, tok.WaitTimeout(10*time.Second))
		require.NoError(t, tok.Error())
	}
	// Every publish has been routed (sent to the subscriber's queue, or
	// dropped) before the subscriber reads a byte.
	e := env.Gateway.Engine()
	require.Eventually(t, func() bool {
		c := e.Stats().Counters
		return c["sent"]+c["dropped_slow"] >= n
	}, 20*time.Second, 10*time.Millisecond)
	require.Zero(t, e.Stats().Counters["dropped_slow"], "QoS 0 messages dropped for the paused subscriber")

	for i := range n {
		require.NoError(t, sub.SetReadDeadline(time.Now().Add(10*time.Second)))
		first, body := readFrame(t, r)
		require.Equal(t, byte(0x30), first, "PUBLISH QoS 0 #%d", i)
		require.Equal(t, []byte{0, 7, 'b', 'u', 'r', 's', 't', '/', 'x'}, body[:9])
		want := strconv.Itoa(i) + " "
		require.Equal(t, want, string(body[9:9+len(want)]), "message %d out of order", i)
	}
}
