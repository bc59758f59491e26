package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/trace"
)

// runNATS runs a node on the JetStream engine (docs/engines.md): the
// queues, committed offsets and leases live in NATS, so any number of
// such nodes serve MQTT side by side. Every node runs the gateway, the
// bridge (uplink produces; downlink reads commands as its own broadcast
// member) and the trace recorder. The core services — consumer groups,
// retry, POP, delayed-delivery movers, transaction check-backs, the core
// TCP port and the HTTP API — run on the one node holding the "core" lease
// and move to another within the lease TTL when it dies.
func (o *serveOptions) runNATS(cmd *cobra.Command, n *node, log *zerolog.Logger) error {
	nc := o.file.NATS
	if len(o.natsURLs) == 0 {
		return fmt.Errorf("--engine nats needs --nats URL[,URL…] or nats.urls in the config")
	}
	tlsCfg, err := natsTLS(nc)
	if err != nil {
		return err
	}
	nodeName := cmp.Or(o.node, nc.Node, o.file.Bridge.Node, hostname())
	st := o.file.Store
	ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
	defer cancel()
	n.engine, err = jetstream.Open(ctx, jetstream.Options{
		URLs: o.natsURLs, Name: "ferrymq " + nodeName, CredsFile: nc.Creds, User: nc.User, Password: nc.Password, Token: nc.Token,
		TLS: tlsCfg, Replicas: nc.Replicas, DefaultQueues: st.DefaultQueues, DisableAutoCreate: st.AutoCreateTopics != nil && !*st.AutoCreateTopics,
		MaxAge: o.retention, MaxBytes: st.MaxDiskBytes, MaxMessageBytes: st.MaxMessageBytes, Timeout: time.Duration(nc.Timeout), Logger: log,
	})
	if err != nil {
		return err
	}
	n.base = n.engine
	var generated bool
	if o.token, generated, err = ensureToken(o.token, o.dataDir, o.coreAddr, o.httpAddr); err != nil {
		return err
	}
	if generated {
		// Every node must accept the same token (the core services move
		// between them): the first node's is kept in the bucket.
		if o.token, err = n.engine.Shared(ctx, "token", newToken); err != nil {
			return err
		}
		if err := writeTokenFile(o.dataDir, o.token); err != nil {
			return err
		}
		log.Warn().Str("file", filepath.Join(o.dataDir, tokenFile)).Msg("the core port or the HTTP API listens beyond loopback and no token was configured: using the cluster's generated one (shared by the nodes through NATS)")
	}
	n.token = o.token
	tc := o.file.Trace
	if n.trace, err = trace.New(n.engine, trace.Options{All: tc.All, Topics: tc.Topics, Node: nodeName, Sample: tc.Sample, Flush: "nats", Logger: log}); err != nil {
		return err
	}
	n.trace.Start()
	// The gateway produces delayed messages through a delay service of its
	// own that is never started: it only writes first copies; the leader's
	// service moves them.
	if n.producer, err = delay.New(n.engine, filepath.Join(o.dataDir, "delay-produce"), delay.Options{Logger: log, Trace: n.trace,
		MaxDelay: time.Duration(o.file.Delay.MaxDelay), MaxHold: time.Duration(o.file.Delay.MaxHold)}); err != nil {
		return fmt.Errorf("delayed delivery: %w", err)
	}
	// Every node sees every command: no node holds one for a client it does
	// not know (see runRemote).
	o.kv, o.kvNode = n.engine, nodeName
	bo := bridge.Options{Broker: n.producer.Broker(), MaxDelay: n.producer.MaxDelay(), Trace: n.trace, Node: nodeName, HoldUnknown: -1}
	if n.gateway, err = o.newGateway(bo, nil, log); err != nil {
		return err
	}
	n.sessions, n.nodeName, n.summary, n.router = o.sessions, nodeName, o.summary(), o.router
	n.summary.Engine, n.summary.NATS = "nats", len(o.natsURLs)
	n.switches = newCoreSwitches()
	// The election only says what this node should be; one goroutine
	// starts and stops the core services to match, so a slow start never
	// holds up lease renewals, and a failed start gives the lease back.
	out := cmd.OutOrStdout()
	want := make(chan bool, 1) // the latest state the election asked for
	n.election, err = n.engine.Elect(ctx, jetstream.LeaseOptions{Name: "core", Holder: nodeName, TTL: time.Duration(nc.LeaseTTL), Logger: log,
		OnChange: func(held bool) {
			select {
			case <-want: // superseded
			default:
			}
			want <- held
		}})
	if err != nil {
		return err
	}
	// A liveness lease per node: when one expires, the core lease holder
	// adopts the sessions that node had parked (adoptGone).
	if n.liveness, err = n.engine.Elect(ctx, jetstream.LeaseOptions{Name: "node." + nodeName, Holder: nodeName,
		TTL: time.Duration(nc.LeaseTTL), Logger: log}); err != nil {
		return err
	}
	n.nodeName = nodeName
	termCtx, stopTerms := context.WithCancel(context.Background())
	n.terms = make(chan struct{})
	n.stopTerms = stopTerms
	go func() {
		defer close(n.terms)
		running := false
		for {
			var held bool
			select {
			case <-termCtx.Done():
				if running {
					_ = n.stopTerm()
				}
				return
			case held = <-want:
			}
			switch {
			case held && !running:
				if err := n.startTerm(o, log); err != nil {
					log.Error().Err(err).Msg("core services did not start: giving the lease back")
					_ = n.stopTerm()
					n.election.Resign()
					continue
				}
				running = true
				fmt.Fprintf(out, "core  %s\n", n.core.Addr())
			case !held && running:
				running = false
				if err := n.stopTerm(); err != nil {
					log.Warn().Err(err).Msg("core services stopped with an error")
				}
			}
		}
	}()
	httpAddr, err := n.startGateway(cmd.OutOrStdout(), o.httpAddr, log)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "engine nats %v (node %s)\nhttp  %s\n", o.natsURLs, nodeName, httpAddr)
	log.Info().Strs("nats", o.natsURLs).Str("node", nodeName).Str("http", httpAddr.String()).Msg("serving (engine nats)")
	return n.runUntilDone(cmd.Context(), log)
}

// startTerm starts the core services for a term as lease holder and
// points the HTTP API at them.
func (n *node) startTerm(o *serveOptions, log *zerolog.Logger) error {
	if err := n.startCore(o, log); err != nil {
		return err
	}
	api, err := n.newHTTPAPI(log)
	if err != nil {
		return err
	}
	adm, err := n.adminHandler(log, true)
	if err != nil {
		return err
	}
	n.switches.set(api, adm, statsExtra(n.broker, n.groups))
	if n.sessions != nil {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		n.stopJanitor = func() { cancel(); <-done }
		go func() {
			defer close(done)
			n.adoptGone(ctx, max(time.Duration(o.file.NATS.LeaseTTL), 2*time.Second)/2, log)
		}()
	}
	log.Info().Str("core", n.core.Addr().String()).Msg("core services started: this node holds the core lease")
	return nil
}

func (n *node) stopTerm() error {
	n.switches.set(nil, nil, nil)
	if n.stopJanitor != nil {
		n.stopJanitor()
		n.stopJanitor = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.stopCore(ctx)
}

// adoptGone runs while this node holds the core lease: every period it
// lists the nodes' liveness leases, and when one went missing since the
// last look (or at the first look) the sessions parked on nodes without a
// lease are adopted here, so commands for them are queued again.
func (n *node) adoptGone(ctx context.Context, period time.Duration, log *zerolog.Logger) {
	var before map[string]bool
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-time.After(period):
			}
		}
		holders, err := n.engine.Holders(ctx, "", "node.")
		if err != nil {
			log.Debug().Err(err).Msg("liveness leases not listed")
			continue
		}
		alive := map[string]bool{n.nodeName: true}
		for _, h := range holders {
			alive[h] = true
		}
		lost := before == nil
		for node := range before {
			lost = lost || !alive[node]
		}
		before = alive
		if !lost {
			continue
		}
		// Adopted sessions are installed in the engine, which tells the
		// router of their subscriptions: they are routed here from now on.
		if _, err := n.sessions.AdoptGone(ctx, func(node string) bool { return alive[node] }); err != nil && ctx.Err() == nil {
			log.Warn().Err(err).Msg("sessions of gone nodes not adopted")
			before = nil // try again next time
		}
	}
}

// natsTLS builds the client TLS configuration of the nats section (nil
// when none is configured).
func natsTLS(c natsConfig) (*tls.Config, error) {
	if c.TLS.CA == "" && c.TLS.Cert == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLS.CA != "" {
		pem, err := os.ReadFile(c.TLS.CA)
		if err != nil {
			return nil, fmt.Errorf("nats tls ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("nats tls ca %s: no certificate", c.TLS.CA)
		}
		cfg.RootCAs = pool
	}
	if c.TLS.Cert != "" {
		cert, err := tls.LoadX509KeyPair(c.TLS.Cert, c.TLS.Key)
		if err != nil {
			return nil, fmt.Errorf("nats tls cert: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// coreSwitches route HTTP requests for the core services to the current
// term's handlers; while this node is not the lease holder the HTTP API
// answers 503 not_leader and the admin API serves its gateway part.
type coreSwitches struct {
	api, admin atomic.Pointer[http.Handler]
	extra      atomic.Pointer[func(ctx context.Context) map[string]any]
	standby    http.Handler // admin API without the core services
}

func newCoreSwitches() *coreSwitches { return &coreSwitches{} }

func (c *coreSwitches) set(api, admin http.Handler, extra func(ctx context.Context) map[string]any) {
	if api == nil {
		c.api.Store(nil)
		c.admin.Store(nil)
		c.extra.Store(nil)
		return
	}
	c.api.Store(&api)
	c.admin.Store(&admin)
	c.extra.Store(&extra)
}

func (c *coreSwitches) apiHandler(holder func() string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := c.api.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		notLeader(w, holder())
	})
}

func (c *coreSwitches) adminHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := c.admin.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		c.standby.ServeHTTP(w, r)
	})
}

func (c *coreSwitches) statsExtra(ctx context.Context) map[string]any {
	if f := c.extra.Load(); f != nil && *f != nil {
		return (*f)(ctx)
	}
	return map[string]any{}
}

func notLeader(w http.ResponseWriter, holder string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{
		"code":    "not_leader",
		"message": "the core services run on the node holding the core lease: " + cmp.Or(holder, "none yet"),
		"leader":  holder,
	}})
}
