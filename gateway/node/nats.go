package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/server"
	"github.com/ferrymq/ferrymq/core/trace"
)

// startNATS runs a node on the JetStream engine (docs/engines.md): the
// queues, committed offsets and leases live in NATS, so any number of
// such nodes serve MQTT side by side. Every node runs the gateway, the
// bridge (uplink produces; downlink reads commands as its own broadcast
// member) and the trace recorder. The core services — consumer groups,
// retry, POP, delayed-delivery movers, transaction check-backs, the core
// TCP port and the HTTP API — run on the one node holding the "core" lease
// and move to another within the lease TTL when it dies.
func (n *Node) startNATS(ctx context.Context) error {
	o := &n.opts
	nc := o.NATS
	n.nodeName = cmp.Or(o.NodeName, o.Bridge.Node, hostname())
	st := o.Store
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// A cluster whose leaders are being elected (a restarted node, a killed
	// stream leader) does not answer the engine's setup for a while: ride
	// it out like the steps below, instead of exiting.
	err := n.whileUnavailable(ctx, "engine nats", func() (err error) {
		n.engine, err = jetstream.Open(ctx, jetstream.Options{
			URLs: nc.URLs, Name: "ferrymq " + n.nodeName, CredsFile: nc.Creds, User: nc.User, Password: nc.Password, Token: nc.Token,
			TLS: nc.TLS, Replicas: nc.Replicas, DefaultQueues: st.DefaultQueues, DisableAutoCreate: st.DisableAutoCreate,
			MaxAge: st.Retention, MaxBytes: st.MaxDiskBytes, MaxMessageBytes: st.MaxMessageBytes, Timeout: nc.Timeout, Logger: n.log,
			MirrorOf: nc.MirrorOf,
		})
		return err
	})
	if err != nil {
		return err // it names the step
	}
	n.base = n.engine
	var generated bool
	if n.token, generated, err = ensureToken(o.Token, o.DataDir, n.tokenAddrs()...); err != nil {
		return err
	}
	if generated {
		// Every node must accept the same token (the core services move
		// between them): the first node's is kept in the bucket.
		if err = n.whileUnavailable(ctx, "shared token", func() (err error) {
			n.token, err = n.engine.Shared(ctx, "token", newToken)
			return err
		}); err != nil {
			return err // it names the step
		}
		if err := writeTokenFile(o.DataDir, n.token); err != nil {
			return err
		}
		n.log.Warn().Str(logFile, filepath.Join(o.DataDir, TokenFile)).Msg("the core port or the HTTP API listens beyond loopback and no token was configured: using the cluster's generated one (shared by the nodes through NATS)")
	}
	if o.Trace != nil && nc.MirrorOf == "" { // a standby records nothing (its reads of traces need no recorder)
		to := *o.Trace
		to.Node, to.Flush = n.nodeName, "nats"
		if to.Logger == nil {
			to.Logger = n.log
		}
		if err = n.whileUnavailable(ctx, "trace", func() (err error) {
			n.trace, err = trace.New(n.engine, to)
			return err
		}); err != nil {
			return err // it names the step
		}
		n.trace.Start()
	}
	// Every node sees every command: no node holds one for a client it does
	// not know (see startRemote).
	bo := o.Bridge
	bo.Broker, bo.Trace, bo.Node = n.engine, n.trace, n.nodeName
	if bo.HoldUnknown == 0 {
		bo.HoldUnknown = -1
	}
	if o.Delay != nil && nc.MirrorOf == "" {
		// The gateway produces delayed messages through a delay service of
		// its own that is never started: it only writes first copies; the
		// leader's service moves them.
		po := delay.Options{Logger: o.Delay.Logger, Trace: o.Delay.Trace, MaxDelay: o.Delay.MaxDelay, MaxHold: o.Delay.MaxHold}
		po.Logger, po.Trace = cmp.Or(po.Logger, n.log), cmp.Or(po.Trace, n.trace)
		if err = n.whileUnavailable(ctx, "delayed delivery", func() (err error) {
			n.producer, err = delay.New(n.engine, filepath.Join(o.DataDir, "delay-produce"), po)
			return err
		}); err != nil {
			return err // it names the step
		}
		bo.Broker, bo.MaxDelay = n.producer.Broker(), cmp.Or(bo.MaxDelay, n.producer.MaxDelay())
	}
	if err := n.startShadowsNATS(ctx); err != nil {
		return err // it names the step
	}
	if err := n.newGateway(bo, nil); err != nil {
		return err
	}
	n.switches = newCoreSwitches()
	// The election only says what this node should be; one goroutine
	// starts and stops the core services to match, so a slow start never
	// holds up lease renewals, and a failed start gives the lease back.
	ttl := leaseExpiry(cmp.Or(nc.LeaseTTL, DefaultLeaseTTL))
	want := make(chan bool, 1) // the latest state the election asked for
	err = n.whileUnavailable(ctx, "core lease", func() (err error) {
		n.election, err = n.engine.Elect(ctx, jetstream.LeaseOptions{Name: "core", Holder: n.nodeName, TTL: ttl, Logger: n.log,
			Eligible: n.placedForServices,
			OnChange: func(held bool) {
				select {
				case <-want: // superseded
				default:
				}
				want <- held
			}})
		return err
	})
	if err != nil {
		return err // it names the step
	}
	// A liveness lease per node: when one expires, the core lease holder
	// adopts the sessions that node had parked (adoptGone).
	if err = n.whileUnavailable(ctx, "liveness lease", func() (err error) {
		n.liveness, err = n.engine.Elect(ctx, jetstream.LeaseOptions{Name: "node." + n.nodeName, Holder: n.nodeName,
			TTL: ttl, Logger: n.log})
		return err
	}); err != nil {
		return err // it names the step
	}
	n.recordNodeInfo(ctx) // the configured core address, for discovery
	n.coreLease.Store(n.election)
	if o.Core != nil {
		// Every node serves the core port: produce, reads, queries and
		// topics itself; each consumer group (its heartbeats, pulls,
		// commits, POP) on the node placed to serve it (shards.go), and
		// delayed messages and transactions on the core lease holder.
		if err := n.startGroupServices(false); err != nil {
			return err
		}
		n.shards = newGroupShards(n, ttl)
		n.shardsRef.Store(n.shards)
		if err := n.startCoreServer(n.frontBroker(), n.placement(n.election)); err != nil {
			return err
		}
		n.core.SetServices(n.serverServices())
		n.services.Store(&coreServices{groups: n.groups}) // the groups served here, for their alarms; the term adds retry and delay
	}
	termCtx, stopTerms := context.WithCancel(context.Background())
	n.terms = make(chan struct{})
	n.stopTerms = stopTerms
	election := n.election // Shutdown clears the field before it stops this goroutine
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
				if err := n.startTerm(max(ttl, 2*time.Second) / 2); err != nil {
					n.log.Error().Err(err).Msg("core services did not start: giving the lease back")
					_ = n.stopTerm()
					election.Resign()
					continue
				}
				running = true
			case !held && running:
				running = false
				if err := n.stopTerm(); err != nil {
					n.log.Warn().Err(err).Msg("core services stopped with an error")
				}
			}
		}
	}()
	n.log.Info().Strs(logNATS, nc.URLs).Str(logNode, n.nodeName).Msg("engine nats")
	return n.startGateway()
}

// leaseExpiry is how long the node's leases (core, liveness, groups) live
// without renewal, for a lease_ttl of ttl: a third less, at most a second,
// so that what a dead node held — its leases expire up to this long after
// their last renewal, and the server removes them a little later — is
// taken over by the others within lease_ttl, the rest being the time to
// notice and take it (TestBinaryNATSNodeKilledUnderConsumption).
func leaseExpiry(ttl time.Duration) time.Duration { return ttl - min(ttl/3, time.Second) }

// startTerm starts the core services for a term as lease holder and
// points the HTTP API at them; the janitor looks for gone nodes every
// period.
func (n *Node) startTerm(period time.Duration) error {
	mirror := n.opts.NATS.MirrorOf != "" // a read-only standby: nothing here writes to topics
	if mirror {
		n.broker = n.base
	} else if err := n.startDelay(); err != nil {
		return err
	}
	if n.opts.Core == nil {
		return nil
	}
	if !mirror {
		if err := n.startTxn(); err != nil {
			return err
		}
	}
	var err error
	if n.schedules, err = retry.New(n.base, n.retryOptions()); err != nil { // a standby's too: its groups' retries are its own
		return fmt.Errorf("retry: %w", err)
	}
	n.schedules.Start()
	n.core.SetServices(n.serverServices())
	n.services.Store(&coreServices{groups: n.groups, retry: n.schedules, delay: n.delay})
	api, err := n.newHTTPAPI()
	if err != nil {
		return fmt.Errorf("http api: %w", err)
	}
	adm, err := n.adminHandler(true)
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
			n.adoptGone(ctx, period)
		}()
	}
	n.log.Info().Str(logCore, n.core.Addr().String()).Msg("core services started: this node holds the core lease")
	n.coreStarted()
	return nil
}

func (n *Node) stopTerm() error {
	n.switches.set(nil, nil, nil)
	if n.stopJanitor != nil {
		n.stopJanitor()
		n.stopJanitor = nil
	}
	n.services.Store(&coreServices{groups: n.groups}) // the groups stay: their alarms too
	if n.core != nil {
		n.core.SetServices(&server.Services{Groups: n.groups, Retry: n.retry, Pop: n.pop})
	}
	return n.stopTermServices()
}

// placement is the core server's Options.Placement on the JetStream
// engine: a consumer group is served by the node placed for it
// (shards.go); the node-wide services (shard "") by the core lease holder
// (el's), reached at the core address it recorded for discovery.
func (n *Node) placement(el *jetstream.Election) func(context.Context, string) (server.Route, error) {
	return func(ctx context.Context, shard string) (server.Route, error) {
		if shard != "" {
			return n.shards.route(ctx, shard)
		}
		holder := el.Holder()
		switch holder {
		case n.nodeName:
			return server.Route{Here: true}, nil // the server answers "retry" until the services run
		case "":
			return server.Route{}, nil // none yet: retry
		}
		addr, err := n.peers.addrOf(ctx, holder)
		return server.Route{Node: holder, Addr: addr}, err
	}
}

// adoptGone runs while this node holds the core lease: every period it
// lists the nodes' liveness leases, and when one went missing since the
// last look (or at the first look) the sessions parked on nodes without a
// lease are adopted here, so commands for them are queued again.
func (n *Node) adoptGone(ctx context.Context, period time.Duration) {
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
			n.log.Debug().Err(err).Msg("liveness leases not listed")
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
			n.log.Warn().Err(err).Msg("sessions of gone nodes not adopted")
			before = nil // try again next time
		}
	}
}

// coreSwitches route HTTP requests for the core services to the current
// term's handlers; while this node is not the lease holder the HTTP API
// serves produce, queries and traces itself and answers its consume and
// delayed-message endpoints 503 not_leader naming the holder, and the
// admin API serves its gateway part.
type coreSwitches struct {
	api, admin atomic.Pointer[http.Handler]
	extra      atomic.Pointer[func(ctx context.Context) map[string]any]
	standby    http.Handler // admin API without the core services
	standbyAPI http.Handler // HTTP API without them
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

func (c *coreSwitches) apiHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := c.api.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		c.standbyAPI.ServeHTTP(w, r)
	})
}

// frontBroker is what the core port and the HTTP API of every node produce
// and read through (JetStream engine): the engine, with the gateway's
// delay producer in front when delayed delivery is on (it writes first
// copies; the lease holder's delay service moves them).
func (n *Node) frontBroker() core.Broker {
	if n.producer != nil {
		return n.producer.Broker()
	}
	return n.engine
}

// httpElsewhere is the HTTP API's Options.Elsewhere (JetStream engine):
// nil for a shard served here; for a consumer group served by another
// node 503 moved naming it, and for delayed messages on a node without the
// core lease 503 not_leader naming the holder.
func (n *Node) httpElsewhere(w http.ResponseWriter, shard string) error {
	el := n.coreLease.Load()
	if el == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := n.placement(el)(ctx, shard)
	if err != nil {
		return err
	}
	if r.Here {
		return nil
	}
	w.Header().Set("Retry-After", "1")
	if shard == "" {
		return httperr.New(http.StatusServiceUnavailable, "not_leader",
			"delayed messages are served by the node holding the core lease: %s", cmp.Or(r.Node, "none yet"))
	}
	if r.Node == "" {
		return httperr.New(http.StatusServiceUnavailable, "moving", "consumer group %s is moving between nodes: try again", shard)
	}
	return httperr.New(http.StatusServiceUnavailable, "moved",
		"consumer group %s is served by node %s (core port %s): consume it there", shard, r.Node, r.Addr)
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

// whileUnavailable runs step until it succeeds, fails for another reason
// than JetStream not answering (jetstream.ErrUnavailable: a fresh or
// recovering cluster whose meta leader, or the stream's, is not elected
// yet), or ctx ends; it waits between tries, longer each time, and logs
// each retry. A running node rides out such a cluster by itself; without
// this its start did not (serve exited: "create %DELAY%: jetstream:
// unavailable").
func (n *Node) whileUnavailable(ctx context.Context, what string, step func() error) error {
	return retryUnavailable(ctx, what, step, func(err error, wait time.Duration) {
		n.log.Warn().Err(err).Str("step", what).Dur("retry_in", wait).Msg("JetStream not answering at start: trying again")
	})
}

// retryUnavailable is whileUnavailable's loop; onRetry hears each retry.
// Its errors name the step (what).
func retryUnavailable(ctx context.Context, what string, step func() error, onRetry func(error, time.Duration)) error {
	wait := 100 * time.Millisecond
	for {
		err := step()
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrUnavailable) {
			return fmt.Errorf("%s: %w", what, err)
		}
		onRetry(err, wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: still unavailable when the start's deadline passed: %w", what, err)
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}
