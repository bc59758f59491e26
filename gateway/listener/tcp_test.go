package listener

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func TestTCPRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name     string
		tls      bool
		scheme   string
		protocol string
	}{
		{name: "tcp", scheme: "tcp", protocol: "tcp"},
		{name: "tls", tls: true, scheme: "ssl", protocol: "tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{ID: tc.name, Address: "127.0.0.1:0"}
			if tc.tls {
				cfg.TLS = serverTLS(t, false)
			}
			l := NewTCP(cfg)
			startBroker(t, l)
			require.Equal(t, tc.protocol, l.Protocol())
			require.NotEqual(t, "127.0.0.1:0", l.Address())

			c, err := connectPaho(t, tc.scheme+"://"+l.Address(), "rt-"+tc.name, clientTLS(t, ""))
			require.NoError(t, err)
			roundTrip(t, c)

			st := l.Stats()
			require.Equal(t, uint64(1), st.Accepted)
			require.Equal(t, 1, st.Active)
			require.Zero(t, st.HandshakeFailures)
		})
	}
}

func TestTCPMutualTLS(t *testing.T) {
	l := NewTCP(Config{ID: "mtls", Address: "127.0.0.1:0", TLS: serverTLS(t, true)})
	startBroker(t, l)
	url := "ssl://" + l.Address()

	c, err := connectPaho(t, url, "trusted", clientTLS(t, "client"))
	require.NoError(t, err)
	roundTrip(t, c)

	for _, cert := range []string{"client-untrusted", ""} {
		_, err := connectPaho(t, url, "refused", clientTLS(t, cert))
		require.Error(t, err, "client cert %q", cert)
	}
	require.Eventually(t, func() bool { return l.Stats().HandshakeFailures == 2 }, waitFor, 5*time.Millisecond, "%+v", l.Stats())
}

func TestTCPHandshakeTimeout(t *testing.T) {
	var logs syncBuffer
	l := NewTCP(Config{
		ID:               "tls",
		Address:          "127.0.0.1:0",
		TLS:              serverTLS(t, false),
		HandshakeTimeout: 200 * time.Millisecond,
		Log:              zerolog.New(&logs).Level(zerolog.DebugLevel),
	})
	startBroker(t, l)

	c := dialSilent(t, l.Address())
	requireClosedByPeer(t, c)
	require.Eventually(t, func() bool {
		st := l.Stats()
		return st.HandshakeFailures == 1 && st.Active == 0
	}, waitFor, 5*time.Millisecond)
	require.Contains(t, logs.String(), `"message":"tls handshake"`)
}

// Connections that never finish CONNECT, or never finish the TLS handshake,
// must not hold up the server's Close.
func TestTCPCloseWithIdleConnections(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tls    bool
		scheme string
	}{
		{name: "tcp", scheme: "tcp"},
		{name: "tls", tls: true, scheme: "ssl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{ID: tc.name, Address: "127.0.0.1:0"}
			if tc.tls {
				cfg.TLS = serverTLS(t, false)
			}
			l := NewTCP(cfg)
			b := startBroker(t, l)
			client, err := connectPaho(t, tc.scheme+"://"+l.Address(), "idle-"+tc.name, clientTLS(t, ""))
			require.NoError(t, err)
			silent := dialSilent(t, l.Address())
			require.Eventually(t, func() bool { return l.Stats().Active == 2 }, waitFor, 5*time.Millisecond)

			requireReturnsWithin(t, 2*time.Second, b.close)
			require.Equal(t, 0, l.Stats().Active)
			requireClosedByPeer(t, silent)
			require.Eventually(t, func() bool { return !client.IsConnectionOpen() }, waitFor, 5*time.Millisecond)
		})
	}
}

func TestTCPCloseIdempotent(t *testing.T) {
	t.Run("serving", func(t *testing.T) {
		l := NewTCP(Config{ID: "t", Address: "127.0.0.1:0"})
		require.NoError(t, l.Init(nil))
		served := make(chan struct{})
		go func() {
			defer close(served)
			l.Serve(drain)
		}()
		c := dialSilent(t, l.Address())
		require.Eventually(t, func() bool { return l.Stats().Active == 1 }, waitFor, 5*time.Millisecond)

		var calls atomic.Int32
		closeClients := func(id string) {
			require.Equal(t, "t", id)
			calls.Add(1)
		}
		l.Close(closeClients)
		<-served // Close waited for Serve
		l.Close(closeClients)
		require.Equal(t, int32(1), calls.Load())
		requireClosedByPeer(t, c)
		require.ErrorIs(t, l.Init(nil), ErrClosed)
		l.Serve(drain) // returns at once
	})
	t.Run("never served", func(t *testing.T) {
		l := NewTCP(Config{ID: "t", Address: "127.0.0.1:0"})
		require.NoError(t, l.Init(nil))
		l.Close(nil)
		l.Close(nil)
		l.Serve(drain)
	})
	t.Run("never opened", func(t *testing.T) {
		l := NewTCP(Config{ID: "t"})
		l.Close(nil)
		l.Serve(drain)
	})
}

func TestTCPInit(t *testing.T) {
	l := NewTCP(Config{Address: "127.0.0.1:0", HandshakeTimeout: -1})
	err := l.Init(nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "empty ID")
	require.ErrorContains(t, err, "negative HandshakeTimeout")

	l = NewTCP(Config{ID: "t", Address: "127.0.0.1:0"})
	require.NoError(t, l.Init(nil))
	t.Cleanup(func() { l.Close(nil) })
	require.ErrorIs(t, l.Init(nil), ErrAlreadyOpen)

	taken := NewTCP(Config{ID: "t2", Address: l.Address()})
	require.ErrorContains(t, taken.Init(nil), "listener t2:")
}

// Accept errors such as EMFILE back off and retry rather than end Serve or
// spin, and Close cuts a back-off short.
func TestTCPAcceptBackoff(t *testing.T) {
	l := NewTCP(Config{ID: "t", Address: "127.0.0.1:0"})
	require.NoError(t, l.Init(nil))
	flaky := &flakyListener{Listener: l.ln}
	flaky.fails.Store(3)
	l.ln = flaky
	served := make(chan struct{})
	go func() {
		defer close(served)
		l.Serve(drain)
	}()

	c := dialSilent(t, l.Address())
	require.Eventually(t, func() bool { return l.Stats().Active == 1 }, waitFor, 5*time.Millisecond)
	require.LessOrEqual(t, flaky.fails.Load(), int32(0))

	const many = 1 << 20
	flaky.fails.Store(many) // from the next Accept on, Serve backs off
	_ = dialSilent(t, l.Address())
	require.Eventually(t, func() bool { return flaky.fails.Load() < many-3 }, waitFor, 5*time.Millisecond)
	requireReturnsWithin(t, 2*time.Second, func() { l.Close(nil) })
	<-served
	requireClosedByPeer(t, c)
}

func TestNextDelay(t *testing.T) {
	var got []time.Duration
	var d time.Duration
	for range 10 {
		d = nextDelay(d)
		got = append(got, d)
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second}, got)
}

// flakyListener fails Accept with EMFILE while fails is positive.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
}

func (f *flakyListener) Accept() (net.Conn, error) {
	if f.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept", syscall.EMFILE)}
	}
	return f.Listener.Accept()
}

// drain is an establish function that reads until the connection ends.
func drain(_ string, c net.Conn) error {
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func requireReturnsWithin(t testing.TB, d time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("did not return within %v", d)
	}
}

// A closeClients that hangs (mochi writing DISCONNECT to a peer that stopped
// reading) must not hang Close: after the grace period every connection is
// closed, which ends the hanging write.
func TestTCPCloseClientsGrace(t *testing.T) {
	l := NewTCP(Config{ID: "t", Address: "127.0.0.1:0"})
	l.conns.grace = 50 * time.Millisecond
	require.NoError(t, l.Init(nil))
	ended := make(chan struct{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		l.Serve(func(id string, c net.Conn) error {
			defer close(ended)
			return drain(id, c)
		})
	}()
	c := dialSilent(t, l.Address())
	require.Eventually(t, func() bool { return l.Stats().Active == 1 }, waitFor, 5*time.Millisecond)

	l.Close(func(string) { <-ended }) // returns only once the connection is closed
	<-served
	requireClosedByPeer(t, c)
}
