package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/node"
	"github.com/ferrymq/ferrymq/session"
)

// serveOptions are serve's flags; the config file (--config) fills in
// those not given, and nodeOptions turns both into node.Options.
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
	heapProf  string
	logLevel  string
	logPretty bool
	engine    string   // embedded or nats
	natsURLs  []string // --nats
	node      string   // --node
	gcPercent int      // --gc-percent
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
	f.StringVar(&o.mqttAddr, "mqtt", ":1883", "address of the MQTT listener (TCP); empty disables it; without an auth section the default is 127.0.0.1:1883 and an address beyond loopback is refused")
	f.StringVar(&o.wsAddr, "ws", ":8083", "address of the MQTT WebSocket listener (path /mqtt); empty disables it; without an auth section the default is 127.0.0.1:8083")
	f.StringVar(&o.remote, "core-remote", "", "run only the MQTT gateway, in front of the core server at this address (no local store; sessions stay in --data); several, comma separated: the uplink goes to all of them, each behind a circuit breaker")
	f.StringVar(&o.token, "token", "", "token core clients must present (default: none); also read from FERRYMQ_TOKEN")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.BoolVar(&o.logPretty, "log-pretty", false, "human-readable logs instead of JSON lines")
	f.StringVar(&o.cpuProf, "cpu-profile", "", "write a CPU profile (pprof) of the whole run to this file")
	f.StringVar(&o.heapProf, "heap-profile", "", "write a heap profile (pprof, after a GC) to this file when told to stop, before the shutdown frees the connections")
	f.StringVar(&o.engine, "engine", "embedded", "queue engine: embedded (commit log in --data) or nats (a NATS JetStream cluster, see --nats)")
	f.StringSliceVar(&o.natsURLs, "nats", nil, "NATS server URLs for --engine nats (comma-separated; config: nats.urls)")
	f.IntVar(&o.gcPercent, "gc-percent", defaultGCPercent, "garbage collector target: heap growth, in percent of the live heap, before the next collection (config: gc_percent; the GOGC environment variable wins)")
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

// applyConfig reads the config file (an empty fileConfig without one) and
// takes from it every setting whose flag was not given.
func (o *serveOptions) applyConfig(cmd *cobra.Command) (fileConfig, error) {
	if o.config == "" {
		return fileConfig{}, nil
	}
	cfg, err := loadConfig(o.config)
	if err != nil {
		return fileConfig{}, err
	}
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
	if cfg.GCPercent != 0 {
		set("gc-percent", func() { o.gcPercent = cfg.GCPercent })
	}
	return cfg, nil
}

// defaultGCPercent is serve's garbage collector target. Go's default (100)
// lets the heap grow to twice what is live before a collection, and the
// pages stay with the process: a fleet of idle connections, whose live
// state is small and long-lived, then costs about twice that state in RSS.
// At 50, 15,000 idle connections measured 1.61 KiB each over plain TCP and
// 11.2 KiB over TLS (1.77 and 14.5 at 100; docs/gateway.md) for a
// collection twice as often — the live heap of a gateway is tens of
// megabytes, so each costs milliseconds.
const defaultGCPercent = 50

// gcTarget is the collector target serve sets, or false when the GOGC
// environment variable is set and the runtime already follows it.
func (o *serveOptions) gcTarget(getenv func(string) string) (int, bool, error) {
	if getenv("GOGC") != "" {
		return 0, false, nil
	}
	if o.gcPercent < 10 || o.gcPercent > 1000 {
		return 0, false, fmt.Errorf("gc percent %d: want 10 to 1000", o.gcPercent)
	}
	return o.gcPercent, true, nil
}

func (o *serveOptions) run(cmd *cobra.Command) error {
	cfg, err := o.applyConfig(cmd)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, o.logPretty, o.logLevel)
	if err != nil {
		return fmt.Errorf("log level: %w", err)
	}
	warnIgnored(&log, o.mode(), ignoredSettings(o.mode(), o, cfg, cmd.Flags().Changed))
	if moved := o.loopbackDefaults(cfg, cmd.Flags().Changed); len(moved) > 0 {
		log.Warn().Strs("mqtt", moved).Msg("no auth section: the MQTT listeners bind to loopback only, as nobody would be asked for credentials; configure auth to serve devices on the network (docs/security.md)")
	}
	if o.token == "" {
		o.token = getenv("FERRYMQ_TOKEN")
	}
	if pct, ok, err := o.gcTarget(getenv); err != nil {
		return err
	} else if ok {
		debug.SetGCPercent(pct)
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
	nopts, err := o.nodeOptions(cfg, cmd.OutOrStdout())
	if err != nil {
		return err
	}
	n, err := node.New(cmd.Context(), nopts, &log)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "ferrymq %s\n", buildVersion())
	for _, name := range n.Listeners() {
		fmt.Fprintf(out, "%-5s %s\n", name, n.Addr(name))
	}
	httpAddr := addrString(n.HTTPAddr())
	switch {
	case o.remote != "":
		fmt.Fprintf(out, "core  remote %s\nhttp  %s\ndata  %s (sessions)\n", o.remote, httpAddr, o.dataDir)
		log.Info().Str("core_remote", o.remote).Str("http", httpAddr).Msg("serving (gateway only)")
	case nopts.Engine == node.EngineNATS:
		fmt.Fprintf(out, "engine nats %v (node %s)\nhttp  %s\n", o.natsURLs, n.NodeName(), httpAddr)
		log.Info().Strs("nats", o.natsURLs).Str("node", n.NodeName()).Str("http", httpAddr).Msg("serving (engine nats)")
	default:
		fmt.Fprintf(out, "core  %s\nhttp  %s\ndata  %s (flush %s)\n", addrString(n.CoreAddr()), httpAddr, o.dataDir, o.flush)
		log.Info().Str("data", o.dataDir).Str("flush", o.flush).Str("core", addrString(n.CoreAddr())).Str("http", httpAddr).Msg("serving")
	}

	<-cmd.Context().Done() // SIGINT, SIGTERM
	// The heap as it serves (connections still held), not after the
	// shutdown freed them: what an idle fleet costs is what it shows.
	if o.heapProf != "" {
		if perr := writeHeapProfile(o.heapProf); perr != nil {
			log.Error().Err(perr).Msg("heap profile not written")
		}
	}
	log.Info().Msg("shutting down")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.Shutdown(ctx)
}

// loopbackDefaults is the secure default (what Mosquitto 2 does): with no
// auth section, an MQTT listener whose address neither a flag nor the
// config chose binds to 127.0.0.1 instead of every interface. It returns
// the addresses it chose. An address chosen beyond loopback without auth is
// refused by the node (node.ErrAnonymousBeyondLoopback).
func (o *serveOptions) loopbackDefaults(cfg fileConfig, changed func(string) bool) []string {
	if cfg.Auth != nil {
		return nil
	}
	var moved []string
	for _, d := range []struct {
		flag  string
		addr  *string
		inCfg bool
	}{{"mqtt", &o.mqttAddr, cfg.MQTT.Addr != nil}, {"ws", &o.wsAddr, cfg.MQTT.WS.Addr != nil}} {
		if changed(d.flag) || d.inCfg || *d.addr == "" {
			continue
		}
		if host, port, err := net.SplitHostPort(*d.addr); err == nil && host == "" {
			*d.addr = net.JoinHostPort("127.0.0.1", port)
			moved = append(moved, *d.addr)
		}
	}
	return moved
}

// addrString is a's string, "-" for none.
func addrString(a net.Addr) string {
	if a == nil {
		return "-"
	}
	return a.String()
}

// writeHeapProfile writes the heap profile, after a GC, to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("heap profile: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	return nil
}

// nodeOptions turns the flags and the config file into the node's
// options; out gets "core ADDR" each time a NATS node starts the core
// services.
func (o *serveOptions) nodeOptions(cfg fileConfig, out io.Writer) (node.Options, error) {
	st, mc, bc := cfg.Store, cfg.MQTT, cfg.Bridge
	noAutoCreate := st.AutoCreateTopics != nil && !*st.AutoCreateTopics
	no := node.Options{
		DataDir: o.dataDir,
		Engine:  cmp.Or(o.engine, node.EngineEmbedded),
		Store: store.Options{
			FlushPolicy:       store.FlushPolicy(o.flush),
			GroupCommitDelay:  groupCommitDelay(st.GroupCommitDelay),
			SegmentBytes:      o.segment,
			Retention:         o.retention,
			MaxDiskBytes:      st.MaxDiskBytes,
			MaxMessageBytes:   st.MaxMessageBytes,
			DefaultQueues:     st.DefaultQueues,
			DisableAutoCreate: noAutoCreate,

			TailCacheBytes:            st.TailCacheBytes,
			ReaderColdReadBytesPerSec: st.ReaderColdReadBytesPerSec,
			ColdReadBytesPerSec:       st.ColdReadBytesPerSec,
			ColdReadMaxBytes:          st.ColdReadMaxBytes,
		},
		NodeName:   cmp.Or(o.node, cfg.NATS.Node),
		CoreRemote: o.remote,
		Token:      o.token,
		Core: &node.CoreOptions{
			Addr:          o.coreAddr,
			Advertise:     cfg.Core.Advertise,
			MaxFrameBytes: cfg.Core.MaxFrameBytes,
			Retry:         retry.Options{MaxAttempts: cfg.Retry.MaxAttempts},
			Transactions: txn.Options{FirstCheck: time.Duration(cfg.Transactions.FirstCheck), CheckInterval: time.Duration(cfg.Transactions.CheckInterval),
				MaxChecks: cfg.Transactions.MaxChecks, MaxPending: cfg.Transactions.MaxPending},
		},
		Delay:   &delay.Options{MaxDelay: time.Duration(cfg.Delay.MaxDelay), MaxHold: time.Duration(cfg.Delay.MaxHold), DisableAutoCreate: noAutoCreate},
		Shadows: &shadow.Options{Limits: shadow.Limits{MaxBytes: cfg.Shadows.MaxBytes, MaxDepth: cfg.Shadows.MaxDepth}},
		Trace: &trace.Options{All: cfg.Trace.All, Topics: cfg.Trace.Topics, Node: cmp.Or(cfg.Trace.Node, hostname()),
			Sample: cfg.Trace.Sample, Flush: o.flush},
		HTTPAddr:         o.httpAddr,
		HTTPMaxBodyBytes: cfg.HTTP.MaxBodyBytes,
		Version:          "ferrymq " + buildVersion(),
		MQTTAddr:         o.mqttAddr,
		ProxyProtocol:    mc.ProxyProtocol,
		WSAddr:           o.wsAddr,
		WSPath:           mc.WS.Path,
		Sessions:         &session.Options{},
		Gateway: gateway.Options{
			MaxPacketBytes:       mc.MaxPacketBytes,
			ConnectTimeout:       time.Duration(mc.ConnectTimeout),
			MaxKeepalive:         mc.MaxKeepalive,
			WriteTimeout:         time.Duration(mc.WriteTimeout),
			MaxPendingWrites:     mc.MaxPendingWrites,
			ReceiveMaximum:       mc.ReceiveMaximum,
			MaxInflight:          mc.MaxInflight,
			MaxQueuedOnline:      mc.MaxQueuedMessages,
			MaxQueuedOnlineBytes: mc.MaxQueuedMessagesBytes,
			MaxClients:           mc.MaxClients,
		},
	}
	for _, d := range cfg.Retry.Schedule {
		no.Core.Retry.Schedule = append(no.Core.Retry.Schedule, time.Duration(d))
	}
	if no.Engine == node.EngineNATS && o.remote == "" {
		nc := cfg.NATS
		if len(o.natsURLs) == 0 {
			return node.Options{}, fmt.Errorf("--engine nats needs --nats URL[,URL…] or nats.urls in the config")
		}
		tlsCfg, err := natsTLS(nc)
		if err != nil {
			return node.Options{}, err
		}
		no.NATS = node.NATSOptions{URLs: o.natsURLs, Creds: nc.Creds, User: nc.User, Password: nc.Password, Token: nc.Token,
			TLS: tlsCfg, Replicas: nc.Replicas, LeaseTTL: time.Duration(nc.LeaseTTL), Timeout: time.Duration(nc.Timeout), MirrorOf: nc.MirrorOf}
		no.OnCore = func(a net.Addr) { fmt.Fprintf(out, "core  %s\n", a) }
	}
	for _, t := range mc.TLS {
		no.TLS = append(no.TLS, node.TLSListener{Name: t.Name, Type: t.Type, Addr: t.Addr, Path: t.Path, Cert: t.Cert, Key: t.Key, ClientCA: t.ClientCA})
	}
	down, err := bc.downlinkRules()
	if err != nil {
		return node.Options{}, err
	}
	no.Bridge = bridgeOptions(bc, down)
	if cfg.Auth != nil {
		no.Auth = authOptions(cfg.Auth)
	}
	no.Alarms = cfg.Alarms.options()
	return no, nil
}

// authOptions converts the config's auth section.
func authOptions(c *authConfig) *node.AuthOptions {
	a := &node.AuthOptions{Anonymous: c.Anonymous, ACL: c.ACL, Quotas: c.Quotas}
	if c.Static != nil {
		a.Static = &node.StaticAuth{File: c.Static.File, Reload: time.Duration(c.Static.Reload)}
	}
	if c.HMAC != nil {
		o := auth.HMACOptions{ProductSecrets: map[string][]byte{}, DeviceSecrets: map[string][]byte{}, Skew: time.Duration(c.HMAC.Skew)}
		for k, v := range c.HMAC.Products {
			o.ProductSecrets[k] = []byte(v)
		}
		for k, v := range c.HMAC.Devices {
			o.DeviceSecrets[k] = []byte(v)
		}
		a.HMAC = &o
		a.HMACExpires = time.Time(c.HMAC.Expires)
	}
	if c.JWT != nil {
		a.JWT = &node.JWTAuth{PublicKeys: c.JWT.PublicKeys, Options: auth.JWTOptions{Secret: []byte(c.JWT.Secret),
			Algorithms: c.JWT.Algorithms, Issuer: c.JWT.Issuer, Audience: c.JWT.Audience}, SecretExpires: time.Time(c.JWT.SecretExpires)}
	}
	if c.MTLS != nil {
		a.MTLS = &auth.MTLSOptions{Field: auth.CertField(c.MTLS.Field), RequireClientID: c.MTLS.RequireClientID}
	}
	return a
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

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// groupCommitDelay is store.group_commit_delay as store.Options takes it:
// absent is the default (0), an explicit 0s is no wait (negative).
func groupCommitDelay(d *duration) time.Duration {
	switch {
	case d == nil:
		return 0
	case *d == 0:
		return -1
	}
	return time.Duration(*d)
}
