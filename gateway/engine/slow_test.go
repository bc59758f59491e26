package engine_test

import (
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// TestSilentSubscriberDoesNotSlowOthers: a subscriber that stops reading
// (its socket buffers full) while a publisher sends a stream has its QoS 0
// copies dropped past its write queue's bound and, its writes stuck for
// WriteTimeout, is closed; a healthy subscriber of the same topic gets
// every message, in order, meanwhile.
func TestSilentSubscriberDoesNotSlowOthers(t *testing.T) {
	e, addr := start(t, engine.Options{MaxPendingBytes: 64 << 10, WriteTimeout: time.Second})
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	silent, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = silent.Close() })
	_, err = silent.Write(connectV4("silent"))
	require.NoError(t, err)
	require.NoError(t, silent.SetReadDeadline(time.Now().Add(5*time.Second)))
	first, _ := readFrame(t, silent)
	require.Equal(t, byte(0x20), first, "CONNACK")
	sub := append(append([]byte{0x82, 0}, 0, 1), []byte{0, 6, 'l', 'o', 'a', 'd', '/', '#', 0}...) // SUBSCRIBE load/# QoS 0
	sub[1] = byte(len(sub) - 2)
	_, err = silent.Write(sub)
	require.NoError(t, err)
	first, _ = readFrame(t, silent)
	require.Equal(t, byte(0x90), first, "SUBACK")
	// From here on the silent subscriber reads nothing.

	var got inbox
	healthy := dialV3(t, addr, "healthy")
	wait(t, healthy.Subscribe("load/#", 1, got.handler))
	pub := dialV3(t, addr, "pub")
	const n = 3000
	payload := make([]byte, 4096) // 12 MB in all: past the socket buffers
	for i := range n {
		copy(payload, fmt.Sprintf("%06d", i))
		wait(t, pub.Publish("load/x", 1, false, payload))
	}
	require.Eventually(t, func() bool { return len(got.payloads()) == n }, 20*time.Second, 10*time.Millisecond,
		"healthy subscriber got %d of %d", len(got.payloads()), n)
	for i, p := range got.payloads() {
		require.Equal(t, fmt.Sprintf("%06d", i), p[:6], "in order")
	}
	require.Positive(t, e.Stats().Counters["dropped_slow"], "the silent subscriber's copies past its bound")
	require.Eventually(t, func() bool { return !e.Connected("silent") }, 10*time.Second, 10*time.Millisecond,
		"closed after its writes were stuck for WriteTimeout")
}
