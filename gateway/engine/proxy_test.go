package engine_test

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// remotes records the Remote of every CONNECT it is asked about.
type remotes struct {
	mu   sync.Mutex
	seen map[string]string // client ID → remote
}

func (r *remotes) Authenticate(_ context.Context, ci *engine.ConnectInfo) (engine.Identity, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[ci.ClientID] = ci.Remote
	return engine.Identity{Username: ci.Username}, nil
}

func (r *remotes) of(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[id]
}

// TestProxyProtocol: a listener with ProxyProtocol takes the client's
// address from a PROXY v1 or v2 header — what authentication (and so ACL
// templates, logs and presence events) sees — keeps the socket's peer for
// LOCAL/UNKNOWN headers (a load balancer's health check), accepts a header
// that arrives a byte at a time, and closes a connection without one.
func TestProxyProtocol(t *testing.T) {
	r := &remotes{seen: map[string]string{}}
	e, _ := start(t, engine.Options{Hooks: engine.Hooks{Auth: r},
		Listeners: []engine.Listener{{Type: "tcp", Addr: "127.0.0.1:0", ProxyProtocol: true}}})
	addr := e.Addr("tcp").String()
	v2 := func(cmd byte, fam byte, a []byte) []byte {
		b := []byte("\r\n\r\n\x00\r\nQUIT\n")
		b = append(b, 0x20|cmd, fam)
		b = binary.BigEndian.AppendUint16(b, uint16(len(a)+3))
		b = append(b, a...)
		return append(b, 0x04, 0, 0) // a TLV (PP2_TYPE_NOOP, empty): ignored
	}
	ip6 := net.ParseIP("2001:db8::7").To16()
	cases := []struct {
		name, id string
		header   []byte
		want     string // "" : the socket's peer
	}{
		{"v1 TCP4", "p1", []byte("PROXY TCP4 203.0.113.7 198.51.100.1 40001 1883\r\n"), "203.0.113.7:40001"},
		{"v1 TCP6", "p2", []byte("PROXY TCP6 2001:db8::7 2001:db8::1 40002 1883\r\n"), "[2001:db8::7]:40002"},
		{"v1 UNKNOWN", "p3", []byte("PROXY UNKNOWN\r\n"), ""},
		{"v2 IPv4", "p4", v2(1, 0x11, []byte{203, 0, 113, 8, 198, 51, 100, 1, 0x9C, 0x44, 0x07, 0x5B}), "203.0.113.8:40004"},
		{"v2 IPv6", "p5", v2(1, 0x21, append(append(append([]byte{}, ip6...), ip6...), 0x9C, 0x45, 0x07, 0x5B)), "[2001:db8::7]:40005"},
		{"v2 LOCAL", "p6", v2(0, 0x00, nil), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			msg := append(append([]byte{}, tc.header...), connectV4(tc.id)...)
			for i := range msg { // a byte at a time
				_, err := c.Write(msg[i : i+1])
				require.NoError(t, err)
			}
			require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
			typ, _ := readFrame(t, c)
			require.Equal(t, byte(0x20), typ, "CONNACK")
			want := tc.want
			if want == "" {
				want = c.LocalAddr().String() // the engine's peer is our local address
			}
			require.Equal(t, want, r.of(tc.id))
		})
	}
	t.Run("no header", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		_, err = c.Write(connectV4("p7"))
		require.NoError(t, err)
		require.Empty(t, closedWithin(t, c, 5*time.Second), "closed, nothing sent")
		require.Empty(t, r.of("p7"), "never reached authentication")
	})
	t.Run("v1 line too long", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		_, err = c.Write([]byte("PROXY TCP4 " + string(make([]byte, 200))))
		require.NoError(t, err)
		require.Empty(t, closedWithin(t, c, 5*time.Second))
	})
}
