package mqttbench

import (
	"context"
	"crypto/tls"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/mqttbench/mqttbenchtest"
)

// Idle connections over every transport the lean client speaks: all come
// up, and PINGREQs (through TLS records, WebSocket frames) keep them
// alive past 1.5 × keepalive.
func TestIdleOverEveryTransport(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	for _, c := range []struct {
		name string
		addr string
		tls  *tls.Config
	}{
		{"tcp", b.Addr, nil},
		{"tls with the CA", b.TLSAddr, &tls.Config{RootCAs: b.Roots}},
		{"tls insecure", b.TLSAddr, &tls.Config{InsecureSkipVerify: true}},
		{"websocket", b.WSAddr, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := Run(t.Context(), Options{Mode: ModeIdle, Addr: c.addr, TLS: c.tls, Conns: 30, Workers: 4,
				Hold: 300 * time.Millisecond, KeepAlive: 200 * time.Millisecond})
			require.NoError(t, err)
			require.Equal(t, int64(30), res.Conns.Connected, "errors: %v", res.Errors)
			require.Equal(t, 30, res.Conns.Held)
			require.Equal(t, 30, res.Conns.Alive)
			require.Empty(t, res.Errors)
			require.Eventually(t, func() bool { return b.Engine.Stats().Sockets == 0 }, 5*time.Second, 10*time.Millisecond,
				"every connection is closed when Run returns")
		})
	}
}

func TestConnectTLSUnknownCertificateFails(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	res, err := Run(t.Context(), Options{Mode: ModeConnect, Addr: b.TLSAddr, Conns: 5, Workers: 2})
	require.NoError(t, err)
	require.Zero(t, res.Conns.Connected)
	require.Equal(t, int64(5), res.Conns.Failed)
	require.Len(t, res.Errors, 1)
	require.Contains(t, res.Errors[0].Err, "tls handshake")
	require.Contains(t, res.Errors[0].Err, "certificate")
}

func TestConnectWithCredentials(t *testing.T) {
	auth := &passwordAuth{user: "bench", pass: "s3cret"}
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{Auth: auth})
	for _, addr := range []string{b.Addr, b.TLSAddr, b.WSAddr} {
		res, err := Run(t.Context(), Options{Mode: ModeConnect, Addr: addr, TLS: &tls.Config{RootCAs: b.Roots},
			Conns: 20, Workers: 4, Username: "bench", Password: "s3cret"})
		require.NoError(t, err)
		require.Equal(t, int64(20), res.Conns.Connected, "%s: errors: %v", addr, res.Errors)
		require.Zero(t, res.Conns.Failed)
	}
	require.Equal(t, 60, auth.accepted())
}

func TestConnectBadPasswordCountsRefusals(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{Auth: &passwordAuth{user: "bench", pass: "s3cret"}})
	for name, o := range map[string]Options{
		"bad password": {Username: "bench", Password: "wrong"},
		"no password":  {Username: "bench"},
		"anonymous":    {},
	} {
		t.Run(name, func(t *testing.T) {
			o.Mode, o.Addr, o.Conns, o.Workers = ModeConnect, b.Addr, 12, 3
			res, err := Run(t.Context(), o)
			require.NoError(t, err, "refusals are measured, not a failed run")
			require.Zero(t, res.Conns.Connected)
			require.Equal(t, int64(12), res.Conns.Failed)
			require.Equal(t, []ErrorCount{{Err: "mqttbench: connection refused: return code 4 (bad user name or password)", Count: 12}},
				res.Errors)
		})
	}
}

// passwordAuth lets in one username with one password.
type passwordAuth struct {
	user, pass string
	mu         sync.Mutex
	ok         int
}

func (a *passwordAuth) Authenticate(_ context.Context, ci *engine.ConnectInfo) (engine.Identity, error) {
	if ci.Username != a.user || string(ci.Password) != a.pass {
		return engine.Identity{}, &engine.Refusal{Code: engine.BadUsernameOrPassword, Reason: "bad credentials"}
	}
	a.mu.Lock()
	a.ok++
	a.mu.Unlock()
	return engine.Identity{Username: ci.Username}, nil
}

func (a *passwordAuth) accepted() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ok
}

func TestIdleSubscribesOnceEach(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	for _, addr := range []string{b.Addr, b.WSAddr} {
		ctx, cancel := context.WithCancel(t.Context())
		progress := &holdWatcher{holding: make(chan struct{})}
		done := make(chan Result, 1)
		go func() {
			res, err := Run(ctx, Options{Mode: ModeIdle, Addr: addr, Conns: 40, Workers: 4, Subscribe: "idle/%i/cmd", SubQoS: 1,
				Progress: progress})
			require.NoError(t, err)
			done <- res
		}()
		select {
		case <-progress.holding:
		case res := <-done:
			t.Fatalf("%s: the run ended before holding: %v", addr, res.Errors)
		}
		st := b.Engine.Stats()
		require.Equal(t, int64(40), st.Connected)
		require.Equal(t, 40, st.Subscriptions, "%s: one subscription per connection", addr)
		for _, i := range []string{"0", "17", "39"} {
			require.Equal(t, 1, b.Engine.Subscribers("idle/"+i+"/cmd"), "%s: connection %s subscribed to its own filter", addr, i)
		}
		cancel()
		res := <-done
		require.Equal(t, int64(40), res.Conns.Connected)
		require.Equal(t, "idle/%i/cmd", res.Conns.Subscribe)
		require.EqualValues(t, 1, res.Conns.SubQoS)
		require.Empty(t, res.Errors)
	}
}

func TestIdleRefusedSubscriptionFailsTheConnection(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{ACL: denySubscribe{}})
	res, err := Run(t.Context(), Options{Mode: ModeIdle, Addr: b.Addr, Conns: 6, Workers: 2, Subscribe: "idle/%i", SubQoS: 1,
		Hold: time.Millisecond})
	require.NoError(t, err)
	require.Zero(t, res.Conns.Connected)
	require.Equal(t, int64(6), res.Conns.Failed)
	require.Len(t, res.Errors, 1)
	require.ErrorContains(t, ErrSubackRefused, "subscription refused")
	require.Contains(t, res.Errors[0].Err, "subscription refused")
}

// denySubscribe refuses every subscription.
type denySubscribe struct{}

func (denySubscribe) CanPublish(*engine.Client, string) bool              { return true }
func (denySubscribe) CanSubscribe(*engine.Client, string) bool            { return false }
func (denySubscribe) CanRead(*engine.Client, string, string, string) bool { return true }
