package node

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/session"
)

// The engines a node runs on.
const (
	// EngineEmbedded keeps the queues in a commit log in DataDir.
	EngineEmbedded = "embedded"
	// EngineNATS keeps them in a NATS JetStream cluster (docs/engines.md).
	EngineNATS = "nats"
)

// Defaults of Options.
const (
	// DefaultVersion is what the admin API and the core port report when
	// Options.Version is empty.
	DefaultVersion = "ferrymq"
	// DefaultStaticReload is how often a static credentials file is read
	// again when StaticAuth.Reload is zero.
	DefaultStaticReload = 10 * time.Second
	// DefaultLeaseTTL is NATSOptions.LeaseTTL's default, used to pace the
	// adoption of gone nodes' sessions.
	DefaultLeaseTTL = 10 * time.Second
	// httpAPIMaxWait bounds a long poll of the HTTP API.
	httpAPIMaxWait = 30 * time.Second
)

// Options say what a node runs. A zero field means its default; a nil
// section means the part it configures does not run. Options hold only
// what the caller chose: nothing in them is written by New.
type Options struct {
	// DataDir is the node's folder: the commit log (embedded engine),
	// sessions, delayed-delivery state and a generated token. Required.
	DataDir string
	// Engine is EngineEmbedded (default) or EngineNATS. Ignored with
	// CoreRemote.
	Engine string
	// Store configures the embedded engine (its folder is DataDir, its
	// Logger defaults to the node's). With EngineNATS, Retention, MaxDiskBytes,
	// MaxMessageBytes, DefaultQueues and DisableAutoCreate apply to the
	// streams.
	Store store.Options
	// NATS configures EngineNATS.
	NATS NATSOptions
	// NodeName names this node: its leases and downlink offsets (NATS), the
	// admin API's node. Default: Bridge.Node, else the host name.
	NodeName string
	// CoreRemote, when set, runs only the gateway in front of the core
	// server at this address: no local store, no core services; sessions
	// stay in DataDir.
	CoreRemote string
	// Token is what core clients, HTTP API and admin API callers present.
	// Empty while Core.Addr or HTTPAddr listens beyond loopback: one is
	// generated into DataDir/TokenFile (with NATS: shared by the nodes).
	Token string

	// Core runs the core services over the engine: consumer groups, retry,
	// POP, transactions and the core TCP port. With EngineNATS only on the
	// node holding the core lease. Nil: none of them (what gateway tests
	// use).
	Core *CoreOptions
	// Delay runs delayed delivery (folder DataDir/delay) and makes the
	// bridge and the core services produce through it. Its Logger and Trace
	// default to the node's. A zero MaxHold is at most a third of
	// Store.Retention. Nil: no delayed delivery.
	Delay *delay.Options
	// Trace records message traces (its Logger defaults to the node's; with
	// EngineNATS, Node is NodeName and Flush "nats"). With CoreRemote the
	// gateway's hops go to the remote core's trace topic, with no Flush.
	// Nil: none.
	Trace *trace.Options
	// Shadows serves device shadows (docs/commands.md, "Device shadows"):
	// MQTT topics $shadow/…, the core port's shadow ops, the admin API's
	// /api/v1/devices/{id}/shadow; every change an event on the topic
	// device-shadows. With the embedded engine the topic is their record
	// (snapshot in DataDir/shadows); with EngineNATS the latest documents
	// live in the bucket ferrymq_shadows, shared by the nodes (not on a
	// read-only standby). Its Logger defaults to the node's. Nil: none;
	// ignored with CoreRemote.
	Shadows *shadow.Options
	// HTTPAddr serves the HTTP API, the admin API, the dashboard and
	// /metrics /stats /healthz /readyz. Empty: no HTTP server.
	HTTPAddr string
	// HTTPMaxBodyBytes bounds a request body of the HTTP API
	// (httpapi.Options.MaxBodyBytes); 0: httpapi.DefaultMaxBodyBytes
	// (8 MiB).
	HTTPMaxBodyBytes int64
	// OnCore, if set, is called with the core port's address each time the
	// core services start on this node (once with the embedded engine; at
	// each term as the core lease holder with EngineNATS), from the
	// goroutine that started them.
	OnCore func(net.Addr)
	// Version is reported by the admin API and the core port; default
	// DefaultVersion.
	Version string

	// MQTTAddr is a TCP MQTT listener; ProxyProtocol makes it expect a
	// PROXY protocol v1/v2 header. Empty: none.
	MQTTAddr      string
	ProxyProtocol bool
	// WSAddr is an MQTT-over-WebSocket listener at WSPath (default /mqtt).
	// Empty: none.
	WSAddr, WSPath string
	// TLS lists listeners with certificates (MQTT over TLS, WSS).
	TLS []TLSListener
	// Sessions persists MQTT sessions in DataDir/sessions with these
	// options (with EngineNATS they always live in a JetStream bucket).
	// Nil: no session store, unless Gateway.Hooks.Sessions is set.
	Sessions *session.Options
	// Auth authenticates, authorizes and paces clients. Nil: the hooks in
	// Gateway.Hooks, if any, else everybody may connect and use every
	// topic — so then New refuses an MQTT listener reachable beyond
	// loopback (ErrAnonymousBeyondLoopback) unless it requires client
	// certificates.
	Auth *AuthOptions
	// Bridge maps MQTT onto the core and back. New fills in Broker or Core
	// and Trace, MaxDelay when zero, and Node with CoreRemote and EngineNATS; a zero HoldUnknown is off with CoreRemote
	// and EngineNATS (every node sees every command), else the bridge's
	// default.
	Bridge bridge.Options
	// Alarms raises and clears alarms (docs/operations.md, "Alarms"):
	// events in alarm.Topic, GET /api/v1/alarms, /stats, the dashboard,
	// ferrymq_alarm_active and webhooks. Nil: none (the metrics the
	// Prometheus rules read are exported all the same).
	Alarms *AlarmOptions
	// Gateway holds the MQTT engine's limits. Listeners are those given
	// here followed by MQTTAddr, WSAddr and TLS; hooks set here win over
	// the node's (a test may wrap one); MaxQueued and MaxQueuedBytes
	// default to the bridge's offline bounds; ReceiveMaximum is at most
	// Bridge.MaxInflight.
	Gateway gateway.Options
}

// CoreOptions configure the core services.
type CoreOptions struct {
	// Addr is the core wire protocol's TCP address. Required.
	Addr string
	// Advertise is the address clients reach the core port at, named to
	// them by discovery (wire OpCluster); default the bound address, with
	// the host's name when it binds every interface.
	Advertise string
	// MaxFrameBytes bounds a frame on the core port both ways (announced
	// to clients); 0: wire.DefaultMaxFrame (8 MiB).
	MaxFrameBytes int
	// Retry and Transactions configure those services (their Logger and
	// Trace default to the node's).
	Retry        retry.Options
	Transactions txn.Options
}

// NATSOptions configure EngineNATS.
type NATSOptions struct {
	// URLs of the NATS servers. Required with EngineNATS.
	URLs []string
	// Creds is a credentials file (JWT and seed); User, Password and Token
	// the other ways to log in.
	Creds, User, Password, Token string
	// TLS, if set, is the client TLS configuration.
	TLS *tls.Config
	// Replicas of every stream and bucket; default 1.
	Replicas int
	// LeaseTTL bounds how long the core services stay without a leader
	// after the leader died; default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Timeout bounds one JetStream request; default the engine's.
	Timeout time.Duration
	// MirrorOf makes the node a read-only standby (failover mode 2): the
	// JetStream domain of the primary cluster, whose topics the engine
	// mirrors (jetstream.Options.MirrorOf). The node serves consumption,
	// queries and traces; produce (over the wire, HTTP and MQTT) is
	// refused with core.ErrReadOnly, and delayed delivery, transactions and
	// trace recording do not run. Its groups' retry and dead-letter topics
	// are its own.
	MirrorOf string
}

// TLSListener is an MQTT listener with a certificate.
type TLSListener struct {
	Name string
	// Type is "tcp" (MQTT over TLS) or "ws" (WSS).
	Type, Addr, Path string
	// Cert and Key are PEM files; ClientCA, if set, makes clients present a
	// certificate it signed (mTLS).
	Cert, Key, ClientCA string
}

// AuthOptions configure device authentication, the ACL and quotas
// (docs/security.md): providers are tried in the order mTLS, JWT, HMAC,
// static file.
type AuthOptions struct {
	// Anonymous lets clients with no credentials in, on every listener
	// (beyond loopback too): logged loudly at start, listed by
	// Node.AnonymousListeners and raised as the anonymous_access alarm.
	Anonymous bool
	Static    *StaticAuth
	HMAC      *auth.HMACOptions
	JWT       *JWTAuth
	MTLS      *auth.MTLSOptions
	ACL       []auth.ACLRule
	Quotas    *auth.QuotaConfig
	// HMACExpires is when the HMAC secrets are due for rotation (they
	// carry no date of their own); zero: never. The key_expiry alarm
	// warns ahead of it.
	HMACExpires time.Time
}

// StaticAuth is a credentials file, read again every Reload (default
// DefaultStaticReload).
type StaticAuth struct {
	File   string
	Reload time.Duration
}

// JWTAuth is the JWT provider: Options, plus public keys read from the
// PEM file PublicKeys when set.
type JWTAuth struct {
	Options    auth.JWTOptions
	PublicKeys string
	// SecretExpires is when the HS256 secret is due for rotation; zero:
	// never. (Public keys given as certificates expire with them.)
	SecretExpires time.Time
}

// validate returns every problem of o, joined.
func (o *Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.DataDir == "" {
		bad("data dir is required")
	}
	switch o.Engine {
	case "", EngineEmbedded:
	case EngineNATS:
		if o.CoreRemote == "" && len(o.NATS.URLs) == 0 {
			bad("engine nats needs NATS URLs")
		}
	default:
		bad("engine %q: want %s or %s", o.Engine, EngineEmbedded, EngineNATS)
	}
	if o.Core != nil && o.Core.Addr == "" {
		bad("core services need an address")
	}
	for i, t := range o.TLS {
		if t.Cert == "" || t.Key == "" {
			bad("mqtt tls listener %d: cert and key are required", i+1)
		}
	}
	if len(o.Gateway.Listeners) == 0 && o.MQTTAddr == "" && o.WSAddr == "" && len(o.TLS) == 0 {
		bad("no mqtt listener: give an MQTT, WebSocket or TLS listener")
	}
	if err := o.checkAnonymous(); err != nil {
		errs = append(errs, err)
	}
	if o.Alarms != nil {
		if err := o.Alarms.validate(); err != nil {
			bad("alarms: %w", err)
		}
	}
	return errors.Join(errs...)
}
