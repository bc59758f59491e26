package gateway_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// Shutdown with many live connections (MQTT 3 and 5) returns promptly and
// every client sees its connection closed.
func TestShutdownWithLiveConnections(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	const n = 1000
	conns := make([]net.Conn, 0, n)
	for i := range n {
		c, err := net.Dial("tcp", env.TCP)
		require.NoError(t, err)
		defer c.Close()
		pkt := connectV4("live-" + strconv.Itoa(i))
		if i%2 == 1 {
			pkt = connectV5("live-" + strconv.Itoa(i))
		}
		_, err = c.Write(pkt)
		require.NoError(t, err)
		hdr := make([]byte, 2)
		_, err = io.ReadFull(c, hdr)
		require.NoError(t, err)
		_, err = io.ReadFull(c, make([]byte, hdr[1]))
		require.NoError(t, err)
		conns = append(conns, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, env.Gateway.Shutdown(ctx))
	t.Logf("shutdown with %d connections took %v", n, time.Since(start))
	for _, c := range conns {
		requireClosed(t, c, 5*time.Second)
	}
}
