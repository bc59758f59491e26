package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Defaults.
const (
	DefaultMaxPendingMessages = 65536
	DefaultMaxPendingBytes    = 64 << 20
	DefaultMaxSubjectBytes    = 1024
	DefaultCollateWait        = 2 * time.Millisecond
	DefaultSweepInterval      = 30 * time.Second
)

// inlineID is the client ID of the hook's inline mochi client, the
// publisher of every message from another node ('$': never a device's).
const inlineID = "$ferrymq-cluster"

// Options configure the hook.
type Options struct {
	// Node names this gateway node: unique among the live nodes of the
	// cluster (the session store's node ID). Required.
	Node string
	// Prefix is the first token(s) of the subjects routed messages travel
	// under; DefaultPrefix when empty. Every node of a cluster uses the
	// same; plain tokens only ([A-Za-z0-9_-], dot-separated).
	Prefix string
	// Parked reports whether clientID has a session parked on this node —
	// offline, taken out of mochi by the session store (session.Store's
	// Parked). The plain subscriptions of a parked session stay routed
	// here, so this node queues what other nodes publish for it. Nil: no
	// parking (mochi keeps offline sessions, and they stay routed too).
	Parked func(clientID string) bool
	// ParkedFilters, when set, lists the sessions parked on this node
	// without mochi ever holding them here (taken back at start, adopted
	// from a gone node) with their plain filters; every sweep (and Resync)
	// routes them, so this node queues what other nodes publish for them.
	ParkedFilters func() map[string][]string
	// LocalRetain: a retained message from another node is retained here
	// too, as mochi retains a local one. Leave it false when the nodes
	// share retained messages already — the session store on a key-value
	// bucket does (session.OpenKV) — or every node would write each one
	// back (and could put an older one back over a newer one); the message
	// then reaches this node's current subscribers with RETAIN 0.
	LocalRetain bool
	// MaxPendingMessages and MaxPendingBytes bound each of the hook's two
	// queues — publishes waiting to go out to NATS, messages from other
	// nodes waiting to be delivered here — and MaxPendingMessages the NATS
	// client's buffer of messages not yet read (at most 8,192). Past a
	// bound a message is dropped and counted, never waited for. Defaults
	// DefaultMaxPendingMessages and DefaultMaxPendingBytes.
	MaxPendingMessages int
	MaxPendingBytes    int
	// MaxSubjectBytes: a topic whose subject would be longer is not routed
	// (counted). Keep it well below the servers' max_control_line (4 KiB
	// by default, and a cluster route adds queue names to the line).
	// Default DefaultMaxSubjectBytes.
	MaxSubjectBytes int
	// CollateWait bounds how long a message from another node waits for
	// the other copies NATS may still hand this node — one per shared
	// group this node might serve — so that it is delivered here once.
	// Only messages on topics this node has shared subscribers for wait;
	// a copy that comes later is delivered on its own (counted as late).
	// Default DefaultCollateWait.
	CollateWait time.Duration
	// SweepInterval is how often the routes are checked against mochi's
	// sessions and Parked: routes of sessions gone from this node (expired,
	// taken over by another node) are dropped. Default
	// DefaultSweepInterval.
	SweepInterval time.Duration
	Logger        *zerolog.Logger
}

func (o *Options) withDefaults() {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.MaxPendingMessages <= 0 {
		o.MaxPendingMessages = DefaultMaxPendingMessages
	}
	if o.MaxPendingBytes <= 0 {
		o.MaxPendingBytes = DefaultMaxPendingBytes
	}
	if o.MaxSubjectBytes <= 0 {
		o.MaxSubjectBytes = DefaultMaxSubjectBytes
	}
	if o.CollateWait <= 0 {
		o.CollateWait = DefaultCollateWait
	}
	if o.SweepInterval <= 0 {
		o.SweepInterval = DefaultSweepInterval
	}
}

func (o *Options) validate() error {
	var errs []error
	if o.Node == "" {
		errs = append(errs, errors.New("node name is required"))
	}
	if !validPrefix(o.Prefix) {
		errs = append(errs, fmt.Errorf("prefix %q: want dot-separated tokens of [A-Za-z0-9_-]", o.Prefix))
	}
	return errors.Join(errs...)
}

// Hook routes MQTT publishes between the gateway nodes of a NATS cluster,
// as one mochi hook (doc.go). Add it to the server, call Attach with that
// server before Serve (gateway.New does both), and Close it after the
// server stopped (mochi's Stop does).
type Hook struct {
	mqtt.HookBase

	nc      *nats.Conn
	opts    Options
	log     zerolog.Logger
	m       *metrics
	plainQ  string // queue group of this node's plain routes
	origin  string // opts.Node as the origin header carries it
	running atomic.Bool

	server *mqtt.Server
	inline *mqtt.Client

	// mu guards the routes the local sessions want (routes.go).
	mu      sync.Mutex
	routes  map[string]*route              // by key: the filter as subscribed
	clients map[string]map[string]struct{} // client ID → keys it holds
	dirty   map[*route]struct{}            // routes whose NATS subscriptions may need a change
	kick    chan struct{}                  // wakes the reconciler
	resync  chan struct{}                  // asks the reconciler for a sweep now

	// amu guards the routes NATS has: the table, and shared routes by
	// queue group.
	amu     sync.RWMutex
	active  table
	byQueue map[string]*route

	subsMu sync.Mutex
	subs   map[*nats.Subscription]int // NATS subscriptions → drops already counted

	msgs chan *nats.Msg // every subscription's deliveries, in wire order
	fwd  *queue[*nats.Msg]
	in   *queue[delivery]
	cur  *delivery // the delivery being injected: the injector goroutine's only

	seq atomic.Uint64

	ctx       context.Context // canceled by Close
	cancel    context.CancelFunc
	recvWG    sync.WaitGroup // receiver, injector
	wg        sync.WaitGroup // reconciler, forwarder
	closeOnce sync.Once
}

// New builds the hook on nc, the node's NATS connection (the JetStream
// engine's). Nothing is subscribed until the server starts.
func New(nc *nats.Conn, o Options) (*Hook, error) {
	o.withDefaults()
	err := o.validate()
	if nc == nil {
		err = errors.Join(err, errors.New("no NATS connection"))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadOptions, err)
	}
	h := &Hook{
		nc: nc, opts: o, log: zerolog.Nop(), m: newMetrics(),
		plainQ: nodeQueue(o.Prefix, o.Node), origin: o.Node,
		routes: map[string]*route{}, clients: map[string]map[string]struct{}{}, dirty: map[*route]struct{}{},
		kick: make(chan struct{}, 1), resync: make(chan struct{}, 1), byQueue: map[string]*route{}, subs: map[*nats.Subscription]int{},
		msgs: make(chan *nats.Msg, min(o.MaxPendingMessages, 8192)),
		fwd:  newQueue[*nats.Msg](o.MaxPendingMessages, o.MaxPendingBytes),
		in:   newQueue[delivery](o.MaxPendingMessages, o.MaxPendingBytes),
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	if o.Logger != nil {
		h.log = o.Logger.With().Str("component", "cluster").Logger()
	}
	h.seq.Store(uint64(time.Now().UnixNano())) // IDs of a restarted node do not repeat its last ones
	return h, nil
}

// Attach gives the hook the server it delivers other nodes' messages
// through. Call it once, before Serve.
func (h *Hook) Attach(s *mqtt.Server) {
	h.server = s
	h.inline = s.NewClient(nil, mqtt.LocalListener, inlineID, true)
	h.inline.Properties.ProtocolVersion = 5 // its publishes carry MQTT 5 properties (message expiry)
}

// ID implements mqtt.Hook.
func (h *Hook) ID() string { return "ferrymq-cluster" }

// Provides implements mqtt.Hook.
func (h *Hook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnStarted, mqtt.OnStopped, mqtt.OnSessionEstablished, mqtt.OnDisconnect, mqtt.OnClientExpired,
		mqtt.OnSubscribed, mqtt.OnUnsubscribed, mqtt.OnPublish, mqtt.OnPublished, mqtt.OnWillSent,
		mqtt.OnSelectSubscribers,
	}, []byte{b})
}

// Collectors returns the hook's metrics for a Prometheus registry.
func (h *Hook) Collectors() []prometheus.Collector {
	return []prometheus.Collector{h.m.forwarded, h.m.received, h.m.late, (*dropCollector)(h),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ferrymq_cluster_routes",
			Help: "MQTT filters of this node's sessions that NATS routes to it.",
		}, func() float64 {
			h.amu.RLock()
			defer h.amu.RUnlock()
			return float64(h.active.n)
		}),
	}
}

// OnStarted implements mqtt.Hook: the routes of the sessions mochi loaded
// are subscribed, and the hook's goroutines start.
func (h *Hook) OnStarted() {
	if h.server == nil {
		h.log.Error().Msg("cluster hook not attached to its server: nothing is routed")
		return
	}
	if !h.running.CompareAndSwap(false, true) {
		return
	}
	if h.ctx.Err() != nil {
		return // closed before it started
	}
	h.sweep()
	h.wg.Go(h.reconcile)
	h.wg.Go(h.forwardLoop)
	h.recvWG.Go(h.receiveLoop)
	h.recvWG.Go(h.injectLoop)
}

// OnStopped implements mqtt.Hook: mochi has closed every connection (wills
// are queued); the hook stops before the other hooks do.
func (h *Hook) OnStopped() { h.Close() }

// Stop implements mqtt.Hook.
func (h *Hook) Stop() error { h.Close(); return nil }

// Close stops routing: deliveries from other nodes stop, every NATS
// subscription is removed, and the publishes still queued are handed to
// the NATS connection (which the caller closes, flushing them). It returns
// once every goroutine of the hook has ended; safe to call more than once.
func (h *Hook) Close() {
	h.closeOnce.Do(func() {
		h.cancel()
		h.in.close()
		h.recvWG.Wait() // nothing is injected any more
		h.fwd.close()
		h.wg.Wait() // unsubscribed; queued publishes handed to NATS
		if h.running.Load() && h.nc.IsConnected() {
			if err := h.nc.FlushTimeout(time.Second); err != nil {
				h.log.Debug().Err(err).Msg("flush at close")
			}
		}
	})
}

// Routes returns the filters NATS routes to this node (their keys: shared
// ones as "$share/{group}/{filter}").
// Resync asks for a sweep now (routes of sessions the store parked without
// mochi, e.g. just adopted); it does not wait for it.
func (h *Hook) Resync() {
	select {
	case h.resync <- struct{}{}:
	default:
	}
}

func (h *Hook) Routes() []string {
	h.amu.RLock()
	defer h.amu.RUnlock()
	var out []string
	var walk func(n *tnode)
	walk = func(n *tnode) {
		for _, r := range n.routes {
			out = append(out, r.key)
		}
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(&h.active.root)
	return out
}

// OnSessionEstablished routes what a connecting client is subscribed to
// already: a resumed session's subscriptions (taken over, rebuilt from a
// parked session or from another node's) reach no OnSubscribed.
func (h *Hook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	if cl.Net.Inline {
		return
	}
	h.syncClient(cl)
}

// OnSubscribed routes the filters granted.
func (h *Hook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, codes []byte) {
	if cl.Net.Inline {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, f := range pk.Filters {
		if i < len(codes) && codes[i] < packets.ErrUnspecifiedError.Code {
			h.addLocked(cl.ID, f.Filter)
		}
	}
}

// OnUnsubscribed drops the routes of the filters given up (also for every
// filter of a session that ends with its connection: mochi's
// UnsubscribeClient).
func (h *Hook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	if cl.Net.Inline {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.currentLocked(cl) {
		return // another connection holds the session now
	}
	for _, f := range pk.Filters {
		h.removeLocked(cl.ID, f.Filter)
	}
}

// OnDisconnect drops the shared routes of the client (shared subscriptions
// are served by connected members only); a session that ends with the
// connection loses the rest through OnUnsubscribed.
func (h *Hook) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	if cl.Net.Inline || cl.IsTakenOver() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.currentLocked(cl) {
		h.dropClientLocked(cl.ID, true)
	}
}

// OnClientExpired drops every route of an offline session mochi expired.
func (h *Hook) OnClientExpired(cl *mqtt.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.currentLocked(cl) {
		h.dropClientLocked(cl.ID, false)
	}
}

// currentLocked: cl is the session mochi holds under its ID, or none is.
func (h *Hook) currentLocked(cl *mqtt.Client) bool {
	if h.server == nil {
		return true
	}
	cur, ok := h.server.Clients.Get(cl.ID)
	return !ok || cur == cl
}

// OnPublish gives a message from another node, as it enters the local
// server, its publisher's client ID: no-local subscriptions and parked
// sessions compare it with their own.
func (h *Hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl != h.inline || h.cur == nil {
		return pk, nil
	}
	if h.cur.client != "" {
		pk.Origin = h.cur.client
	}
	return pk, nil
}

// OnPublished forwards what a local client published (after mochi
// delivered it here) to the other nodes' subscribers. Not forwarded: what
// came from another node (the hook's inline client), and the bridge's
// downlink deliveries (origin under $ferrymq/), which every node makes
// itself.
func (h *Hook) OnPublished(cl *mqtt.Client, pk packets.Packet) {
	if cl == h.inline || pk.Ignore || isInternalOrigin(pk.Origin) {
		return
	}
	h.forward(pk)
}

// OnWillSent forwards a will mochi sent itself; the wills the gateway
// injects (Connect.WillFlag) went through OnPublished.
func (h *Hook) OnWillSent(_ *mqtt.Client, pk packets.Packet) {
	if pk.Connect.WillFlag {
		return
	}
	h.forward(pk)
}

// OnSelectSubscribers keeps shared groups to their connected members, and
// for a message from another node keeps only what this node must deliver:
// the shared groups NATS gave it the message for, and the plain
// subscribers when a plain copy came.
func (h *Hook) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	if h.server == nil {
		return subs
	}
	var d *delivery
	if pk.Connect.ClientIdentifier == inlineID {
		d = h.cur // set by injectLoop, whose goroutine runs this call
	}
	for key, members := range subs.Shared {
		if d != nil && !d.hasGroup(key) {
			delete(subs.Shared, key)
			continue
		}
		for id := range members {
			if cl, ok := h.server.Clients.Get(id); !ok || cl.Closed() {
				delete(members, id)
			}
		}
		if len(members) == 0 {
			delete(subs.Shared, key)
		}
	}
	if d != nil && !d.plain {
		clear(subs.Subscriptions)
		clear(subs.InlineSubscriptions)
	}
	return subs
}
