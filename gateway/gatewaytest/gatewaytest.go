// Package gatewaytest starts a real gateway for tests: the embedded store
// in a temporary folder, the bridge hook and MQTT listeners (TCP and
// WebSocket) on 127.0.0.1 ports chosen by the kernel.
package gatewaytest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/session"
)

// Options adjust the environment; zero values are fine.
type Options struct {
	Dir     string // store folder; default t.TempDir()
	Store   store.Options
	Bridge  bridge.Options // Broker is filled in
	Gateway gateway.Options
	// Sessions persists MQTT sessions in Dir/sessions (package session),
	// with SessionOptions.
	Sessions       bool
	SessionOptions session.Options
	// SessionsKV, if set, keeps the sessions in a key-value bucket of this
	// JetStream (session.OpenKV with KVOptions, whose Options are
	// SessionOptions) instead of Dir/sessions: several gateways on one
	// NATS share them. Implies Sessions.
	SessionsKV jetstream.JetStream
	KVOptions  session.KVOptions
	// Auth, if set, authenticates, authorizes and paces clients (package
	// auth's hook as the engine's Auth, ACL and Limits).
	Auth *auth.Hook
	// Delay runs delayed delivery (package core/delay, folder Dir/delay)
	// with these options, and the bridge produces through it; nil: none.
	Delay *delay.Options
	// Trace records message traces in the store with these options: the
	// Recorder is the bridge's (Bridge.Trace) and, unless Delay.Trace is
	// set, the delay service's. Nil: no tracing.
	Trace *trace.Options
}

// Env is a running gateway.
type Env struct {
	Store   *store.Store
	Bridge  *bridge.Hook
	Gateway *gateway.Gateway
	// Sessions is the session store (Options.Sessions), or nil.
	Sessions *session.Store
	// Delay is the delayed delivery service (Options.Delay), or nil.
	Delay *delay.Service
	// Trace is the trace recorder (Options.Trace), or nil.
	Trace *trace.Recorder
	TCP   string // host:port of the MQTT TCP listener
	WS    string // host:port of the WebSocket listener (path /mqtt)
}

// Start runs a gateway until the test ends.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	st, err := store.Open(o.Dir, o.Store)
	require.NoError(t, err)
	o.Bridge.Broker = st
	var rec *trace.Recorder
	var ds *delay.Service
	fail := func(err error) { // before the gateway runs
		if ds != nil {
			_ = ds.Close()
		}
		_ = rec.Close()
		_ = st.Close()
		require.NoError(t, err)
	}
	if o.Trace != nil {
		if rec, err = trace.New(st, *o.Trace); err != nil {
			fail(err)
		}
		rec.Start()
		o.Bridge.Trace = rec
	}
	if o.Delay != nil {
		do := *o.Delay
		if do.Trace == nil {
			do.Trace = rec
		}
		if ds, err = delay.New(st, filepath.Join(o.Dir, "delay"), do); err != nil {
			fail(err)
		}
		ds.Start()
		o.Bridge.Broker = ds.Broker()
	}
	var ss *session.Store
	if o.Sessions || o.SessionsKV != nil {
		so := o.SessionOptions
		if o.SessionsKV != nil {
			ko := o.KVOptions
			if ko.Logger == nil {
				ko.Logger = so.Logger
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			ss, err = session.OpenKV(ctx, o.SessionsKV, ko)
			cancel()
		} else {
			ss, err = session.Open(filepath.Join(o.Dir, "sessions"), so)
		}
		if err != nil {
			fail(err)
		}
	}
	br, err := bridge.New(o.Bridge)
	if err != nil {
		fail(err)
	}
	if o.Gateway.Listeners == nil {
		o.Gateway.Listeners = []gateway.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}, {Type: "ws", Addr: "127.0.0.1:0"}}
	}
	h := &o.Gateway.Hooks
	if o.Auth != nil {
		h.Auth, h.ACL, h.Limits = o.Auth, o.Auth, o.Auth
	}
	if ss != nil {
		h.Sessions = ss
	}
	if h.Uplink == nil {
		h.Uplink = br
	}
	if h.Presence == nil {
		h.Presence = br
	}
	if h.Delivery == nil {
		h.Delivery = br // a test may wrap it
	}
	o.Gateway.Store = st
	if o.Gateway.MaxQueued == 0 {
		o.Gateway.MaxQueued = o.Bridge.OfflineMaxMessages
	}
	if o.Gateway.MaxQueuedBytes == 0 {
		o.Gateway.MaxQueuedBytes = o.Bridge.OfflineMaxBytes
	}
	gw, err := gateway.New(o.Gateway)
	if err != nil {
		fail(err)
	}
	require.NoError(t, gw.Start())
	e := &Env{Store: st, Bridge: br, Gateway: gw, Sessions: ss, Delay: ds, Trace: rec}
	if a := gw.Addr("tcp"); a != nil {
		e.TCP = a.String()
	}
	if a := gw.Addr("ws"); a != nil {
		e.WS = a.String()
	}
	t.Cleanup(func() { e.Stop(t) })
	return e
}

// Stop shuts the gateway down, then the delay service and the trace
// recorder (which write to the store), and closes the store; safe to call
// twice.
func (e *Env) Stop(t testing.TB) {
	t.Helper()
	if e.Gateway == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, e.Gateway.Shutdown(ctx))
	if e.Sessions != nil {
		require.NoError(t, e.Sessions.Close())
	}
	if e.Delay != nil {
		require.NoError(t, e.Delay.Close())
	}
	require.NoError(t, e.Trace.Close())
	require.NoError(t, e.Store.Close())
	e.Gateway = nil
}
