package engine

import (
	"crypto/tls"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/rs/zerolog"
)

// Listener is one network endpoint for MQTT clients.
type Listener struct {
	// Name identifies the listener in logs, metrics and presence; ""
	// means the type ("tcp", "ws", "tls", "wss").
	Name string
	// Type is "tcp" or "ws"; TLS makes them TLS and WSS.
	Type string
	// Addr is host:port; port 0 picks a free one (Engine.Addr).
	Addr string
	// Path is the WebSocket path; "" means "/mqtt".
	Path string
	// TLS, when set, serves TLS (mTLS if it requires client certificates).
	TLS *tls.Config
	// ProxyProtocol makes a TCP listener expect a PROXY protocol v1 or v2
	// header (from a load balancer that terminates TLS) before MQTT; the
	// client's address is then the header's source.
	ProxyProtocol bool
}

// Options configure an Engine. Zero values mean the defaults below, chosen
// for very many mostly idle phones and cars.
type Options struct {
	Listeners []Listener
	Hooks     Hooks

	// MaxPacketBytes bounds every packet a client sends, checked from the
	// fixed header before the body is read; MQTT 5 clients are told it in
	// CONNACK [MQTT-3.2.2-15]. Default DefaultMaxPacketBytes: a PUBLISH of
	// a 4 MiB payload (core.MaxBodyBytes) with its topic and properties.
	// What the engine sends is bounded by the client's own Maximum Packet
	// Size (MQTT 5) and by its sources: publishes (bounded here) and what
	// hooks publish (the bridge's commands, bounded by the core's message
	// limit), not by this. A packet is buffered whole only while
	// it arrives and while it is written, so the bound costs an idle
	// connection nothing.
	MaxPacketBytes int
	// ConnectTimeout closes a socket that has not sent a whole CONNECT (and
	// finished its TLS handshake) in time. Default 10 s.
	ConnectTimeout time.Duration
	// MaxKeepalive caps the keepalive a client may ask for, in seconds;
	// MQTT 5 clients asking for more (or none) are told the cap in CONNACK
	// (Server Keep Alive), MQTT 3 clients are held to it. Default 1200.
	MaxKeepalive uint16
	// WriteTimeout closes a connection whose written data the client has
	// not taken for this long. Default 15 s.
	WriteTimeout time.Duration
	// MaxPendingWrites and MaxPendingBytes bound the packets queued to one
	// connection and not yet taken by its socket; a QoS 0 message that
	// finds either full is dropped for that subscriber (QoS 1/2 wait in the
	// session). The queue is allocated only while there is one, so the
	// bound costs an idle or keeping-up connection nothing; it is what a
	// subscriber falling behind a burst may hold (the kernel's socket
	// buffer holds more). Defaults 65,536 packets and 16 MiB (EMQX stops a
	// connection's process at 32 MB; Mosquitto does not bound it).
	MaxPendingWrites int
	MaxPendingBytes  int
	// ReceiveMaximum is how many QoS 1/2 publishes a client may have
	// unacknowledged [MQTT-3.3.4-7] (MQTT 5: announced in CONNACK; one more
	// is DISCONNECT 0x93; MQTT 3: the engine stops reading). Default 256.
	ReceiveMaximum uint16
	// MaxInflight bounds outbound QoS 1/2 messages awaiting a client's ack.
	// Default 1024.
	MaxInflight int
	// MaxQueued and MaxQueuedBytes bound the outbound QoS 1/2 messages an
	// offline session holds (also those in flight when it went): an
	// offline device's backlog, kept by the session store. A message past
	// the bound is dropped for that session (the Delivery hook hears it).
	// Defaults 1,000 and 16 MiB of payload (four 4 MiB messages; with a
	// Sessions hook the payloads wait in the session store, not in
	// memory).
	MaxQueued      int
	MaxQueuedBytes int
	// MaxQueuedOnline and MaxQueuedOnlineBytes bound what a connected
	// session holds beyond its inflight window: a burst its client has not
	// caught up with (the messages are shared with the other subscribers;
	// a queue entry is ~60 B). Past it, as offline. Defaults 262,144 and
	// 64 MiB of payload. A persistent session holds at most 65,535 in
	// flight and queued whatever the bound (each has its packet
	// identifier from the start); one that ends with its connection takes
	// an identifier only when a message enters the window.
	MaxQueuedOnline      int
	MaxQueuedOnlineBytes int
	// TopicAliasMaximum is the number of topic aliases a client may set
	// [MQTT-3.2.2-17]. Default 64.
	TopicAliasMaximum uint16
	// MaxSessionExpiry caps a session's expiry interval (MQTT 3 persistent
	// sessions get it). Default 7 days.
	MaxSessionExpiry time.Duration
	// MaxMessageExpiry caps a message's expiry interval. Default 7 days.
	MaxMessageExpiry time.Duration
	// MaxClients refuses connections past this many (CONNACK server busy);
	// 0 means no limit.
	MaxClients int
	// Workers bounds the goroutines that run connection work. Default 256.
	Workers int
	// Pollers is the number of event-loop goroutines. Default GOMAXPROCS.
	Pollers int
	// Node names this engine in logs.
	Node   string
	Logger *zerolog.Logger
}

// Defaults.
const (
	// DefaultMaxPacketBytes is 4 MiB + 256 KiB, core.DefaultMaxMessageBytes
	// (the engine does not import core; gateway's tests check they agree):
	// a 4 MiB payload with up to 256 KiB of topic and properties.
	DefaultMaxPacketBytes       = 4<<20 + 256<<10
	DefaultConnectTimeout       = 10 * time.Second
	DefaultMaxKeepalive         = 1200
	DefaultWriteTimeout         = 15 * time.Second
	DefaultMaxPendingWrites     = 65536
	DefaultMaxPendingBytes      = 16 << 20
	DefaultReceiveMaximum       = 256
	DefaultMaxInflight          = 1024
	DefaultMaxQueued            = 1000
	DefaultMaxQueuedBytes       = 16 << 20
	DefaultMaxQueuedOnline      = 1 << 18
	DefaultMaxQueuedOnlineBytes = 64 << 20
	DefaultTopicAliasMaximum    = 64
	DefaultMaxSessionExpiry     = 7 * 24 * time.Hour
	DefaultMaxMessageExpiry     = 7 * 24 * time.Hour
	DefaultWorkers              = 256
)

func (o Options) withDefaults() Options {
	if len(o.Listeners) == 0 {
		o.Listeners = []Listener{{Type: "tcp", Addr: ":1883"}}
	}
	ls := make([]Listener, len(o.Listeners))
	copy(ls, o.Listeners)
	for i := range ls {
		l := &ls[i]
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
	o.Listeners = ls
	if o.MaxPacketBytes == 0 {
		o.MaxPacketBytes = DefaultMaxPacketBytes
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.MaxKeepalive == 0 {
		o.MaxKeepalive = DefaultMaxKeepalive
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.MaxPendingWrites == 0 {
		o.MaxPendingWrites = DefaultMaxPendingWrites
	}
	if o.MaxPendingBytes == 0 {
		o.MaxPendingBytes = DefaultMaxPendingBytes
	}
	if o.ReceiveMaximum == 0 {
		o.ReceiveMaximum = DefaultReceiveMaximum
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = DefaultMaxInflight
	}
	if o.MaxQueued == 0 {
		o.MaxQueued = DefaultMaxQueued
	}
	if o.MaxQueuedBytes == 0 {
		o.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if o.MaxQueuedOnline == 0 {
		o.MaxQueuedOnline = DefaultMaxQueuedOnline
	}
	if o.MaxQueuedOnlineBytes == 0 {
		o.MaxQueuedOnlineBytes = DefaultMaxQueuedOnlineBytes
	}
	if o.TopicAliasMaximum == 0 {
		o.TopicAliasMaximum = DefaultTopicAliasMaximum
	}
	if o.MaxSessionExpiry == 0 {
		o.MaxSessionExpiry = DefaultMaxSessionExpiry
	}
	if o.MaxMessageExpiry == 0 {
		o.MaxMessageExpiry = DefaultMaxMessageExpiry
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	if o.Pollers == 0 {
		o.Pollers = runtime.GOMAXPROCS(0)
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	names := map[string]bool{}
	for _, l := range o.Listeners {
		if l.Type != "tcp" && l.Type != "ws" {
			bad("listener %q: type %q: want tcp or ws", l.Name, l.Type)
		}
		if l.ProxyProtocol && (l.Type != "tcp" || l.TLS != nil) {
			bad("listener %q: proxy_protocol needs a plain TCP listener (TLS ends at the load balancer)", l.Name)
		}
		if names[l.Name] {
			bad("listener %q: name used twice", l.Name)
		}
		names[l.Name] = true
	}
	if o.MaxPacketBytes < 64 || o.MaxPacketBytes > 256<<20 {
		bad("max packet bytes %d: want 64 B to 256 MiB", o.MaxPacketBytes)
	}
	if o.ConnectTimeout < 0 || o.WriteTimeout < 0 || o.MaxSessionExpiry < 0 || o.MaxMessageExpiry < 0 {
		bad("timeouts and expiries must not be negative")
	}
	if o.MaxPendingWrites < 1 || o.MaxPendingBytes < 1 || o.MaxInflight < 1 || o.MaxInflight > 65535 || o.MaxQueued < 1 || o.MaxQueuedBytes < 1 || o.MaxQueuedOnline < 1 || o.MaxQueuedOnlineBytes < 1 || o.MaxClients < 0 {
		bad("queue bounds must be positive (max inflight at most 65535)")
	}
	if o.Workers < 2 || o.Pollers < 1 {
		bad("workers %d and pollers %d: want at least 2 and 1", o.Workers, o.Pollers)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return nil
}
