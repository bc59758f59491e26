package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/gateway/listener"
)

// Errors returned by Gateway.
var (
	// ErrPanic wraps a panic recovered in one connection's read path; only
	// that connection was closed.
	ErrPanic = errors.New("gateway: panic in connection")
	// ErrStarted is returned by Start when called twice.
	ErrStarted = errors.New("gateway: already started")
)

// Gateway is the MQTT front door: a mochi-mqtt server with hardened
// listeners, our hooks, and the stats endpoint's figures.
type Gateway struct {
	opts   Options
	log    zerolog.Logger
	server *mqtt.Server
	inline *mqtt.Client
	lns    []namedListener
	m      *metrics
	reg    *prometheus.Registry

	willStop chan struct{}  // closed at Shutdown: delayed restored wills wait no more
	willWG   sync.WaitGroup // delayed restored wills

	started  atomic.Bool
	ready    atomic.Bool
	stopOnce sync.Once
	stopErr  error
}

type namedListener struct {
	name string
	l    listeners.Listener
	addr func() string
}

// New assembles the gateway; nothing listens until Start.
func New(o Options) (*Gateway, error) {
	o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("gateway options: %w", err)
	}
	g := &Gateway{opts: o, log: zerolog.Nop(), willStop: make(chan struct{})}
	mochiLog := zerolog.Nop()
	if o.Logger != nil {
		g.log = o.Logger.With().Str("component", "gateway").Logger()
		mochiLog = o.Logger.With().Str("component", "mochi").Logger()
	}
	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumPacketSize = uint32(o.MaxPacketBytes) // in CONNACK [MQTT-3.2.2-15]; conn enforces it
	caps.MaximumClientWritesPending = int32(o.MaxPendingWrites)
	caps.ReceiveMaximum = o.ReceiveMaximum // [MQTT-3.3.4-7]: one more is DISCONNECT 0x93 (the bridge counts its own acks)
	caps.MaximumInflight = uint16(min(o.MaxInflight, math.MaxUint16))
	caps.TopicAliasMaximum = 64 // bounds the alias table each client may fill; above it DISCONNECT 0x94 [MQTT-3.2.2-17]
	caps.MaximumMessageExpiryInterval = 7 * 24 * 3600
	caps.MaximumSessionExpiryInterval = 7 * 24 * 3600
	if o.MaxClients > 0 {
		caps.MaximumClients = o.MaxClients
	}
	caps.Compatibilities.NoInheritedPropertiesOnAck = true // acks never echo user properties
	g.server = mqtt.New(&mqtt.Options{
		Capabilities:             caps,
		ClientNetReadBufferSize:  o.ReadBufferBytes,
		ClientNetWriteBufferSize: o.WriteBufferBytes,
		SysTopicResendInterval:   int64(o.SysInterval / time.Second),
		Logger:                   slog.New(&quietHandler{zerolog.NewSlogHandler(mochiLog)}),
	})
	g.inline = g.server.NewClient(nil, mqtt.LocalListener, "$ferrymq-gateway", true)
	g.m = newMetrics(g)
	g.reg = prometheus.NewRegistry()
	g.reg.MustRegister(g.m.collectors()...)

	lim := &limits{g: g}
	if !anyProvides(o.Hooks, mqtt.OnConnectAuthenticate) {
		// No authentication configured: every client may connect and use
		// every topic, as in a broker's development mode.
		g.log.Warn().Msg("MQTT AUTHENTICATION IS OFF: every client may connect anonymously and use every topic; configure auth (docs/security.md) before exposing this gateway")
		lim.allowAll = true
	}
	hooks := append([]mqtt.Hook{lim}, o.Hooks...)
	for _, h := range hooks {
		if a, ok := h.(interface{ Attach(*mqtt.Server) }); ok {
			a.Attach(g.server)
		}
		if c, ok := h.(interface{ Collectors() []prometheus.Collector }); ok {
			g.reg.MustRegister(c.Collectors()...)
		}
		if err := g.server.AddHook(h, nil); err != nil {
			return nil, fmt.Errorf("gateway: add hook %s: %w", h.ID(), err)
		}
	}
	for _, lc := range o.Listeners {
		cfg := listener.Config{ID: lc.Name, Address: lc.Addr, TLS: lc.TLS, HandshakeTimeout: o.ConnectTimeout, Log: g.log}
		var nl namedListener
		switch lc.Type {
		case "tcp":
			l := listener.NewTCP(cfg)
			nl = namedListener{name: lc.Name, l: l, addr: l.Address}
		case "ws":
			l := listener.NewWebsocket(listener.WSConfig{Config: cfg, Path: lc.Path, MaxMessageSize: int64(o.MaxPacketBytes) + 1024})
			nl = namedListener{name: lc.Name, l: l, addr: l.Address}
		}
		if err := g.server.AddListener(&guarded{Listener: nl.l, g: g}); err != nil {
			g.closeListeners()
			return nil, fmt.Errorf("gateway: listener %s on %s: %w", lc.Name, lc.Addr, err)
		}
		g.lns = append(g.lns, nl)
	}
	return g, nil
}

// Start serves every listener. Their addresses are bound already (New).
func (g *Gateway) Start() error {
	if !g.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	if err := g.server.Serve(); err != nil {
		return fmt.Errorf("gateway: serve: %w", err)
	}
	g.publishRestoredWills()
	g.ready.Store(true)
	for _, l := range g.lns {
		g.log.Info().Str("listener", l.name).Str("addr", l.addr()).Msg("mqtt listening")
	}
	return nil
}

// Addr returns the bound address of the named listener ("tcp", "ws", …),
// or nil.
func (g *Gateway) Addr(name string) net.Addr {
	for _, l := range g.lns {
		if l.name == name {
			a, err := net.ResolveTCPAddr("tcp", l.addr())
			if err != nil {
				return nil
			}
			return a
		}
	}
	return nil
}

// Listeners returns the listener names in configuration order.
func (g *Gateway) Listeners() []string {
	names := make([]string, len(g.lns))
	for i, l := range g.lns {
		names[i] = l.name
	}
	return names
}

// Server is the underlying mochi server (for hooks and tests).
func (g *Gateway) Server() *mqtt.Server { return g.server }

// Ready reports whether the listeners are serving.
func (g *Gateway) Ready() bool { return g.ready.Load() }

// Registry is the Prometheus registry with the gateway's and its hooks'
// metrics; the caller may add its own.
func (g *Gateway) Registry() *prometheus.Registry { return g.reg }

// Shutdown stops accepting connections, disconnects every client (MQTT 5
// clients get DISCONNECT 0x8B; wills are published as for any connection
// the server closes [MQTT-3.1.2-8]), waits until each connection's
// goroutines have ended, then waits until every publish handed to the core
// has completed and its ack was written. It returns ctx's error if that
// takes too long; the rest then finishes in the background.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.stopOnce.Do(func() {
		g.ready.Store(false)
		close(g.willStop)
		g.willWG.Wait() // a will not yet due stays stored: the next start waits for it again
		if !g.started.Load() {
			_ = g.server.Close() // closes the listeners and stops the hooks
			return
		}
		for _, cl := range g.server.Clients.GetAll() {
			if c, ok := cl.Net.Conn.(*conn); ok {
				c.stopping.Store(true)
			}
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = g.server.Close() // closes listeners, clients; waits for them
		}()
		select {
		case <-done:
		case <-ctx.Done():
			g.stopErr = fmt.Errorf("gateway shutdown: %w", ctx.Err())
			return
		}
		var errs []error
		for _, h := range g.opts.Hooks {
			if d, ok := h.(interface{ Drain(context.Context) error }); ok {
				errs = append(errs, d.Drain(ctx))
			}
		}
		g.stopErr = errors.Join(errs...)
		g.log.Info().Msg("mqtt stopped")
	})
	return g.stopErr
}

func anyProvides(hooks []mqtt.Hook, b byte) bool {
	for _, h := range hooks {
		if h.Provides(b) {
			return true
		}
	}
	return false
}

func (g *Gateway) closeListeners() {
	for _, l := range g.lns {
		l.l.Close(func(string) {})
	}
}

// Admitter is implemented by hooks that decide whether a socket may even
// start (connection caps, connect rate and bans per IP), before a byte is
// read from it. release is called when the connection ends.
type Admitter interface {
	AdmitConnection(remote net.Addr) (release func(), err error)
}

// guarded hands mochi each connection wrapped in a conn, and runs the
// connection's whole read path under a recover: a panic while decoding or
// handling one client's packet closes that client only, as for any
// malformed packet [MQTT-4.8.0-1] [MQTT-4.13.1-1]. After mochi is done with
// a connection, the same goroutine finishes its lingering close
// (conn.linger), so the listener's Close waits for and ends that too.
type guarded struct {
	listeners.Listener
	g *Gateway
}

// Close closes the listener with a client closer of our own: mochi's
// (closeListenerClients → Clients.GetByListener) takes the clients' read
// lock twice, which deadlocks when a client disconnecting at the same time
// waits for the write lock in between (mochi v2.7.9).
func (l *guarded) Close(_ listeners.CloseFn) {
	l.Listener.Close(func(id string) {
		for _, cl := range l.g.server.Clients.GetAll() {
			if cl.Net.Listener == id && !cl.Closed() {
				_ = l.g.server.DisconnectClient(cl, packets.ErrServerShuttingDown)
			}
		}
	})
}

func (l *guarded) Serve(establish listeners.EstablishFn) {
	l.Listener.Serve(func(id string, raw net.Conn) error { return l.g.establish(id, raw, establish) })
}

func (g *Gateway) establish(id string, raw net.Conn, next listeners.EstablishFn) (err error) {
	g.m.accepted.Inc()
	for _, h := range g.opts.Hooks {
		if a, ok := h.(Admitter); ok {
			release, err := a.AdmitConnection(raw.RemoteAddr())
			if err != nil {
				g.m.refused.WithLabelValues("admission").Inc()
				_ = raw.Close()
				return fmt.Errorf("gateway: connection from %s refused: %w", raw.RemoteAddr(), err)
			}
			defer release()
		}
	}
	c := newConn(raw, &g.opts)
	defer func() {
		r := recover()
		if r == nil {
			if err != nil {
				g.m.closedWithError(err)
			}
			return
		}
		g.m.panics.Inc()
		_ = c.closeNow()
		g.log.Error().Str("listener", id).Str("remote", raw.RemoteAddr().String()).
			Str("panic", fmt.Sprint(r)).Bytes("stack", firstLines(debug.Stack(), 12)).
			Msg("recovered panic in a connection; closed it")
		err = fmt.Errorf("%w: %v", ErrPanic, r)
		if cl := c.client.Load(); cl != nil {
			g.forget(cl, err)
		}
	}()
	err = next(id, c)
	c.linger() // after a DISCONNECT: drain until the client has read it (conn.Close)
	return err
}

// forget does for a connection that ended in a panic what mochi would have
// done after its read loop: publish the will (the connection closed without
// DISCONNECT [MQTT-3.1.2-8]), drop a clean session, tell the hooks.
func (g *Gateway) forget(cl *mqtt.Client, cause error) {
	cl.Stop(cause)
	g.publishWill(cl)
	if cur, ok := g.server.Clients.Get(cl.ID); ok && cur == cl {
		g.server.UnsubscribeClient(cl)
		g.server.Clients.Delete(cl.ID)
	}
	for _, h := range g.opts.Hooks {
		if c, ok := h.(interface {
			ClientClosed(*mqtt.Client, string, error)
		}); ok {
			c.ClientClosed(cl, "malformed_packet", cause)
		}
	}
}

// publishRestoredWills publishes the wills of sessions loaded from storage:
// their connections ended without DISCONNECT when the previous process died,
// so the will is due [MQTT-3.1.2-8] — after its will delay (counted from
// this start, bounded by the session expiry), unless the client connects
// again first [MQTT-3.1.3-9]. A graceful stop sent them already and stored
// the sessions with the will spent.
func (g *Gateway) publishRestoredWills() {
	for _, cl := range g.server.Clients.GetAll() {
		if cl.Net.Conn != nil || atomic.LoadUint32(&cl.Properties.Will.Flag) == 0 {
			continue
		}
		delay := time.Duration(cl.Properties.Will.WillDelayInterval) * time.Second
		if p := cl.Properties.Props; cl.Properties.ProtocolVersion == 5 && p.SessionExpiryIntervalFlag {
			delay = min(delay, time.Duration(p.SessionExpiryInterval)*time.Second)
		}
		g.log.Info().Str("client", cl.ID).Str("topic", cl.Properties.Will.TopicName).Dur("delay", delay).
			Msg("publishing the will of a session whose connection ended with the previous process")
		if delay <= 0 {
			g.publishWill(cl)
			continue
		}
		g.willWG.Go(func() {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-g.willStop:
				return
			case <-t.C:
			}
			if cur, ok := g.server.Clients.Get(cl.ID); ok && cur == cl && !cl.IsTakenOver() {
				g.publishWill(cl)
			}
		})
	}
}

// publishWill publishes cl's will to MQTT subscribers and hands it to the
// hooks (the bridge stores it in the core, the session store forgets it).
func (g *Gateway) publishWill(cl *mqtt.Client) {
	if atomic.LoadUint32(&cl.Properties.Will.Flag) == 0 {
		return
	}
	w := cl.Properties.Will
	for _, h := range g.opts.Hooks { // as mochi's own will path does (the ACL)
		if h.Provides(mqtt.OnWill) {
			if mw, err := h.OnWill(cl, w); err == nil {
				w = mw
			}
		}
	}
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: w.Qos, Retain: w.Retain},
		TopicName:   w.TopicName, Payload: w.Payload, Properties: packets.Properties{User: w.User},
		Origin: cl.ID, Created: time.Now().Unix(),
		PacketID: uint16(w.Qos), // mochi's validity check wants one for QoS > 0
	}
	pk.Connect.WillFlag = true // marks it for hooks that see it twice (OnPublished, then OnWillSent)
	_ = g.server.InjectPacket(g.inline, pk)
	atomic.StoreUint32(&cl.Properties.Will.Flag, 0)
	for _, h := range g.opts.Hooks {
		if h.Provides(mqtt.OnWillSent) {
			h.OnWillSent(cl, pk)
		}
	}
}

func firstLines(b []byte, n int) []byte {
	for i, c := range b {
		if c == '\n' {
			if n--; n == 0 {
				return b[:i]
			}
		}
	}
	return b
}

// quietHandler drops mochi's packet dumps ("pk", "packet" attributes carry
// payloads, which are never logged), turns its per-message warnings into
// debug lines (they are counted in /metrics instead: one line per dropped
// message would flood the log exactly when the gateway is overloaded), and
// passes the rest on.
type quietHandler struct{ slog.Handler }

// perMessage are mochi's warnings that fire once per message.
var perMessage = map[string]bool{
	"client store quota reached": true,
	"packet ids exhausted":       true,
	"failed publishing packet":   true,
	"error processing packet":    true,
}

func (h *quietHandler) Handle(ctx context.Context, r slog.Record) error {
	level := r.Level
	if level >= slog.LevelWarn && perMessage[r.Message] {
		level = slog.LevelDebug
		if !h.Handler.Enabled(ctx, level) {
			return nil
		}
	}
	out := slog.NewRecord(r.Time, level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "pk" && a.Key != "packet" {
			out.AddAttrs(a)
		}
		return true
	})
	return h.Handler.Handle(ctx, out)
}

func (h *quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &quietHandler{h.Handler.WithAttrs(as)}
}

func (h *quietHandler) WithGroup(name string) slog.Handler {
	return &quietHandler{h.Handler.WithGroup(name)}
}
