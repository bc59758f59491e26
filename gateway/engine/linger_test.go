package engine_test

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// TestLingeringCloseDeliversDisconnect: after its DISCONNECT the engine
// does not reset the connection under a client still writing (here PUBRELs
// for the PUBRECs it got, sent before it reads the DISCONNECT): the client
// writes on without error and then reads the DISCONNECT [MQTT-4.13.2-1].
func TestLingeringCloseDeliversDisconnect(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "tcp", true: "tls"}[secure], func(t *testing.T) {
			l := engine.Listener{Type: "tcp", Addr: "127.0.0.1:0"}
			if secure {
				l.TLS = serverTLS(t, false)
			}
			e, _ := start(t, engine.Options{ReceiveMaximum: 2, Listeners: []engine.Listener{l}})
			addr := e.Addr(map[bool]string{false: "tcp", true: "tls"}[secure]).String()
			var c net.Conn
			if secure {
				cfg := clientTLS(t, "")
				cfg.ServerName = "localhost"
				tc, err := tls.Dial("tcp", addr, cfg)
				require.NoError(t, err)
				t.Cleanup(func() { _ = tc.Close() })
				c = tc
			} else {
				nc, err := net.Dial("tcp", addr)
				require.NoError(t, err)
				t.Cleanup(func() { _ = nc.Close() })
				c = nc
			}
			_, err := c.Write(connectV5("linger"))
			require.NoError(t, err)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
			first, _ := readFrame(t, c)
			require.Equal(t, byte(0x20), first, "CONNACK")
			publish := func(pid byte) {
				t.Helper()
				_, err := c.Write(packet(0x34, str("telemetry/linger"), []byte{0, pid, 0}, []byte("x")))
				require.NoError(t, err)
			}
			publish(1)
			publish(2)
			for pid := byte(1); pid <= 2; pid++ {
				first, body := readFrame(t, c)
				require.Equal(t, byte(0x50), first, "PUBREC")
				require.Equal(t, []byte{0, pid}, body[:2])
			}
			publish(3) // past the Receive Maximum: DISCONNECT 0x93
			require.Eventually(t, func() bool { return !e.HasSession("linger") }, 10*time.Second, time.Millisecond, "the engine ends the connection")
			for i := range 20 {
				_, err := c.Write([]byte{0x62, 2, 0, byte(1 + i%2)})
				require.NoError(t, err, "write %d after the server's DISCONNECT", i)
			}
			require.Equal(t, int64(1), e.Stats().Sockets, "lingering: the socket stays open")
			first, body := readFrame(t, c)
			require.Equal(t, byte(0xE0), first, "DISCONNECT")
			require.Equal(t, byte(0x93), body[0], "Receive Maximum exceeded")
			require.NoError(t, c.Close())
			require.Eventually(t, func() bool { return e.Stats().Sockets == 0 }, 5*time.Second, time.Millisecond,
				"closed once the client closed")
		})
	}
}
