package gateway_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// FuzzConnection feeds arbitrary bytes through a real TCP connection into
// a running gateway — as the first bytes of a connection and after a valid
// CONNECT — and checks after each input that the gateway still accepts a
// new client. Seeds: testdata/fuzz/FuzzConnection and the cases below.
func FuzzConnection(f *testing.F) {
	env := gatewaytest.Start(f, gatewaytest.Options{Gateway: gateway.Options{ConnectTimeout: 200 * time.Millisecond}})
	f.Add(false, packet(0x82, []byte{0, 1, 0}, str("a")))
	f.Add(true, packet(0x82, []byte{0, 1, 0}, str("a")))
	f.Add(false, connectV5("f1"))
	f.Add(false, append(connectV4("f2"), packet(0x32, str("t/x"), []byte{0, 1}, []byte("p"))...))
	f.Add(true, packet(0x30, str("a/+"), []byte("x")))
	f.Add(false, []byte{0x10, 0xFF, 0xFF, 0xFF, 0x7F})
	f.Fuzz(func(t *testing.T, afterConnect bool, data []byte) {
		c, err := net.DialTimeout("tcp", env.TCP, 5*time.Second)
		require.NoError(t, err)
		defer c.Close()
		if afterConnect {
			_, err := c.Write(connectV5("fuzz"))
			require.NoError(t, err)
		}
		_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		_, _ = c.Write(data)
		_, _ = io.Copy(io.Discard, c) // until closed or the deadline
		_ = c.Close()

		// Still up: a new client connects and gets CONNACK 0.
		h, err := net.DialTimeout("tcp", env.TCP, 5*time.Second)
		require.NoError(t, err)
		defer h.Close()
		_, err = h.Write(connectV4("fuzz-check"))
		require.NoError(t, err)
		require.NoError(t, h.SetReadDeadline(time.Now().Add(5*time.Second)))
		ack := make([]byte, 4)
		_, err = io.ReadFull(h, ack)
		require.NoError(t, err, "gateway stopped answering after input %x", data)
		require.Equal(t, []byte{0x20, 2, 0, 0}, ack)
	})
}
