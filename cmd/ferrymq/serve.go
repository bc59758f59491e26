package main

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
	"runtime/pprof"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

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
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/admin"
	"github.com/ferrymq/ferrymq/gateway/cluster"
	"github.com/ferrymq/ferrymq/gateway/dashboard"
	"github.com/ferrymq/ferrymq/session"
)

type serveOptions struct {
	config    string
	dataDir   string
	flush     string
	segment   int64
	retention time.Duration
	coreAddr  string
	httpAddr  string
	mqttAddr  string
	wsAddr    string
	remote    string
	token     string
	cpuProf   string
	file      fileConfig     // from --config; flags win
	closers   []func() error // closed when serve returns (auth providers)
	sessions  *session.Store // the gateway's session store, once built
	logLevel  string
	logPretty bool
	engine    string            // embedded or nats
	natsURLs  []string          // --nats
	kv        *jetstream.Engine // engine nats: where the gateway keeps sessions
	kvNode    string            // engine nats: this node's name
	node      string            // --node
	router    *cluster.Router   // engine nats: MQTT routing between nodes
}

func (o *serveOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.config, "config", "", "YAML config file (unknown keys are errors); flags override it")
	f.StringVar(&o.dataDir, "data", "./data", "data directory")
	f.StringVar(&o.flush, "flush", "async", "flush policy: async (ack in page cache, fsync every 500 ms) or sync (ack after fsync)")
	f.Int64Var(&o.segment, "segment-bytes", 1<<30, "commit-log segment size in bytes")
	f.DurationVar(&o.retention, "retention", 72*time.Hour, "delete commit-log segments older than this")
	f.StringVar(&o.coreAddr, "core", ":10911", "address of the core wire protocol (TCP) for backend services")
	f.StringVar(&o.httpAddr, "http", ":18083", "address of the HTTP API (produce, POP consume) and the stats endpoint (/metrics, /stats, /healthz, /readyz)")
	f.StringVar(&o.mqttAddr, "mqtt", ":1883", "address of the MQTT listener (TCP); empty disables it")
	f.StringVar(&o.wsAddr, "ws", ":8083", "address of the MQTT WebSocket listener (path /mqtt); empty disables it")
	f.StringVar(&o.remote, "core-remote", "", "run only the MQTT gateway, in front of the core server at this address (no local store; sessions stay in --data)")
	f.StringVar(&o.token, "token", "", "token core clients must present (default: none); also read from FERRYMQ_TOKEN")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.BoolVar(&o.logPretty, "log-pretty", false, "human-readable logs instead of JSON lines")
	f.StringVar(&o.cpuProf, "cpu-profile", "", "write a CPU profile (pprof) of the whole run to this file")
	f.StringVar(&o.engine, "engine", "embedded", "queue engine: embedded (commit log in --data) or nats (a NATS JetStream cluster, see --nats)")
	f.StringSliceVar(&o.natsURLs, "nats", nil, "NATS server URLs for --engine nats (comma-separated; config: nats.urls)")
	f.StringVar(&o.node, "node", "", "this node's name, unique among the nodes of one NATS cluster (config: nats.node; default the host name)")
}

func newServeCmd() *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the server: the MQTT gateway, the embedded store, the core TCP protocol and the HTTP API",
		Example: `  ferrymq serve
  ferrymq serve --data /var/lib/ferrymq --flush sync --mqtt :1883 --core 127.0.0.1:10911
  ferrymq serve --config testdata/ferrymq.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	o.AddFlags(cmd)
	return cmd
}

// node is everything serve runs, in start order.
type node struct {
	store       *store.Store
	engine      *jetstream.Engine   // --engine nats
	base        core.Broker         // store or engine
	election    *jetstream.Election // --engine nats: who runs the core services
	producer    *delay.Service      // --engine nats: delayed produce for the gateway on every node
	switches    *coreSwitches       // --engine nats: HTTP handlers of the core services, set while leader
	liveness    *jetstream.Election // --engine nats: this node's liveness lease
	router      *cluster.Router     // --engine nats: MQTT routing between nodes
	stopJanitor func()              // --engine nats: stops adoptGone of the current term
	terms       chan struct{}       // --engine nats: closed when the goroutine starting/stopping core terms ended
	stopTerms   context.CancelFunc
	trace       *trace.Recorder
	sessions    *session.Store // the gateway's, for the admin API
	nodeName    string
	summary     configSummary // the configuration the admin API shows
	delay       *delay.Service
	broker      core.Broker // the store with delayed delivery: what producers use
	txn         *txn.Service
	groups      *group.Coordinator
	retry       *retry.Service
	pop         *pop.Service
	core        *server.Server
	gateway     *gateway.Gateway
	remote      *client.Client // --core-remote: the core server this gateway fronts
	token       string         // required by the HTTP API (and the core port)
	http        *http.Server
	httpCancel  context.CancelFunc // ends long polls in flight at shutdown
	httpDone    chan struct{}
}

// applyConfig takes from the config file every setting whose flag was not
// given.
func (o *serveOptions) applyConfig(cmd *cobra.Command) error {
	if o.config == "" {
		return nil
	}
	cfg, err := loadConfig(o.config)
	if err != nil {
		return err
	}
	o.file = cfg
	set := func(flag string, apply func()) {
		if !cmd.Flags().Changed(flag) {
			apply()
		}
	}
	if cfg.Data != "" {
		set("data", func() { o.dataDir = cfg.Data })
	}
	if cfg.Flush != "" {
		set("flush", func() { o.flush = cfg.Flush })
	}
	if cfg.Log.Level != "" {
		set("log-level", func() { o.logLevel = cfg.Log.Level })
	}
	if cfg.Log.Pretty {
		set("log-pretty", func() { o.logPretty = true })
	}
	if cfg.Store.SegmentBytes != 0 {
		set("segment-bytes", func() { o.segment = cfg.Store.SegmentBytes })
	}
	if cfg.Store.Retention != 0 {
		set("retention", func() { o.retention = time.Duration(cfg.Store.Retention) })
	}
	if cfg.Core.Addr != "" {
		set("core", func() { o.coreAddr = cfg.Core.Addr })
	}
	if cfg.Core.Token != "" {
		set("token", func() { o.token = cfg.Core.Token })
	}
	if cfg.HTTP.Addr != "" {
		set("http", func() { o.httpAddr = cfg.HTTP.Addr })
	}
	if cfg.MQTT.Addr != nil {
		set("mqtt", func() { o.mqttAddr = *cfg.MQTT.Addr })
	}
	if cfg.MQTT.WS.Addr != nil {
		set("ws", func() { o.wsAddr = *cfg.MQTT.WS.Addr })
	}
	if cfg.Engine != "" {
		set("engine", func() { o.engine = cfg.Engine })
	}
	if len(cfg.NATS.URLs) > 0 {
		set("nats", func() { o.natsURLs = cfg.NATS.URLs })
	}
	return nil
}

func (o *serveOptions) run(cmd *cobra.Command) error {
	if err := o.applyConfig(cmd); err != nil {
		return err
	}
	log, err := newLogger(stderr, o.logPretty, o.logLevel)
	if err != nil {
		return fmt.Errorf("log level: %w", err)
	}
	if o.token == "" {
		o.token = getenv("FERRYMQ_TOKEN")
	}
	if o.cpuProf != "" {
		f, err := os.Create(o.cpuProf)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	defer func() { // after the node: the gateway may still authenticate while it stops
		for _, f := range o.closers {
			_ = f()
		}
	}()
	n := &node{}
	defer n.close(context.Background())
	if o.remote != "" {
		return o.runRemote(cmd, n, &log)
	}
	switch o.engine {
	case "nats":
		return o.runNATS(cmd, n, &log)
	case "embedded", "":
	default:
		return fmt.Errorf("engine %q: want embedded or nats", o.engine)
	}
	st := o.file.Store
	n.store, err = store.Open(o.dataDir, store.Options{
		Logger:            &log,
		FlushPolicy:       store.FlushPolicy(o.flush),
		SegmentBytes:      o.segment,
		Retention:         o.retention,
		MaxDiskBytes:      st.MaxDiskBytes,
		MaxMessageBytes:   st.MaxMessageBytes,
		DefaultQueues:     st.DefaultQueues,
		DisableAutoCreate: st.AutoCreateTopics != nil && !*st.AutoCreateTopics,
	})
	if err != nil {
		return fmt.Errorf("open store %s: %w", o.dataDir, err)
	}
	var generated bool
	if o.token, generated, err = ensureToken(o.token, o.dataDir, o.coreAddr, o.httpAddr); err != nil {
		return err
	}
	if generated {
		log.Warn().Str("file", filepath.Join(o.dataDir, tokenFile)).
			Msg("the core port or the HTTP API listens beyond loopback and no token was configured: generated one; clients read it from this file or FERRYMQ_TOKEN")
	}
	tc := o.file.Trace
	if n.trace, err = trace.New(n.store, trace.Options{All: tc.All, Topics: tc.Topics, Node: cmp.Or(tc.Node, hostname()), Sample: tc.Sample, Flush: o.flush, Logger: &log}); err != nil {
		return err
	}
	n.trace.Start()
	n.base = n.store
	if err := n.startCore(o, &log); err != nil {
		return err
	}
	n.token = o.token
	if n.gateway, err = o.newGateway(bridge.Options{Broker: n.broker, MaxDelay: n.delay.MaxDelay(), Trace: n.trace}, n.store, &log); err != nil {
		return err
	}
	n.sessions, n.nodeName, n.summary = o.sessions, o.file.Trace.Node, o.summary()
	n.gateway.Registry().MustRegister(newCoreCollector(n.delay, n.txn, n.trace))
	httpAddr, err := n.startGateway(cmd.OutOrStdout(), o.httpAddr, &log)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "core  %s\nhttp  %s\ndata  %s (flush %s)\n", n.core.Addr(), httpAddr, o.dataDir, o.flush)
	log.Info().Str("data", o.dataDir).Str("flush", o.flush).Str("core", n.core.Addr().String()).Str("http", httpAddr.String()).Msg("serving")

	return n.runUntilDone(cmd.Context(), &log)
}

// runUntilDone waits for the end of serve (SIGINT, SIGTERM) and stops the
// node, giving it 10 s.
func (n *node) runUntilDone(ctx context.Context, log *zerolog.Logger) error {
	<-ctx.Done()
	log.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.close(sctx)
}

// httpAPIMaxWait bounds a long poll of the HTTP API.
const httpAPIMaxWait = 30 * time.Second

// newHTTPAPI is the HTTP produce/consume/query API over the core services.
func (n *node) newHTTPAPI(log *zerolog.Logger) (http.Handler, error) {
	return httpapi.New(httpapi.Options{Broker: n.broker, Pop: n.pop, Delay: n.delay, Trace: n.trace, Logger: log, MaxWait: httpAPIMaxWait})
}

// startCore starts the core services over n.base: delayed delivery and
// transactions, consumer groups, retry, POP and the core TCP server. With
// the embedded engine they run for the life of the process; with the
// JetStream engine only while this node holds the core lease.
func (n *node) startCore(o *serveOptions, log *zerolog.Logger) error {
	var err error
	if err := n.startDelayAndTxn(o, log); err != nil {
		return err
	}
	if n.groups, err = group.New(n.base, group.Options{Logger: log, Trace: n.trace}); err != nil {
		return err
	}
	n.groups.Start()
	ro := retry.Options{Logger: log, Trace: n.trace, MaxAttempts: o.file.Retry.MaxAttempts}
	for _, d := range o.file.Retry.Schedule {
		ro.Schedule = append(ro.Schedule, time.Duration(d))
	}
	if n.retry, err = retry.New(n.base, ro); err != nil {
		return err
	}
	n.retry.Start()
	if n.pop, err = pop.New(n.base, n.retry, pop.Options{Logger: log, Trace: n.trace}); err != nil {
		return err
	}
	n.pop.Start()
	n.core, err = server.New(server.Options{Addr: o.coreAddr, Broker: n.broker, Groups: n.groups, Retry: n.retry, Pop: n.pop,
		Delay: n.delay, Txn: n.txn, Trace: n.trace,
		Token: o.token, Version: "ferrymq " + buildVersion(), Logger: log})
	if err != nil {
		return err
	}
	if err := n.core.Start(); err != nil {
		n.core = nil
		return err
	}
	return nil
}

// startDelayAndTxn starts delayed delivery over the store and transactions
// over that; producers then use n.broker.
func (n *node) startDelayAndTxn(o *serveOptions, log *zerolog.Logger) error {
	st := o.file.Store
	cfg := o.file.Delay
	opts := delay.Options{Logger: log, Trace: n.trace, MaxDelay: time.Duration(cfg.MaxDelay), MaxHold: time.Duration(cfg.MaxHold),
		DisableAutoCreate: st.AutoCreateTopics != nil && !*st.AutoCreateTopics}
	if opts.MaxHold == 0 {
		// A copy must outlive its hold: keep holds at most a third of the
		// retention (the default 2^16 s against the default 72 h).
		opts.MaxHold = delay.DefaultMaxHold
		for o.retention > 0 && opts.MaxHold > time.Second && opts.MaxHold > o.retention/3 {
			opts.MaxHold /= 2
		}
	}
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
	if n.delay, err = delay.New(n.base, filepath.Join(o.dataDir, "delay"), opts); err != nil {
		return fmt.Errorf("delayed delivery: %w", err)
	}
	n.delay.Start()
	n.broker = n.delay.Broker()
	tc := o.file.Transactions
	if n.txn, err = txn.New(n.broker, txn.Options{Logger: log, FirstCheck: time.Duration(tc.FirstCheck),
		CheckInterval: time.Duration(tc.CheckInterval), MaxChecks: tc.MaxChecks, MaxPending: tc.MaxPending}); err != nil {
		return fmt.Errorf("transactions: %w", err)
	}
	if err := n.txn.Start(context.Background()); err != nil {
		_ = n.txn.Close()
		n.txn = nil
		return fmt.Errorf("transactions: %w", err)
	}
	return nil
}

// startHTTP serves the HTTP API (produce and POP consume) on addr.
func (n *node) startHTTP(addr string, log *zerolog.Logger) (net.Addr, error) {
	h := http.NewServeMux()
	var so gateway.StatsOptions
	if n.switches != nil { // engine nats: the core services follow the lease
		standby, err := n.adminHandler(log, false)
		if err != nil {
			return nil, err
		}
		n.switches.standby = standby
		h.Handle("/api/", requireToken(n.token, n.switches.apiHandler(n.election.Holder)))
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
	if n.store != nil {
		api, err := n.newHTTPAPI(log)
		if err != nil {
			return nil, err
		}
		h.Handle("/api/", requireToken(n.token, api))
	}
	if n.switches == nil {
		if err := n.mountAdmin(h, log); err != nil {
			return nil, err
		}
	}
	if n.store != nil { // topics and group lag for /stats and the dashboard
		so.Extra = statsExtra(n.broker, n.groups)
	}
	h.Handle("/", n.gateway.StatsHandlerWith(so))
	dash := dashboard.Handler(dashboard.Options{})
	h.Handle("GET /{$}", dash)
	h.Handle("GET "+dashboard.AssetPrefix, dash)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen http %s: %w", addr, err)
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
	n.httpDone = make(chan struct{})
	go func() {
		defer close(n.httpDone)
		if err := n.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("http server")
		}
	}()
	return ln.Addr(), nil
}

// close stops what started, in reverse order; safe to call twice.
func (n *node) close(ctx context.Context) error {
	var errs []error
	if n.gateway != nil {
		// First: wills and in-flight publishes still go into the core.
		errs = append(errs, n.gateway.Shutdown(ctx))
		n.gateway = nil
	}
	if n.router != nil {
		n.router.Close() // after the engine: the wills its shutdown published went out
		n.router = nil
	}
	if n.remote != nil {
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
		n.stopTerms()                           // and the core services stop
		<-n.terms
		n.election = nil
	}
	if n.sessions != nil {
		// After the engine (it wrote its last changes) and the core term
		// (its janitor adopts gone nodes' sessions); before NATS closes.
		errs = append(errs, n.sessions.Close())
		n.sessions = nil
	}
	errs = append(errs, n.stopCore(ctx))
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
	return errors.Join(errs...)
}

// stopCore stops what startCore started, in reverse order.
func (n *node) stopCore(ctx context.Context) error {
	var errs []error
	if n.core != nil {
		errs = append(errs, n.core.Shutdown(ctx))
		n.core = nil
	}
	if n.txn != nil {
		errs = append(errs, n.txn.Close())
		n.txn = nil
	}
	if n.delay != nil {
		errs = append(errs, n.delay.Close())
		n.delay = nil
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

func hostname() string {
	h, _ := os.Hostname()
	return h
}
