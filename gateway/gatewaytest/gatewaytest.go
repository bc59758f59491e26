// Package gatewaytest starts a real gateway for tests: a node (package
// gateway/node) with the embedded store in a temporary folder, the bridge
// hook and MQTT listeners (TCP and WebSocket) on 127.0.0.1 ports chosen by
// the kernel, and no core services, core port or HTTP server.
package gatewaytest

import (
	"context"
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
	"github.com/ferrymq/ferrymq/gateway/node"
	"github.com/ferrymq/ferrymq/session"
)

// Options adjust the environment; zero values are fine.
type Options struct {
	Dir    string // store folder; default t.TempDir()
	Store  store.Options
	Bridge bridge.Options // Broker is filled in
	// Gateway's listeners default to TCP and WebSocket on 127.0.0.1:0;
	// hooks set here win over the bridge's (a test may wrap one).
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
	// Node is the node the gateway runs in.
	Node    *node.Node
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

	kv *session.Store // Options.SessionsKV's store: closed after the node
}

// Start runs a gateway until the test ends.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if o.Gateway.Listeners == nil {
		o.Gateway.Listeners = []gateway.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}, {Type: "ws", Addr: "127.0.0.1:0"}}
	}
	h := &o.Gateway.Hooks
	if o.Auth != nil {
		h.Auth, h.ACL, h.Limits = o.Auth, o.Auth, o.Auth
	}
	no := node.Options{DataDir: o.Dir, Store: o.Store, Delay: o.Delay, Trace: o.Trace, Bridge: o.Bridge, Gateway: o.Gateway}
	if o.Sessions && o.SessionsKV == nil {
		no.Sessions = &o.SessionOptions
	}
	var kv *session.Store
	if o.SessionsKV != nil {
		ko := o.KVOptions
		if ko.Logger == nil {
			ko.Logger = o.SessionOptions.Logger
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var err error
		kv, err = session.OpenKV(ctx, o.SessionsKV, ko)
		cancel()
		require.NoError(t, err)
		no.Gateway.Hooks.Sessions = kv
	}
	n, err := node.New(t.Context(), no, nil)
	if err != nil && kv != nil {
		_ = kv.Close()
	}
	require.NoError(t, err)
	e := &Env{Node: n, Store: n.Store(), Bridge: n.Bridge(), Gateway: n.Gateway(), Sessions: n.Sessions(),
		Delay: n.Delay(), Trace: n.Trace(), kv: kv}
	if a := n.Addr("tcp"); a != nil {
		e.TCP = a.String()
	}
	if a := n.Addr("ws"); a != nil {
		e.WS = a.String()
	}
	t.Cleanup(func() { e.Stop(t) })
	return e
}

// Stop shuts the node down — the gateway, then the session store, the
// delay service and the trace recorder (which write to the store), then
// the store — and closes Options.SessionsKV's session store; safe to call
// twice.
func (e *Env) Stop(t testing.TB) {
	t.Helper()
	if e.Node == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, e.Node.Shutdown(ctx))
	if e.kv != nil {
		require.NoError(t, e.kv.Close())
	}
	e.Node = nil
}
