package cluster_test

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/gateway/cluster"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// A gateway node wires its router so: the router is the engine's Router,
// attached before the engine starts and started after it; at the end the
// engine shuts down first (its wills still go out), then the router
// closes, then the NATS connection. (Compiled, not run: it needs a NATS
// server.)
func Example() {
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		return
	}
	defer nc.Close()
	r, err := cluster.New(cluster.Options{Conn: nc, Node: "gw-a"})
	if err != nil {
		return
	}
	defer r.Close()
	e, err := engine.New(engine.Options{
		Listeners: []engine.Listener{{Type: "tcp", Addr: ":1883"}},
		Hooks:     engine.Hooks{Router: r},
	})
	if err != nil {
		return
	}
	r.Attach(e)
	if err := e.Start(); err != nil {
		return
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Shutdown(ctx)
	}()
	if err := r.Start(); err != nil {
		return
	}
	prometheus.NewRegistry().MustRegister(r.Collectors()...)
	// … serve until told to stop.
}
