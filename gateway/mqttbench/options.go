package mqttbench

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// Mode is what a run measures.
type Mode string

const (
	// ModePubSub: publishers send timestamped messages, subscribers (and
	// optionally a core consumer) receive them.
	ModePubSub Mode = "pubsub"
	// ModeConnect: a connect storm of lean MQTT 3.1.1 connections.
	ModeConnect Mode = "connect"
	// ModeIdle: lean connections opened and then held idle.
	ModeIdle Mode = "idle"
)

// Options describe a run. A zero field means its default.
type Options struct {
	// Mode; default ModePubSub.
	Mode Mode
	// Addr is the broker: tcp://host:port (also mqtt://, or host:port),
	// ws://host:port/path, or, in connect and idle modes,
	// tls://host:port (also ssl://, mqtts://). Default
	// tcp://127.0.0.1:1883.
	Addr string
	// TLS configures tls:// connections; nil: the system's roots, the
	// address's host as the server name.
	TLS *tls.Config
	// Username and Password go into every lean CONNECT (connect and idle
	// modes); empty: none. A refused CONNECT counts as failed, its return
	// code among the errors.
	Username string
	Password string
	// Version is the MQTT version of pubsub clients: 3 (3.1.1, with
	// eclipse/paho.mqtt.golang) or 5 (eclipse/paho.golang); default 3.
	// Connect and idle modes always speak 3.1.1 with the lean client.
	Version int
	// ClientPrefix starts every client identifier; default
	// "mqttbench-<pid>-".
	ClientPrefix string
	// PersistentSession connects with clean session (3.1.1) / clean start
	// (5) off.
	PersistentSession bool
	// Label names the broker's setup in the result, e.g. "fsync always".
	Label string

	// Publishers is the number of publishing connections; default 10.
	Publishers int
	// Subscribers is the number of subscribing connections, each with one
	// subscription to Filter; 0: none (publish only, or the core only).
	Subscribers int
	// QoS of publications and subscriptions: 0, 1 or 2.
	QoS byte
	// SizeBytes is the payload size, at least PayloadHeaderBytes; default 256.
	SizeBytes int
	// Rate is messages per second across all publishers, paced evenly
	// (pubsub), or connections per second (connect, idle); 0: as fast as
	// possible.
	Rate float64
	// Count is the number of messages per publisher; 0: send for Duration.
	Count int64
	// Duration bounds publishing; with Count too, whichever ends first.
	// Default 10 s when Count is 0.
	Duration time.Duration
	// Topic of publisher i: "%i" is replaced by i. Default "bench/%i".
	Topic string
	// Filter the subscribers subscribe to; default the first level of
	// Topic followed by "/#" ("#" when the first level contains %i). A
	// Filter with "%i" makes pairs (point to point): subscriber i
	// subscribes to it with its index, Publishers must equal Subscribers,
	// and each message is expected once, by its publisher's subscriber.
	Filter string
	// SlowSubscribers are connections that subscribe to Filter (pairs:
	// to subscriber 0's) at QoS and then never read: the broker's outbound
	// queue for them fills up. The result says how many the broker
	// disconnected; the other subscribers' figures show whether they
	// suffered. Lean MQTT 3.1.1 connections over tcp.
	SlowSubscribers int
	// Inflight bounds each publisher's messages sent but not yet
	// acknowledged (QoS 1, 2) or written (QoS 0); default 64.
	Inflight int
	// Drain is the longest wait, after the last acknowledgement, for
	// receivers to get every expected message; default 5 s. The wait ends
	// sooner when all arrived or nothing arrived for 3 s.
	Drain time.Duration

	// Core, when Core.Addr is set, consumes the published messages from a
	// ferrymq core topic as well (pubsub mode).
	Core CoreOptions

	// Conns is the number of lean connections (connect, idle); default 1,000.
	Conns int
	// Workers open connections in parallel (all modes); default 16.
	Workers int
	// KeepAlive is sent in CONNECT; idle connections send PINGREQ every
	// KeepAlive/2. Default 300 s; at most 65,535 s.
	KeepAlive time.Duration
	// Hold keeps the connections open after all are up: connect mode
	// closes them at once when 0; idle mode holds until ctx ends when 0.
	Hold time.Duration
	// Source is the first local address lean connections bind to; every
	// ConnsPerSource connections move on to the next address (127.0.0.1,
	// 127.0.0.2, …: Linux routes all of 127/8 to lo). Default 127.0.0.1
	// when the broker is on a loopback address, else unbound.
	Source netip.Addr
	// Subscribe, when set, makes every lean connection subscribe once to
	// it at SubQoS after its CONNACK and wait for the SUBACK; "%i" is
	// replaced by the connection's index. A refused subscription fails
	// the connection.
	Subscribe string
	SubQoS    byte
	// ConnsPerSource is the most connections bound to one source address;
	// default 10,000 (under the 28,232 ephemeral ports of Linux).
	ConnsPerSource int
	// ConnectTimeout bounds dialling plus CONNECT/CONNACK, and SUBACK;
	// default 10 s.
	ConnectTimeout time.Duration

	// Progress receives a status line every ProgressInterval (default 1 s);
	// nil: none.
	Progress         io.Writer
	ProgressInterval time.Duration
}

// CoreOptions name the ferrymq core topic a pubsub run also consumes.
type CoreOptions struct {
	// Addr is the core server, host:port; empty: no core consumer.
	Addr string
	// Token is presented to the core server if it requires one.
	Token string
	// Topic is the core topic the gateway bridges the MQTT topics to.
	Topic string
	// Group is the consumer group (clustering); its offsets are moved to
	// the end of the topic before publishing starts.
	Group string
}

// brokerAddr is Options.Addr taken apart.
type brokerAddr struct {
	url      string // for paho: tcp://host:port or ws://host:port/path
	scheme   string // "tcp", "tls" or "ws"
	hostport string
	path     string // ws only: the request path, "/" if none
}

func parseAddr(s string) (brokerAddr, error) {
	if !strings.Contains(s, "://") {
		s = "tcp://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return brokerAddr{}, fmt.Errorf("address %q: %w", s, err)
	}
	switch u.Scheme {
	case "tcp", "mqtt":
		u.Scheme = "tcp"
		if u.Path != "" && u.Path != "/" {
			return brokerAddr{}, fmt.Errorf("address %q: a tcp address has no path", s)
		}
		u.Path = ""
	case "tls", "ssl", "mqtts":
		u.Scheme = "tls"
		if u.Path != "" && u.Path != "/" {
			return brokerAddr{}, fmt.Errorf("address %q: a tls address has no path", s)
		}
		u.Path = ""
	case "ws":
	default:
		return brokerAddr{}, fmt.Errorf("address %q: scheme must be tcp, mqtt, tls or ws", s)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return brokerAddr{}, fmt.Errorf("address %q: %w", s, err)
	}
	path := u.RequestURI()
	if u.Scheme != "ws" {
		path = ""
	}
	return brokerAddr{url: u.String(), scheme: u.Scheme, hostport: u.Host, path: path}, nil
}

func (o Options) withDefaults() Options {
	if o.Mode == "" {
		o.Mode = ModePubSub
	}
	if o.Addr == "" {
		o.Addr = "tcp://127.0.0.1:1883"
	}
	if o.Version == 0 {
		o.Version = 3
	}
	if o.ClientPrefix == "" {
		o.ClientPrefix = fmt.Sprintf("mqttbench-%d-", os.Getpid())
	}
	if o.Publishers == 0 {
		o.Publishers = 10
	}
	if o.SizeBytes == 0 {
		o.SizeBytes = 256
	}
	if o.Count == 0 && o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Topic == "" {
		o.Topic = "bench/%i"
	}
	if o.Filter == "" {
		o.Filter = defaultFilter(o.Topic)
	}
	if o.Inflight == 0 {
		o.Inflight = 64
	}
	if o.Drain == 0 {
		o.Drain = 5 * time.Second
	}
	if o.Conns == 0 {
		o.Conns = 1000
	}
	if o.Workers == 0 {
		o.Workers = 16
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = 300 * time.Second
	}
	if !o.Source.IsValid() {
		if a, err := parseAddr(o.Addr); err == nil {
			host, _, _ := net.SplitHostPort(a.hostport)
			if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() && ip.IsLoopback() {
				o.Source = netip.AddrFrom4([4]byte{127, 0, 0, 1})
			}
		}
	}
	if o.ConnsPerSource == 0 {
		o.ConnsPerSource = 10_000
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.ProgressInterval == 0 {
		o.ProgressInterval = time.Second
	}
	return o
}

// pairs reports whether subscriber i has a filter of its own (Filter
// holds "%i").
func (o *Options) pairs() bool { return strings.Contains(o.Filter, "%i") }

// filterOf is subscriber i's filter.
func (o *Options) filterOf(i int) string {
	return strings.ReplaceAll(o.Filter, "%i", strconv.Itoa(i))
}

// defaultFilter is the first level of topic followed by "/#", or "#" when
// the first level varies by publisher.
func defaultFilter(topic string) string {
	first, _, _ := strings.Cut(topic, "/")
	if strings.Contains(first, "%i") || first == topic {
		if !strings.Contains(topic, "%i") {
			return topic
		}
		return "#"
	}
	return first + "/#"
}

func (o Options) validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	addr, err := parseAddr(o.Addr)
	if err != nil {
		errs = append(errs, err)
	}
	switch o.Mode {
	case ModePubSub:
		if o.Version != 3 && o.Version != 5 {
			add("MQTT version %d: must be 3 (3.1.1) or 5", o.Version)
		}
		if o.QoS > 2 {
			add("QoS %d: must be 0, 1 or 2", o.QoS)
		}
		if o.SizeBytes < PayloadHeaderBytes || o.SizeBytes > 256<<20 {
			add("payload size %d: must be %d bytes … 256 MiB", o.SizeBytes, PayloadHeaderBytes)
		}
		if o.Publishers < 1 || o.Publishers >= MaxPublishers {
			add("publishers %d: must be 1 … %d", o.Publishers, MaxPublishers-1)
		}
		if o.Subscribers < 0 {
			add("subscribers %d: must not be negative", o.Subscribers)
		}
		if o.Count < 0 || o.Count > math.MaxUint32 {
			add("count %d: must be 0 … %d (the sequence is 32 bits)", o.Count, uint64(math.MaxUint32))
		}
		if o.Inflight < 1 || o.Inflight > 65535 {
			add("inflight %d: must be 1 … 65,535", o.Inflight)
		}
		if o.Drain < 0 {
			add("drain %v: must not be negative", o.Drain)
		}
		if o.Topic == "" || strings.ContainsAny(o.Topic, "+#\x00") {
			add("topic %q: must be non-empty without wildcards", o.Topic)
		}
		if err := mqtttopic.ValidFilter(strings.ReplaceAll(o.Filter, "%i", "0")); err != nil {
			errs = append(errs, err)
		}
		if o.pairs() && (o.Publishers != o.Subscribers || !strings.Contains(o.Topic, "%i")) {
			add("filter %q makes pairs: needs --publishers = --subscribers and a --topic with %%i", o.Filter)
		}
		if o.SlowSubscribers < 0 {
			add("slow subscribers %d: must not be negative", o.SlowSubscribers)
		}
		if err == nil && addr.scheme == "tls" {
			add("address %q: pubsub mode speaks MQTT over tcp or ws only", o.Addr)
		}
		if o.Username != "" || o.Password != "" || o.Subscribe != "" {
			add("--username, --password and --subscribe are for connect and idle modes")
		}
		if o.SlowSubscribers > 0 && err == nil && addr.scheme != "tcp" {
			add("slow subscribers speak MQTT over tcp only")
		}
		if o.Core.Addr != "" && (o.Core.Topic == "" || o.Core.Group == "") {
			add("a core consumer needs a topic and a group")
		}
	case ModeConnect, ModeIdle:
		if len(o.Username) > math.MaxUint16 || len(o.Password) > math.MaxUint16 {
			add("username and password: at most 65,535 bytes each")
		}
		if o.Password != "" && o.Username == "" {
			add("a password needs a username in MQTT 3.1.1 [MQTT-3.1.2-22]")
		}
		if o.Subscribe != "" {
			if err := mqtttopic.ValidFilter(strings.ReplaceAll(o.Subscribe, "%i", "0")); err != nil {
				errs = append(errs, fmt.Errorf("subscribe: %w", err))
			}
		}
		if o.SubQoS > 2 {
			add("subscription QoS %d: must be 0, 1 or 2", o.SubQoS)
		}
		if o.Conns < 1 {
			add("conns %d: must be at least 1", o.Conns)
		}
		if o.KeepAlive < 0 || o.KeepAlive > math.MaxUint16*time.Second {
			add("keepalive %v: must be 0 … 65,535 s", o.KeepAlive)
		}
		if o.Hold < 0 {
			add("hold %v: must not be negative", o.Hold)
		}
		if o.Source.IsValid() && !o.Source.Is4() {
			add("source address %v: must be IPv4", o.Source)
		}
		if o.ConnsPerSource < 1 {
			add("conns per source %d: must be at least 1", o.ConnsPerSource)
		}
	default:
		add("mode %q: must be pubsub, connect or idle", o.Mode)
	}
	if o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) {
		add("rate %v: must be a non-negative number", o.Rate)
	}
	if o.Duration < 0 {
		add("duration %v: must not be negative", o.Duration)
	}
	if o.Workers < 1 {
		add("workers %d: must be at least 1", o.Workers)
	}
	if o.ConnectTimeout < 0 || o.ProgressInterval < 0 {
		add("timeouts and intervals must not be negative")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, errors.Join(errs...))
	}
	return nil
}

// publisherTopic is the topic of publisher i.
func publisherTopic(pattern string, i int) string {
	return strings.ReplaceAll(pattern, "%i", strconv.Itoa(i))
}
