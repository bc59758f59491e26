package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Listener is one network endpoint for MQTT clients.
type Listener struct {
	// Name identifies the listener in logs, metrics and presence events;
	// "" means the type ("tcp", "ws", "tls", "wss").
	Name string `yaml:"name"`
	// Type is "tcp" or "ws"; TLS makes them "tls" and "wss".
	Type string `yaml:"type"`
	// Addr is host:port; port 0 picks a free one (see Gateway.Addr).
	Addr string `yaml:"addr"`
	// Path is the WebSocket path; "" means "/mqtt".
	Path string `yaml:"path"`
	// TLS, when set, serves TLS (and mTLS if it requires client certs).
	TLS *tls.Config `yaml:"-"`
	// ProxyProtocol makes a plain TCP listener expect a PROXY protocol v1
	// or v2 header from a load balancer (that terminates TLS); the client's
	// address is then the header's source (auth, ACL, logs, presence).
	ProxyProtocol bool `yaml:"proxy_protocol"`
}

// Options configure a Gateway. Zero values mean the defaults below, chosen
// for very many mostly idle phones and cars: small buffers and queues per
// connection, a hard bound on packet size, and no connection that can sit
// without identifying itself.
type Options struct {
	Listeners []Listener
	// Hooks are the engine's hooks (auth, sessions, bridge, cluster…). A
	// hook object may fill several fields; it is attached, started,
	// drained and its metrics registered once.
	Hooks engine.Hooks

	// MaxPacketBytes bounds every MQTT packet a client sends, checked from
	// the fixed header before anything is allocated; MQTT 5 clients are
	// told it in CONNACK (Maximum Packet Size) [MQTT-3.2.2-15] and get
	// DISCONNECT 0x95 past it, MQTT 3.1.1 clients are disconnected. (What
	// is sent to a client is bounded by its own Maximum Packet Size and by
	// the core's message limit.) Default engine.DefaultMaxPacketBytes (4 MiB + 256 KiB,
	// core.DefaultMaxMessageBytes): a PUBLISH of a 4 MiB payload
	// (core.MaxBodyBytes) with its topic and properties.
	MaxPacketBytes int
	// ConnectTimeout closes a socket that has not sent a complete CONNECT
	// (and, for TLS, finished its handshake) in time. Default 10 s.
	ConnectTimeout time.Duration
	// MaxKeepalive caps the keepalive a client may ask for, in seconds;
	// MQTT 5 clients asking for more (or for none) are told the cap in
	// CONNACK, MQTT 3 clients are held to it. Default 1200.
	MaxKeepalive uint16
	// WriteTimeout disconnects a client that does not take a write in time
	// (a stalled or malicious reader); default 15 s.
	WriteTimeout time.Duration
	// MaxPendingWrites bounds the packets queued to one client and not yet
	// taken by its socket (and so does the engine's 16 MiB of them). A QoS
	// 0 message that finds it full is dropped for that subscriber and
	// counted (ferrymq_mqtt_messages_dropped_total); QoS 1/2 wait in the
	// session. The queue exists only while something waits, so an idle
	// connection pays nothing for it. Default 65,536
	// (engine.DefaultMaxPendingWrites).
	MaxPendingWrites int
	// ReceiveMaximum is the number of QoS 1/2 publishes a client may have
	// unacknowledged [MQTT-3.3.4-7], announced to MQTT 5 clients in
	// CONNACK (one more gets DISCONNECT 0x93); an MQTT 3 client past it is
	// not read from until acks catch up. Default 256.
	ReceiveMaximum uint16
	// MaxInflight bounds outbound QoS 1/2 messages awaiting a client's ack
	// (and its Receive Maximum, if lower). Default 1024.
	MaxInflight int
	// MaxQueued and MaxQueuedBytes bound the outbound QoS 1/2 messages an
	// offline session holds (bridge.offline_max_messages, …_bytes).
	// Defaults 1,000 and 16 MiB of payload.
	MaxQueued, MaxQueuedBytes int
	// MaxQueuedOnline and MaxQueuedOnlineBytes bound what a connected
	// session holds beyond its inflight window (mqtt.max_queued_messages,
	// …_bytes). Defaults 65,536 and 64 MiB of payload.
	MaxQueuedOnline, MaxQueuedOnlineBytes int
	// MaxClients refuses connections past this many; 0 means no limit.
	MaxClients int64
	// Workers bounds the goroutines that handle connections' packets.
	// Default 256.
	Workers int
	// Node names this gateway in logs.
	Node string

	// Store, if set, adds the embedded store's counters to /metrics.
	Store  *store.Store
	Logger *zerolog.Logger
}

func (o *Options) withDefaults() {
	if len(o.Listeners) == 0 {
		o.Listeners = []Listener{{Type: "tcp", Addr: ":1883"}, {Type: "ws", Addr: ":8083"}}
	}
	for i := range o.Listeners {
		l := &o.Listeners[i]
		if l.Type == "" {
			l.Type = "tcp"
		}
		if l.Type == "ws" && l.Path == "" {
			l.Path = "/mqtt"
		}
		if l.Name == "" {
			l.Name = l.Type
			if l.TLS != nil {
				l.Name = map[string]string{"tcp": "tls", "ws": "wss"}[l.Type]
			}
		}
	}
	if o.MaxPacketBytes == 0 {
		o.MaxPacketBytes = engine.DefaultMaxPacketBytes
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.MaxKeepalive == 0 {
		o.MaxKeepalive = 1200
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = 15 * time.Second
	}
	if o.MaxPendingWrites == 0 {
		o.MaxPendingWrites = engine.DefaultMaxPendingWrites
	}
	if o.ReceiveMaximum == 0 {
		o.ReceiveMaximum = 256
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = 1024
	}
}

func (o *Options) validate() error {
	var errs []error
	names := map[string]bool{}
	for _, l := range o.Listeners {
		if l.Type != "tcp" && l.Type != "ws" {
			errs = append(errs, fmt.Errorf("listener %q: type %q: want tcp or ws", l.Name, l.Type))
		}
		if names[l.Name] {
			errs = append(errs, fmt.Errorf("listener %q: name used twice", l.Name))
		}
		names[l.Name] = true
	}
	if o.MaxPacketBytes < 64 || o.MaxPacketBytes > 256<<20 {
		errs = append(errs, fmt.Errorf("max packet bytes %d: want 64 B–256 MiB", o.MaxPacketBytes))
	}
	if o.ConnectTimeout < 0 || o.WriteTimeout < 0 {
		errs = append(errs, errors.New("timeouts must not be negative"))
	}
	if o.MaxPendingWrites < 1 || o.MaxInflight < 1 || o.MaxClients < 0 || o.MaxQueued < 0 || o.MaxQueuedBytes < 0 || o.MaxQueuedOnline < 0 || o.MaxQueuedOnlineBytes < 0 || o.Workers < 0 {
		errs = append(errs, errors.New("queue bounds must be positive"))
	}
	for _, l := range o.Listeners {
		if l.ProxyProtocol && (l.Type != "tcp" || l.TLS != nil) {
			errs = append(errs, fmt.Errorf("listener %q: proxy_protocol needs a plain TCP listener (TLS ends at the load balancer)", l.Name))
		}
	}
	return errors.Join(errs...)
}
