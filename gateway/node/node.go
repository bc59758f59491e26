package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/httpapi"
	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/server"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/admin"
	"github.com/ferrymq/ferrymq/gateway/alarm"
	"github.com/ferrymq/ferrymq/gateway/cluster"
	"github.com/ferrymq/ferrymq/gateway/dashboard"
	"github.com/ferrymq/ferrymq/gateway/rpc"
	"github.com/ferrymq/ferrymq/gateway/shadowmqtt"
	"github.com/ferrymq/ferrymq/session"
)

// Node is a running ferrymq node: everything New started, in start order.
type Node struct {
	opts    Options
	log     *zerolog.Logger
	closers []func() error // auth providers: closed last, the gateway may authenticate while it stops

	store       *store.Store
	engine      *jetstream.Engine   // EngineNATS
	base        core.Broker         // store or engine
	election    *jetstream.Election // EngineNATS: who runs the core services
	producer    *delay.Service      // EngineNATS: delayed produce for the gateway on every node
	switches    *coreSwitches       // EngineNATS: HTTP handlers of the core services, set while leader
	liveness    *jetstream.Election // EngineNATS: this node's liveness lease
	router      *cluster.Router     // EngineNATS: MQTT routing between nodes
	stopJanitor func()              // EngineNATS: stops adoptGone of the current term
	terms       chan struct{}       // EngineNATS: closed when the goroutine starting/stopping core terms ended
	stopTerms   context.CancelFunc
	trace       *trace.Recorder
	sessions    *session.Store // the gateway's, for the admin API
	ownSessions bool           // sessions opened here (not given in Gateway.Hooks)
	nodeName    string
	summary     ConfigSummary // the configuration the admin API shows
	delay       *delay.Service
	broker      core.Broker // the engine with delayed delivery: what producers use
	txn         *txn.Service
	groups      *group.Coordinator
	retry       *retry.Service
	schedules   *retry.Service              // EngineNATS: retry's schedulers, while this node holds the core lease
	shards      *groupShards                // EngineNATS: which node serves each consumer group
	shardsRef   atomic.Pointer[groupShards] // shards, for the core election's goroutine (never cleared)
	pop         *pop.Service
	core        *server.Server
	bridge      *bridge.Hook
	rpc         *rpc.Service              // synchronous calls to devices
	liveCount   atomic.Pointer[liveCount] // EngineNATS: the other live nodes, for calls
	gateway     *gateway.Gateway
	remote      *client.Client                     // CoreRemote: the core server this gateway fronts
	coreBound   atomic.Pointer[string]             // the core port's bound address, once it listened (discovery)
	peers       peerAddrs                          // EngineNATS: the nodes' core addresses (placement)
	coreLease   atomic.Pointer[jetstream.Election] // election, kept after Shutdown clears that (the core port's readers)
	uplink      *client.Cluster                    // CoreRemote with several addresses: the uplink's sends, a breaker per core node
	token       string                             // required by the HTTP API (and the core port)
	http        *http.Server
	httpAddr    net.Addr
	httpCancel  context.CancelFunc // ends long polls in flight at shutdown
	httpDone    chan struct{}
	httpMux     *routeMux // its patterns, for the test of docs/openapi.yaml
	health      *health
	alarms      *alarm.Monitor
	alarmLog    *alarm.Log                   // where alarms stores its events (nil: in memory only)
	services    atomic.Pointer[coreServices] // the current term's, for health and alarms
	anonymous   []AnonymousListener          // set once the gateway is bound
	shadows     *shadow.Service              // Options.Shadows (not with CoreRemote)
	devices     *shadowmqtt.Devices          // the shadows' MQTT topics
}

// New builds a node and starts it: when New returns, every listener is
// bound (Addr, CoreAddr and HTTPAddr report the ports a ":0" got). ctx
// bounds only the start (dialling NATS or the remote core); the node runs
// until Shutdown. log receives every part's logs (nil: none), unless an
// Options section names its own Logger. On error, what had started is
// stopped again.
func New(ctx context.Context, o Options, log *zerolog.Logger) (_ *Node, err error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		nop := zerolog.Nop()
		log = &nop
	}
	n := &Node{opts: o, log: log, summary: o.summary()}
	n.peers.n = n
	defer func() {
		if err != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startFailedShutdown)
			_ = n.Shutdown(sctx)
			cancel()
		}
	}()
	switch {
	case o.CoreRemote != "":
		err = n.startRemote(ctx)
	case o.Engine == EngineNATS:
		err = n.startNATS(ctx)
	default:
		err = n.startEmbedded()
	}
	if err != nil {
		return nil, err
	}
	return n, nil
}

// Log field names.
const (
	logFile       = "file"
	logNode       = "node"
	logCore       = "core"
	logCoreRemote = "core_remote"
	logNATS       = "nats"
)

// startFailedShutdown bounds the stop of what a failed New had started.
const startFailedShutdown = 10 * time.Second

// startEmbedded runs the embedded engine in DataDir and every service over
// it, for the life of the node.
func (n *Node) startEmbedded() error {
	o := &n.opts
	so := o.Store
	if so.Logger == nil {
		so.Logger = n.log
	}
	var err error
	if n.store, err = store.Open(o.DataDir, so); err != nil {
		return fmt.Errorf("open store %s: %w", o.DataDir, err)
	}
	n.base = n.store
	var generated bool
	if n.token, generated, err = ensureToken(o.Token, o.DataDir, n.tokenAddrs()...); err != nil {
		return err
	}
	if generated {
		n.log.Warn().Str(logFile, filepath.Join(o.DataDir, TokenFile)).
			Msg("the core port or the HTTP API listens beyond loopback and no token was configured: generated one; clients read it from this file or FERRYMQ_TOKEN")
	}
	if o.Trace != nil {
		to := *o.Trace
		if to.Logger == nil {
			to.Logger = n.log
		}
		if n.trace, err = trace.New(n.store, to); err != nil {
			return fmt.Errorf("trace: %w", err)
		}
		n.trace.Start()
	}
	if err := n.startDelay(); err != nil {
		return err
	}
	if err := n.startShadowsEmbedded(); err != nil {
		return err
	}
	if o.Core != nil {
		if err := n.startCore(); err != nil {
			return err
		}
	}
	bo := o.Bridge
	bo.Broker, bo.Trace = n.broker, n.trace
	if n.delay != nil && bo.MaxDelay == 0 {
		bo.MaxDelay = n.delay.MaxDelay()
	}
	if err := n.newGateway(bo, n.store); err != nil {
		return err
	}
	n.nodeName = cmp.Or(o.NodeName, traceNode(o.Trace))
	n.gateway.Registry().MustRegister(newCoreCollector(n.delay, n.txn, n.trace))
	return n.startGateway()
}

// startRemote runs only the gateway, in front of the core server at
// CoreRemote: uplink produces there, downlink consumes there (each node
// its own broadcast offsets, the node being this process's client ID).
func (n *Node) startRemote(ctx context.Context) error {
	o := &n.opts
	name := fmt.Sprintf("%s-%d", cmp.Or(o.Bridge.Node, hostname()), os.Getpid())
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Addr: o.CoreRemote, Token: o.Token, ClientID: name, Logger: n.log})
	if err != nil {
		return fmt.Errorf("core-remote %s: %w", o.CoreRemote, err)
	}
	n.remote, n.token = c, o.Token
	if o.Trace != nil {
		// The gateway's hops go to the core server's trace topic, next to
		// the hops the core records, through a producer of their own: a
		// trace batch never queues in front of an uplink publish. The
		// remote core's flush policy is not known here.
		to := *o.Trace
		to.Flush = ""
		if to.Logger == nil {
			to.Logger = n.log
		}
		if n.trace, err = trace.New(remoteTrace{c: c, Core: bridge.Remote(c, n.log)}, to); err != nil {
			return fmt.Errorf("trace: %w", err)
		}
		n.trace.Start()
	}
	// Every node sees every command: holding one for a client none of them
	// knows would give an "expired" receipt from each node but one.
	bo := o.Bridge
	bo.Core, bo.Node, bo.Trace = bridge.Remote(c, n.log), name, n.trace
	if addrs := strings.Split(o.CoreRemote, ","); len(addrs) > 1 {
		// Uplink to every core node at once, each behind a circuit
		// breaker (client.Cluster): a node that fails or stalls is left
		// for the others, and a failed send tried on another.
		up, err := client.DialCluster(ctx, client.ClusterOptions{Addrs: addrs,
			Client: client.Options{Token: o.Token, ClientID: name + "-uplink", Logger: n.log}})
		if err != nil {
			return fmt.Errorf("core-remote %s: uplink: %w", o.CoreRemote, err)
		}
		n.uplink = up
		bo.Core = bridge.RemoteVia(c, up, n.log)
	}
	if bo.HoldUnknown == 0 {
		bo.HoldUnknown = -1
	}
	if err := n.newGateway(bo, nil); err != nil {
		return err
	}
	n.gateway.Registry().MustRegister(newCoreCollector(nil, nil, n.trace))
	if n.uplink != nil {
		n.gateway.Registry().MustRegister(newBreakerCollector(n.uplink))
	}
	n.log.Info().Str(logCoreRemote, o.CoreRemote).Str(logNode, name).Msg("gateway only")
	return n.startGateway()
}

// remoteTrace is the trace.Writer of a gateway in front of a remote core:
// it creates trace.Topic on the core server and appends to it over the
// gateway's connection (Core: ProduceAsync).
type remoteTrace struct {
	c *client.Client
	bridge.Core
}

func (r remoteTrace) CreateTopic(ctx context.Context, cfg core.TopicConfig) (core.TopicInfo, error) {
	info, err := r.c.CreateTopic(ctx, cfg.Name, cfg.Queues)
	if err != nil {
		return core.TopicInfo{}, err
	}
	return core.TopicInfo{Name: info.Name, Queues: info.Queues, CreatedAt: info.CreatedAt}, nil
}

// tokenAddrs are the addresses that need a token when they listen beyond
// loopback.
func (n *Node) tokenAddrs() []string {
	var addrs []string
	if n.opts.Core != nil {
		addrs = append(addrs, n.opts.Core.Addr)
	}
	return append(addrs, n.opts.HTTPAddr)
}

func traceNode(t *trace.Options) string {
	if t == nil {
		return ""
	}
	return t.Node
}

// newHTTPAPI is the HTTP produce/consume/query API over the core services.
func (n *Node) newHTTPAPI() (http.Handler, error) {
	o := httpapi.Options{Broker: n.broker, Pop: n.pop, Delay: n.delay, Trace: n.trace, Logger: n.log, MaxWait: httpAPIMaxWait,
		MaxBodyBytes: n.opts.HTTPMaxBodyBytes}
	if n.engine != nil {
		o.Elsewhere = n.httpElsewhere
	}
	return httpapi.New(o)
}

// startCore starts the core services over n.base: transactions, consumer
// groups, retry, POP and the core TCP server (delayed delivery runs
// already: startDelay). With the embedded engine they run for the life of
// the node; with the JetStream engine the core port runs for the life of
// the node (startCoreServer) and the services only while it holds the core
// lease (startTerm).
func (n *Node) startCore() error {
	if err := n.startServices(); err != nil {
		return err
	}
	if err := n.startCoreServer(n.broker, nil); err != nil {
		return err
	}
	n.coreStarted()
	return nil
}

// startServices starts transactions, consumer groups, retry and POP.
func (n *Node) startServices() error {
	if err := n.startTxn(); err != nil {
		return err
	}
	if err := n.startGroupServices(true); err != nil {
		return err
	}
	n.services.Store(&coreServices{groups: n.groups, retry: n.retry, delay: n.delay})
	return nil
}

// startTxn starts transactions over n.broker.
func (n *Node) startTxn() error {
	tco := n.opts.Core.Transactions
	if tco.Logger == nil {
		tco.Logger = n.log
	}
	var err error
	if n.txn, err = txn.New(n.broker, tco); err != nil {
		return fmt.Errorf("transactions: %w", err)
	}
	if err := n.txn.Start(context.Background()); err != nil {
		_ = n.txn.Close()
		n.txn = nil
		return fmt.Errorf("transactions: %w", err)
	}
	return nil
}

// retryOptions are Core.Retry with the node's defaults.
func (n *Node) retryOptions() retry.Options {
	ro := n.opts.Core.Retry
	if ro.Logger == nil {
		ro.Logger = n.log
	}
	if ro.Trace == nil {
		ro.Trace = n.trace
	}
	return ro
}

// startGroupServices starts consumer groups, retry (its schedulers only
// with schedule set: with the JetStream engine they run on the core lease
// holder, while every node sends messages back) and POP over n.base.
func (n *Node) startGroupServices(schedule bool) error {
	var err error
	if n.groups, err = group.New(n.base, group.Options{Logger: n.log, Trace: n.trace}); err != nil {
		return fmt.Errorf("consumer groups: %w", err)
	}
	n.groups.Start()
	if n.retry, err = retry.New(n.base, n.retryOptions()); err != nil {
		return fmt.Errorf("retry: %w", err)
	}
	if schedule {
		n.retry.Start()
	}
	if n.pop, err = pop.New(n.base, n.retry, pop.Options{Logger: n.log, Trace: n.trace}); err != nil {
		return fmt.Errorf("pop: %w", err)
	}
	n.pop.Start()
	return nil
}

// stopTermServices stops what a term of the core lease started: retry's
// schedulers, delayed delivery, transactions.
func (n *Node) stopTermServices() error {
	var errs []error
	if n.txn != nil {
		errs = append(errs, n.txn.Close())
		n.txn = nil
	}
	if n.delay != nil {
		errs = append(errs, n.delay.Close())
		n.delay = nil
	}
	if n.schedules != nil {
		errs = append(errs, n.schedules.Close())
		n.schedules = nil
	}
	return errors.Join(errs...)
}

// serverServices are the running services, as the core server takes them.
func (n *Node) serverServices() *server.Services {
	return &server.Services{Groups: n.groups, Retry: n.retry, Pop: n.pop, Delay: n.delay, Txn: n.txn}
}

// startCoreServer starts the core TCP server: with the services running
// (placement nil), or with none yet and placement saying where each shard
// is served (the JetStream engine: startServices hands them over).
func (n *Node) startCoreServer(broker core.Broker, placement func(context.Context, string) (server.Route, error)) error {
	co := n.opts.Core
	so := server.Options{Addr: co.Addr, MaxFrame: co.MaxFrameBytes, Broker: broker, Placement: placement,
		Trace: n.trace, Cluster: n.clusterInfo, Token: n.token, Version: n.version(), Calls: deviceCalls{n}, Logger: n.log}
	if placement == nil {
		so.Groups, so.Retry, so.Pop, so.Delay, so.Txn = n.groups, n.retry, n.pop, n.delay, n.txn
	}
	if n.shadows != nil { // not a typed nil in the interface
		so.Shadows = n.shadows
	}
	var err error
	if n.core, err = server.New(so); err != nil {
		return fmt.Errorf("core server: %w", err)
	}
	if err := n.core.Start(); err != nil {
		n.core = nil
		return fmt.Errorf("core server: %w", err)
	}
	bound := n.core.Addr().String()
	n.coreBound.Store(&bound)
	n.recordNodeInfo(context.Background()) // the bound port, for discovery
	return nil
}

// coreStarted tells Options.OnCore that the core services run here.
func (n *Node) coreStarted() {
	if n.opts.OnCore != nil {
		n.opts.OnCore(n.core.Addr())
	}
}

// startDelay starts delayed delivery over n.base; producers then use
// n.broker (n.base without it).
func (n *Node) startDelay() error {
	n.broker = n.base
	if n.opts.Delay == nil {
		return nil
	}
	opts := n.delayOptions()
	var err error
	if n.engine != nil { // cancellations must outlive this node's term as lease holder
		keep := cmp.Or(opts.MaxDelay, delay.DefaultMaxDelay) + delay.DefaultCancelKeep + 24*time.Hour
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		opts.Cancels, err = n.engine.DelayCancels(ctx, keep)
		cancel()
		if err != nil {
			return fmt.Errorf("delayed delivery: %w", err)
		}
	}
	if n.delay, err = delay.New(n.base, filepath.Join(n.opts.DataDir, "delay"), opts); err != nil {
		return fmt.Errorf("delayed delivery: %w", err)
	}
	n.delay.Start()
	n.broker = n.delay.Broker()
	return nil
}

// delayOptions are Options.Delay with the node's defaults.
func (n *Node) delayOptions() delay.Options {
	opts := *n.opts.Delay
	if opts.Logger == nil {
		opts.Logger = n.log
	}
	if opts.Trace == nil {
		opts.Trace = n.trace
	}
	if opts.MaxHold == 0 && n.opts.Store.Retention > 0 {
		// A copy must outlive its hold: keep holds at most a third of the
		// retention (the default 2^16 s against the default 72 h).
		opts.MaxHold = delay.DefaultMaxHold
		for opts.MaxHold > time.Second && opts.MaxHold > n.opts.Store.Retention/3 {
			opts.MaxHold /= 2
		}
	}
	return opts
}

// startHTTP serves the HTTP API (produce and POP consume), the admin API,
// the dashboard and the stats endpoint on Options.HTTPAddr.
func (n *Node) startHTTP() error {
	h := &routeMux{ServeMux: http.NewServeMux()}
	n.httpMux = h
	var so gateway.StatsOptions
	if n.switches != nil { // engine nats: the node-wide services follow the lease
		standby, err := n.adminHandler(n.groups != nil) // topics and the groups served here, on every node
		if err != nil {
			return err
		}
		n.switches.standby = standby
		api, err := httpapi.New(httpapi.Options{Broker: n.frontBroker(), Pop: n.pop, Trace: n.trace, Logger: n.log, MaxWait: httpAPIMaxWait,
			MaxBodyBytes: n.opts.HTTPMaxBodyBytes, Elsewhere: n.httpElsewhere})
		if err != nil {
			return fmt.Errorf("http api: %w", err)
		}
		n.switches.standbyAPI = api
		h.Handle("/api/", requireToken(n.token, n.switches.apiHandler()))
		for _, p := range admin.Patterns() {
			h.Handle(p, requireToken(n.token, n.switches.adminHandler()))
		}
		so.Extra = n.switches.statsExtra
		so.Checks = append(so.Checks, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return n.engine.Ready(ctx)
		})
	}
	if n.store != nil && n.pop != nil {
		api, err := n.newHTTPAPI()
		if err != nil {
			return fmt.Errorf("http api: %w", err)
		}
		h.Handle("/api/", requireToken(n.token, api))
	}
	if n.switches == nil {
		adm, err := n.adminHandler(n.store != nil && n.groups != nil)
		if err != nil {
			return err
		}
		for _, p := range admin.Patterns() {
			h.Handle(p, requireToken(n.token, adm))
		}
	}
	if n.store != nil { // topics and group lag for /stats and the dashboard
		so.Extra = statsExtra(n.broker, n.groups)
		so.Checks = append(so.Checks, n.health.storeReady)
	}
	if m := n.alarms; m != nil {
		h.Handle("GET /api/v1/alarms", requireToken(n.token, m.Handler()))
		so.Extra = withAlarms(so.Extra, m)
	}
	so.Extra = withSecurity(so.Extra, n.anonymous)
	h.Handle("/", n.gateway.StatsHandlerWith(so))
	dash := dashboard.Handler(dashboard.Options{})
	h.Handle("GET /{$}", dash)
	h.Handle("GET "+dashboard.AssetPrefix, dash)
	ln, err := net.Listen("tcp", n.opts.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen http %s: %w", n.opts.HTTPAddr, err)
	}
	base, cancel := context.WithCancel(context.Background())
	n.httpCancel = cancel
	n.http = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      httpAPIMaxWait + 30*time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          stdlog.New(io.Discard, "", 0),
	}
	n.httpAddr = ln.Addr()
	n.httpDone = make(chan struct{})
	go func() {
		defer close(n.httpDone)
		if err := n.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error().Err(err).Msg("http server")
		}
	}()
	return nil
}

// startGateway serves HTTP (if configured), then starts the MQTT
// listeners.
func (n *Node) startGateway() error {
	if err := n.newAlarms(); err != nil {
		return err
	}
	if n.opts.HTTPAddr != "" {
		if err := n.startHTTP(); err != nil {
			return err
		}
	}
	if err := n.gateway.Start(); err != nil {
		return fmt.Errorf("start gateway: %w", err)
	}
	if n.alarms != nil {
		n.alarms.Start()
	}
	return nil
}

// Shutdown stops the node: the alarms and (engine nats) the core term's
// services, then the MQTT gateway (wills and in-flight publishes still go
// into the core), the HTTP server, the leases, the core port and services,
// the session store (after the gateway and the core: both write
// to it), the trace recorder, the engine and the auth providers. It
// returns once every goroutine the node started has ended, with every
// error met on the way; ctx bounds the waits for connections to drain.
// Safe to call twice.
func (n *Node) Shutdown(ctx context.Context) error {
	var errs []error
	if n.alarms != nil {
		errs = append(errs, n.alarms.Close()) // its probes read everything below
		n.alarms = nil
	}
	if n.alarmLog != nil {
		if err := n.alarmLog.Close(); err != nil {
			n.log.Warn().Err(err).Msg("alarm events the store refused are lost")
		}
		n.alarmLog = nil
	}
	if n.stopTerms != nil {
		// The core term's goroutine first: a term starting now reads the
		// fields cleared below (the gateway, for the admin API). The core
		// services stop; the lease is given up below.
		n.stopTerms()
		<-n.terms
		n.stopTerms = nil
	}
	if n.gateway != nil {
		errs = append(errs, n.gateway.Shutdown(ctx))
		n.gateway = nil
	}
	if n.rpc != nil {
		// After the engine: no answer comes any more. The field stays: the
		// core port, closed later, may still take a call (ErrClosed).
		errs = append(errs, n.rpc.Close())
	}
	if n.router != nil {
		n.router.Close() // after the engine: the wills its shutdown published went out
		n.router = nil
	}
	if n.remote != nil {
		// The gateway's last hops go out before the connection they use
		// closes.
		errs = append(errs, n.trace.Close())
		n.trace = nil
		if n.uplink != nil {
			errs = append(errs, n.uplink.Close())
			n.uplink = nil
		}
		errs = append(errs, n.remote.Close())
		n.remote = nil
	}
	if n.http != nil {
		n.httpCancel() // long polls return at once
		errs = append(errs, n.http.Shutdown(ctx))
		<-n.httpDone
		n.http = nil
	}
	if n.liveness != nil {
		errs = append(errs, n.liveness.Close())
		n.liveness = nil
	}
	if n.election != nil {
		errs = append(errs, n.election.Close()) // gives up the lease
		n.election = nil
	}
	if n.sessions != nil {
		// After the engine (it wrote its last changes) and the core term
		// (its janitor adopts gone nodes' sessions); before NATS closes.
		if n.ownSessions {
			errs = append(errs, n.sessions.Close())
		}
		n.sessions = nil
	}
	errs = append(errs, n.stopCore(ctx))
	errs = append(errs, n.stopShadows()) // after the gateway, the HTTP API and the core port, before the store or engine
	if n.trace != nil {
		errs = append(errs, n.trace.Close()) // after everything that records
		n.trace = nil
	}
	if n.producer != nil {
		errs = append(errs, n.producer.Close())
		n.producer = nil
	}
	if n.store != nil {
		if err := n.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
		n.store = nil
	}
	if n.engine != nil {
		errs = append(errs, n.engine.Close())
		n.engine = nil
	}
	for _, f := range n.closers {
		errs = append(errs, f())
	}
	n.closers = nil
	return errors.Join(errs...)
}

// stopCore stops what startCore and startDelay started, in reverse order.
func (n *Node) stopCore(ctx context.Context) error {
	var errs []error
	if n.core != nil {
		errs = append(errs, n.core.Shutdown(ctx))
		n.core = nil
	}
	return errors.Join(append(errs, n.stopServices())...)
}

// stopServices stops what startServices, startGroupServices and
// startDelay started, in reverse order; a core port that outlives them
// answers their requests as not served here.
func (n *Node) stopServices() error {
	n.services.Store(nil)
	if n.core != nil {
		n.core.SetServices(nil)
	}
	errs := []error{n.stopTermServices()}
	if n.shards != nil { // after the core port: no request asks for a group any more
		errs = append(errs, n.shards.close())
		n.shards = nil
	}
	if n.pop != nil {
		errs = append(errs, n.pop.Close())
		n.pop = nil
	}
	if n.retry != nil {
		errs = append(errs, n.retry.Close())
		n.retry = nil
	}
	if n.groups != nil {
		errs = append(errs, n.groups.Close())
		n.groups = nil
	}
	return errors.Join(errs...)
}

func (n *Node) version() string { return cmp.Or(n.opts.Version, DefaultVersion) }

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// Addr is the bound address of the MQTT listener named name ("tcp", "ws",
// or a TLS listener's name), nil if there is none.
func (n *Node) Addr(name string) net.Addr {
	if n.gateway == nil {
		return nil
	}
	return n.gateway.Addr(name)
}

// Listeners are the names of the MQTT listeners, in start order.
func (n *Node) Listeners() []string {
	if n.gateway == nil {
		return nil
	}
	return n.gateway.Listeners()
}

// CoreAddr is the bound address of the core TCP port, nil without one
// (Core nil, CoreRemote). With EngineNATS every node has one; the
// stateful services behind it run on the core lease holder (Options.OnCore
// says when they start here).
func (n *Node) CoreAddr() net.Addr {
	if n.core == nil {
		return nil
	}
	return n.core.Addr()
}

// HTTPAddr is the bound address of the HTTP server, nil without one.
func (n *Node) HTTPAddr() net.Addr { return n.httpAddr }

// Gateway is the MQTT gateway.
func (n *Node) Gateway() *gateway.Gateway { return n.gateway }

// Bridge is the bridge between MQTT and the core.
func (n *Node) Bridge() *bridge.Hook { return n.bridge }

// RPC returns the node's service of synchronous calls to devices.
func (n *Node) RPC() *rpc.Service { return n.rpc }

// Store is the embedded engine's store; nil with EngineNATS or CoreRemote.
func (n *Node) Store() *store.Store { return n.store }

// Broker is what producers on this node use: the engine with delayed
// delivery, when it runs. Nil with CoreRemote, and with EngineNATS it is
// the engine itself.
func (n *Node) Broker() core.Broker {
	if n.engine != nil {
		return n.engine
	}
	if n.remote != nil {
		return nil
	}
	return n.broker
}

// Sessions is the gateway's session store, nil without one.
func (n *Node) Sessions() *session.Store { return n.sessions }

// Delay is the delayed delivery service (Options.Delay, embedded engine),
// or nil.
func (n *Node) Delay() *delay.Service {
	if n.engine != nil {
		return nil
	}
	return n.delay
}

// Trace is the trace recorder (Options.Trace), or nil.
func (n *Node) Trace() *trace.Recorder { return n.trace }

// Groups is the consumer-group coordinator (Options.Core, embedded
// engine), or nil.
func (n *Node) Groups() *group.Coordinator {
	if n.engine != nil {
		return nil
	}
	return n.groups
}

// Shadows is the device shadow service (Options.Shadows), or nil.
func (n *Node) Shadows() *shadow.Service { return n.shadows }

// Token is what callers of the core port and the HTTP API present ("" when
// none is needed), generated or given.
func (n *Node) Token() string { return n.token }

// NodeName is this node's name on a NATS cluster ("" otherwise).
func (n *Node) NodeName() string {
	if n.engine == nil {
		return ""
	}
	return n.nodeName
}
