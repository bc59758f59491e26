package cluster

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Log field names.
const (
	logComponent = "component"
	logFilter    = "filter"
	logSubject   = "subject"
	logTopic     = "topic"
)

// Router routes MQTT publishes between the gateway nodes of a NATS
// cluster for one engine (doc.go). It is the engine's Hooks.Router (an
// engine.RouterPresence): build it with New, give it to engine.New, Attach
// it to the engine before the engine's Start, Start it after, and Close it
// after the engine's Shutdown (so that the wills the shutdown publishes
// still go out). It is safe for concurrent use.
type Router struct {
	opts   Options
	nc     *nats.Conn
	log    zerolog.Logger
	m      *metrics
	plainQ string         // queue group of this node's plain routes
	eng    *engine.Engine // set by Attach, before Start

	// mu guards what the local sessions want (routes.go). Taken under the
	// engine's session lock (Subscribed, Unsubscribed, Online).
	mu       sync.Mutex
	routes   map[string]*route         // by key
	sessions map[string]*sessionRoutes // by client ID
	dirty    map[*route]struct{}       // routes whose NATS subscriptions may need a change
	kick     chan struct{}             // wakes the reconciler

	// amu guards the routes as matching sees them: the table (every route
	// of routes), routes by queue group, and route.active.
	amu     sync.RWMutex
	table   table
	byQueue map[string]*route
	nActive int // routes NATS has

	failed map[*route]struct{} // the reconciler's own: routes NATS refused, tried again

	subsMu sync.Mutex
	subs   map[*nats.Subscription]int // NATS subscriptions → drops already counted

	msgs chan *nats.Msg // every subscription's deliveries, in wire order
	fwd  *queue[*nats.Msg]
	in   *queue[delivery]

	seq atomic.Uint64

	life    sync.Mutex // guards started and closed
	started bool
	closed  bool

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	recvWG sync.WaitGroup // receiver, injector
	wg     sync.WaitGroup // reconciler, forwarder
	once   sync.Once
}

var _ engine.RouterPresence = (*Router)(nil)

// New builds a router on Options.Conn. Nothing is subscribed or forwarded
// until Start; what the engine tells it before (the sessions it restores)
// is kept for then.
func New(o Options) (*Router, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	r := &Router{
		opts: o, nc: o.Conn, m: newMetrics(),
		log:    o.Logger.With().Str(logComponent, "cluster").Logger(),
		plainQ: nodeQueue(o.Prefix, o.Node),
		routes: map[string]*route{}, sessions: map[string]*sessionRoutes{}, dirty: map[*route]struct{}{},
		kick: make(chan struct{}, 1), byQueue: map[string]*route{}, failed: map[*route]struct{}{},
		subs: map[*nats.Subscription]int{},
		msgs: make(chan *nats.Msg, min(o.MaxPendingMessages, maxChanMessages)),
		fwd:  newQueue[*nats.Msg](o.MaxPendingMessages, o.MaxPendingBytes),
		in:   newQueue[delivery](o.MaxPendingMessages, o.MaxPendingBytes),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.seq.Store(uint64(time.Now().UnixNano())) // IDs of a restarted node do not repeat its last ones
	return r, nil
}

// Attach gives the router the engine it delivers other nodes' messages
// to. Call it once, before the engine's Start.
func (r *Router) Attach(e *engine.Engine) { r.eng = e }

// Start subscribes the routes the engine asked for so far and starts the
// router's goroutines: forwarding, receiving, delivering, and the
// reconciler that alone subscribes and unsubscribes on NATS.
func (r *Router) Start() error {
	r.life.Lock()
	defer r.life.Unlock()
	switch {
	case r.eng == nil:
		return ErrNotAttached
	case r.closed:
		return ErrClosed
	case r.started:
		return ErrStarted
	}
	r.started = true
	r.wg.Go(r.reconcile)
	r.wg.Go(r.forwardLoop)
	r.recvWG.Go(r.receiveLoop)
	r.recvWG.Go(r.injectLoop)
	return nil
}

// Close stops routing: deliveries from other nodes stop, every NATS
// subscription is removed, and the publishes still queued are handed to
// the NATS connection and flushed (the caller closes it). It returns once
// every goroutine of the router has ended; safe to call more than once.
// Calls from the engine after Close do nothing but count what they drop.
func (r *Router) Close() {
	r.once.Do(func() {
		r.life.Lock()
		r.closed = true
		started := r.started
		r.life.Unlock()
		r.cancel()
		r.in.close()
		r.recvWG.Wait() // nothing is delivered any more
		r.fwd.close()
		r.wg.Wait() // unsubscribed; queued publishes handed to NATS
		if started && r.nc.IsConnected() {
			if err := r.nc.FlushTimeout(time.Second); err != nil {
				r.log.Debug().Err(err).Msg("flush at close")
			}
		}
	})
}

// Collectors returns the router's metrics for a Prometheus registry.
func (r *Router) Collectors() []prometheus.Collector {
	return []prometheus.Collector{r.m.forwarded, r.m.received, r.m.late, (*dropCollector)(r),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ferrymq_cluster_routes",
			Help: "MQTT filters of this node's sessions that NATS routes to it.",
		}, func() float64 {
			r.amu.RLock()
			defer r.amu.RUnlock()
			return float64(r.nActive)
		}),
	}
}

// Routes returns the filters NATS routes to this node, sorted: plain ones
// as subscribed, shared ones as "$share/{group}/{filter}".
func (r *Router) Routes() []string {
	r.amu.RLock()
	defer r.amu.RUnlock()
	var out []string
	r.table.each(func(rt *route) {
		if rt.active {
			out = append(out, rt.key)
		}
	})
	slices.Sort(out)
	return out
}
