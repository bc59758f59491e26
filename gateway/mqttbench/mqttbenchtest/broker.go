// Package mqttbenchtest runs an in-process MQTT broker (ferrymq's engine,
// everyone allowed) on loopback ports for tests of MQTT clients and load
// tools.
package mqttbenchtest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Broker is a running in-process broker.
type Broker struct {
	Engine *engine.Engine
	// Addr is the MQTT over TCP address, tcp://127.0.0.1:port.
	Addr string
	// WSAddr is the MQTT over websocket address, ws://127.0.0.1:port/mqtt.
	WSAddr string
}

// Options adjust a test broker.
type Options struct {
	// Auth decides who may connect; default: all.
	Auth engine.Authenticator
	// Uplink sees every publish; default: delivered as published.
	Uplink engine.Uplink
}

// Start starts a broker with one TCP and one websocket listener on free
// loopback ports; t's cleanup shuts it down.
func Start(t testing.TB, o Options) *Broker {
	t.Helper()
	e, err := engine.New(engine.Options{
		Listeners:        []engine.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}, {Type: "ws", Addr: "127.0.0.1:0"}},
		Hooks:            engine.Hooks{Auth: o.Auth, Uplink: o.Uplink},
		MaxPendingWrites: 1024,
	})
	require.NoError(t, err)
	require.NoError(t, e.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Shutdown(ctx))
	})
	return &Broker{Engine: e, Addr: "tcp://" + e.Addr("tcp").String(), WSAddr: "ws://" + e.Addr("ws").String() + "/mqtt"}
}
