package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Errors returned by Gateway.
var (
	// ErrStarted is returned by Start when called twice.
	ErrStarted = errors.New("gateway: already started")
	// ErrNoCertificates is returned by LoadTLS when the client CA file holds
	// no certificate.
	ErrNoCertificates = errors.New("gateway: no certificate in PEM file")
)

// Gateway is the MQTT front door: ferrymq's engine (gateway/engine) with
// its listeners, the hooks of the packages that make it a gateway, and the
// stats endpoint's figures.
type Gateway struct {
	opts Options
	log  zerolog.Logger
	e    *engine.Engine
	m    *metrics
	reg  *prometheus.Registry

	hooks []any // each hook object once, in Hooks order

	started  atomic.Bool
	ready    atomic.Bool
	stopOnce sync.Once
	stopErr  error
}

// New assembles the gateway and binds its listeners; nothing is served
// until Start. Hooks must not be typed nils. Every hook object that has them gets Attach(*engine.Engine)
// now, Start() once the engine serves, and Drain(ctx) at Shutdown after the
// engine stopped; Collectors() are registered for /metrics.
func New(o Options) (*Gateway, error) {
	o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("gateway options: %w", err)
	}
	g := &Gateway{opts: o, log: zerolog.Nop(), reg: prometheus.NewRegistry()}
	if o.Logger != nil {
		g.log = o.Logger.With().Str("component", "gateway").Logger()
	}
	if o.Hooks.Auth == nil {
		g.log.Warn().Msg("MQTT AUTHENTICATION IS OFF: every client may connect anonymously and use every topic; configure auth (docs/security.md) before exposing this gateway")
	}
	eo := engine.Options{
		Hooks:                o.Hooks,
		MaxPacketBytes:       o.MaxPacketBytes,
		ConnectTimeout:       o.ConnectTimeout,
		MaxKeepalive:         o.MaxKeepalive,
		WriteTimeout:         o.WriteTimeout,
		MaxPendingWrites:     o.MaxPendingWrites,
		ReceiveMaximum:       o.ReceiveMaximum,
		MaxInflight:          o.MaxInflight,
		MaxQueued:            o.MaxQueued,
		MaxQueuedBytes:       o.MaxQueuedBytes,
		MaxQueuedOnline:      o.MaxQueuedOnline,
		MaxQueuedOnlineBytes: o.MaxQueuedOnlineBytes,
		MaxClients:           int(o.MaxClients),
		Workers:              o.Workers,
		Node:                 o.Node,
		Logger:               o.Logger,
		TopicAliasMaximum:    engine.DefaultTopicAliasMaximum,
	}
	for _, l := range o.Listeners {
		eo.Listeners = append(eo.Listeners, engine.Listener{Name: l.Name, Type: l.Type, Addr: l.Addr, Path: l.Path, TLS: l.TLS, ProxyProtocol: l.ProxyProtocol})
	}
	e, err := engine.New(eo)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.e = e
	g.m = newMetrics(g)
	g.reg.MustRegister(g.m.collectors()...)
	seen := map[any]bool{}
	for _, h := range []any{o.Hooks.Auth, o.Hooks.ACL, o.Hooks.Limits, o.Hooks.Sessions, o.Hooks.Uplink, o.Hooks.Presence, o.Hooks.Delivery, o.Hooks.Router} {
		if h == nil || seen[h] {
			continue
		}
		seen[h] = true
		g.hooks = append(g.hooks, h)
		if a, ok := h.(interface{ Attach(*engine.Engine) }); ok {
			a.Attach(e)
		}
		if c, ok := h.(interface{ Collectors() []prometheus.Collector }); ok {
			g.reg.MustRegister(c.Collectors()...)
		}
	}
	return g, nil
}

// Start serves every listener (restoring stored sessions first), then
// starts the hooks that start.
func (g *Gateway) Start() error {
	if !g.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	if err := g.e.Start(); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	for _, h := range g.hooks {
		switch s := h.(type) {
		case interface{ Start() error }:
			if err := s.Start(); err != nil {
				return fmt.Errorf("gateway: start %T: %w", h, err)
			}
		case interface{ Start() }:
			s.Start()
		}
	}
	g.ready.Store(true)
	return nil
}

// Engine is the MQTT engine (admin queries, point-to-point sends, tests).
func (g *Gateway) Engine() *engine.Engine { return g.e }

// Addr returns the bound address of the named listener ("tcp", "ws", …),
// or nil.
func (g *Gateway) Addr(name string) net.Addr { return g.e.Addr(name) }

// Listeners returns the listener names in configuration order.
func (g *Gateway) Listeners() []string {
	names := make([]string, len(g.opts.Listeners))
	for i, l := range g.opts.Listeners {
		names[i] = l.Name
	}
	return names
}

// Ready reports whether the listeners are serving.
func (g *Gateway) Ready() bool { return g.ready.Load() }

// Registry is the Prometheus registry with the gateway's and its hooks'
// metrics; the caller may add its own.
func (g *Gateway) Registry() *prometheus.Registry { return g.reg }

// Shutdown stops accepting connections, ends every client's connection
// (MQTT 5 clients get DISCONNECT 0x8B; wills are published as for any
// connection the server closes [MQTT-3.1.2-8]), waits until the engine's
// work has ended, then drains the hooks (everything handed to the core has
// completed). It returns ctx's error if that takes too long.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.stopOnce.Do(func() {
		g.ready.Store(false)
		errs := []error{g.e.Shutdown(ctx)}
		for _, h := range g.hooks {
			if d, ok := h.(interface{ Drain(context.Context) error }); ok {
				errs = append(errs, d.Drain(ctx))
			}
		}
		g.stopErr = errors.Join(errs...)
		g.log.Info().Msg("mqtt stopped")
	})
	return g.stopErr
}
