package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/gateway/alarm"
	"github.com/ferrymq/ferrymq/gateway/node"
)

// fileConfig is the YAML configuration file of `ferrymq serve --config`.
// Unknown keys are errors. Command-line flags override what it says.
//
//	data: ./data
//	flush: sync                # or async
//	log: {level: info, pretty: false}
//	store:
//	  segment_bytes: 1073741824
//	  retention: 72h
//	  max_disk_bytes: 0        # 0: no ceiling
//	  max_message_bytes: 4456448 # a 4 MiB body and 256 KiB of metadata
//	  default_queues: 8
//	  auto_create_topics: true
//	  tail_cache_bytes: 134217728            # the newest log bytes in memory; -1: none
//	  reader_cold_read_bytes_per_sec: 1342177280  # each group's reads from behind it; -1: no bound
//	  cold_read_bytes_per_sec: 0             # all groups' together; 0: no bound
//	  cold_read_max_bytes: 262144            # the most one answer returns from behind it; -1: a read's whole 4 MiB
//	delay: {max_delay: 960h, max_hold: 18h12m16s}
//	shadows: {max_bytes: 8192, max_depth: 6}
//	trace: {all: false, topics: [telemetry], node: gw-1, sample: 1.0}
//	retry: {schedule: [10s, 30s, 1m, …], max_attempts: 16}
//	transactions: {first_check: 6s, check_interval: 30s, max_checks: 15, max_pending: 100000}
//	core: {addr: ":10911", token: "", max_frame_bytes: 8388608, advertise: ""}
//	http: {addr: ":18083", max_body_bytes: 8388608}
//	mqtt: {addr: ":1883", ws: {addr: ":8083", path: /mqtt}, tls: [...], max_queued_messages: 262144, limits…}
//	bridge: {uplink: [{filter, topic, key, tag}], events_topic: device-events}
type fileConfig struct {
	Data  string `yaml:"data"`
	Flush string `yaml:"flush"`
	Log   struct {
		Level  string `yaml:"level"`
		Pretty bool   `yaml:"pretty"`
	} `yaml:"log"`
	Store struct {
		SegmentBytes int64 `yaml:"segment_bytes"`
		// GroupCommitDelay: absent, store.DefaultGroupCommitDelay; 0s, no wait.
		GroupCommitDelay *duration `yaml:"group_commit_delay"`
		Retention        duration  `yaml:"retention"`
		MaxDiskBytes     int64     `yaml:"max_disk_bytes"`
		MaxMessageBytes  int       `yaml:"max_message_bytes"`
		DefaultQueues    int       `yaml:"default_queues"`
		AutoCreateTopics *bool     `yaml:"auto_create_topics"`
		// TailCacheBytes: 0, store.DefaultTailCacheBytes; negative, none.
		TailCacheBytes int64 `yaml:"tail_cache_bytes"`
		// ReaderColdReadBytesPerSec: 0, store.DefaultReaderColdReadBytesPerSec;
		// negative, no bound. ColdReadBytesPerSec: 0 or negative, no bound.
		ReaderColdReadBytesPerSec int64 `yaml:"reader_cold_read_bytes_per_sec"`
		ColdReadBytesPerSec       int64 `yaml:"cold_read_bytes_per_sec"`
		// ColdReadMaxBytes: 0, store.DefaultColdReadMaxBytes; negative,
		// only a read's own bound.
		ColdReadMaxBytes int `yaml:"cold_read_max_bytes"`
	} `yaml:"store"`
	Delay struct {
		MaxDelay duration `yaml:"max_delay"`
		MaxHold  duration `yaml:"max_hold"`
	} `yaml:"delay"`
	Shadows struct {
		// MaxBytes bounds a shadow's desired + reported as JSON (0: 8 KiB);
		// MaxDepth their nesting (0: 6).
		MaxBytes int `yaml:"max_bytes"`
		MaxDepth int `yaml:"max_depth"`
	} `yaml:"shadows"`
	Retry struct {
		Schedule    []duration `yaml:"schedule"`
		MaxAttempts int        `yaml:"max_attempts"`
	} `yaml:"retry"`
	Trace struct {
		All    bool     `yaml:"all"`
		Topics []string `yaml:"topics"`
		Node   string   `yaml:"node"`
		Sample float64  `yaml:"sample"`
	} `yaml:"trace"`
	Transactions struct {
		FirstCheck    duration `yaml:"first_check"`
		CheckInterval duration `yaml:"check_interval"`
		MaxChecks     int      `yaml:"max_checks"`
		MaxPending    int      `yaml:"max_pending"`
	} `yaml:"transactions"`
	Core struct {
		Addr  string `yaml:"addr"`
		Token string `yaml:"token"`
		// MaxFrameBytes bounds a wire frame on the core port (0: 8 MiB).
		MaxFrameBytes int `yaml:"max_frame_bytes"`
		// Advertise is the address discovery names for the core port
		// ("": the bound one, the host's name for every interface).
		Advertise string `yaml:"advertise"`
	} `yaml:"core"`
	HTTP struct {
		Addr string `yaml:"addr"`
		// MaxBodyBytes bounds an HTTP API request body (0: 8 MiB).
		MaxBodyBytes int64 `yaml:"max_body_bytes"`
	} `yaml:"http"`
	MQTT   mqttConfig   `yaml:"mqtt"`
	Bridge bridgeConfig `yaml:"bridge"`
	Auth   *authConfig  `yaml:"auth"`
	// Engine is "embedded" (default) or "nats" (docs/engines.md).
	Engine string     `yaml:"engine"`
	NATS   natsConfig `yaml:"nats"`
	// GCPercent is the garbage collector target (serve --gc-percent).
	GCPercent int          `yaml:"gc_percent"`
	Alarms    alarmsConfig `yaml:"alarms"`

	// keys are the key paths the file gives (keyPaths), not a key itself.
	keys []string
}

// alarmsConfig is the alarms' section (docs/operations.md, "Alarms").
// Zero values mean node.AlarmOptions' defaults.
type alarmsConfig struct {
	// Enabled: absent or true runs the alarms; false none (the metrics
	// Prometheus rules read stay).
	Enabled    *bool    `yaml:"enabled"`
	Interval   duration `yaml:"interval"`
	ClearAfter duration `yaml:"clear_after"`
	// Disabled lists kinds never raised (e.g. disconnect_rate).
	Disabled            []string `yaml:"disabled"`
	DiskUsage           float64  `yaml:"disk_usage"` // share of the filesystem, 0.85
	FsyncP99            duration `yaml:"fsync_p99"`
	FsyncWindow         duration `yaml:"fsync_window"`
	FsyncMinCount       int64    `yaml:"fsync_min_count"`
	GroupLag            int64    `yaml:"group_lag"`
	GroupLagGrowing     duration `yaml:"group_lag_growing"`
	RetryBacklogGrowing duration `yaml:"retry_backlog_growing"`
	DeadLetterQuiet     duration `yaml:"dead_letter_quiet"`
	DropQuiet           duration `yaml:"drop_quiet"`
	DelayOverdue        duration `yaml:"delay_overdue"`
	DisconnectRate      float64  `yaml:"disconnect_rate"` // per second
	DisconnectWindow    duration `yaml:"disconnect_window"`
	CertificateDays     int      `yaml:"certificate_expiry_days"`
	KeyDays             int      `yaml:"key_expiry_days"`
	Webhooks            []struct {
		URL      string            `yaml:"url"`
		Headers  map[string]string `yaml:"headers"` // e.g. Authorization; never logged
		Timeout  duration          `yaml:"timeout"`
		Attempts int               `yaml:"attempts"`
		Queue    int               `yaml:"queue"`
	} `yaml:"webhooks"`
}

// options converts the section; nil when the alarms are off.
func (c alarmsConfig) options() *node.AlarmOptions {
	if c.Enabled != nil && !*c.Enabled {
		return nil
	}
	a := &node.AlarmOptions{Interval: time.Duration(c.Interval), ClearAfter: time.Duration(c.ClearAfter),
		DiskUsage: c.DiskUsage, FsyncP99: time.Duration(c.FsyncP99), FsyncWindow: time.Duration(c.FsyncWindow),
		FsyncMinCount: c.FsyncMinCount, GroupLag: c.GroupLag, GroupLagGrowing: time.Duration(c.GroupLagGrowing),
		RetryBacklogGrowing: time.Duration(c.RetryBacklogGrowing), DeadLetterQuiet: time.Duration(c.DeadLetterQuiet),
		DropQuiet: time.Duration(c.DropQuiet), DelayOverdue: time.Duration(c.DelayOverdue), DisconnectRate: c.DisconnectRate,
		DisconnectWindow:  time.Duration(c.DisconnectWindow),
		CertificateExpiry: time.Duration(c.CertificateDays) * 24 * time.Hour, KeyExpiry: time.Duration(c.KeyDays) * 24 * time.Hour}
	for _, k := range c.Disabled {
		a.Disabled = append(a.Disabled, alarm.Kind(k))
	}
	for _, w := range c.Webhooks {
		a.Webhooks = append(a.Webhooks, alarm.Webhook{URL: w.URL, Headers: w.Headers, Timeout: time.Duration(w.Timeout),
			Attempts: w.Attempts, Queue: w.Queue})
	}
	return a
}

// date is a day (2027-03-01) or an RFC 3339 time; "" is none.
type date time.Time

func (d *date) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: want a date like 2027-03-01", n.Line)
	}
	if s == "" {
		*d = date{}
		return nil
	}
	for _, layout := range []string{time.DateOnly, time.RFC3339} {
		if t, err := time.Parse(layout, s); err == nil {
			*d = date(t)
			return nil
		}
	}
	return fmt.Errorf("line %d: bad date %q: want 2027-03-01 or 2027-03-01T00:00:00Z", n.Line, s)
}

// natsConfig is the JetStream engine's section (engine: nats).
type natsConfig struct {
	URLs     []string `yaml:"urls"`
	Creds    string   `yaml:"creds"` // credentials file (JWT + seed)
	User     string   `yaml:"user"`
	Password string   `yaml:"password"`
	Token    string   `yaml:"token"`
	TLS      struct {
		CA   string `yaml:"ca"`
		Cert string `yaml:"cert"`
		Key  string `yaml:"key"`
	} `yaml:"tls"`
	// Replicas of every stream and bucket: 3 on a cluster (default 1).
	Replicas int `yaml:"replicas"`
	// Node names this gateway node (leases, downlink offsets); default the
	// bridge's node name, else the host name. Unique per node.
	Node string `yaml:"node"`
	// LeaseTTL bounds how long the core services stay without a leader
	// after the leader died (default 10s).
	LeaseTTL duration `yaml:"lease_ttl"`
	// Timeout bounds one JetStream request (default 5s).
	Timeout duration `yaml:"timeout"`
	// MirrorOf makes this node a read-only standby of another cluster
	// (failover mode 2, docs/engines.md): the JetStream domain of the
	// primary, whose topics it mirrors and serves reads of.
	MirrorOf string `yaml:"mirror_of"`
}

// authConfig is device authentication, the ACL and quotas (docs/security.md).
// Absent: every MQTT client may connect and use every topic (logged as a
// warning at start).
type authConfig struct {
	Anonymous bool `yaml:"anonymous"` // allow clients with no credentials
	Static    *struct {
		File   string   `yaml:"file"`
		Reload duration `yaml:"reload"`
	} `yaml:"static"`
	HMAC *struct {
		Products map[string]string `yaml:"products"` // product → secret
		Devices  map[string]string `yaml:"devices"`  // "product:device" → secret
		Skew     duration          `yaml:"skew"`
		// Expires is when the secrets are due for rotation: the key_expiry
		// alarm warns ahead of it.
		Expires date `yaml:"expires"`
	} `yaml:"hmac"`
	JWT *struct {
		Secret     string   `yaml:"secret"`
		PublicKeys string   `yaml:"public_keys"` // PEM file
		Algorithms []string `yaml:"algorithms"`
		Issuer     string   `yaml:"issuer"`
		Audience   string   `yaml:"audience"`
		// SecretExpires is when the HS256 secret is due for rotation.
		SecretExpires date `yaml:"secret_expires"`
	} `yaml:"jwt"`
	MTLS *struct {
		Field           string `yaml:"field"` // cn (default), dns, uri, email
		RequireClientID bool   `yaml:"require_clientid"`
	} `yaml:"mtls"`
	ACL    []auth.ACLRule    `yaml:"acl"`
	Quotas *auth.QuotaConfig `yaml:"quotas"`
}

// mqttConfig is the gateway's section. Zero values mean the gateway's
// defaults (gateway.Options).
type mqttConfig struct {
	// Addr and WS.Addr: absent keeps the flag's default; "" disables the
	// listener (as --mqtt "" and --ws "" do).
	Addr *string `yaml:"addr"`
	WS   struct {
		Addr *string `yaml:"addr"`
		Path string  `yaml:"path"`
	} `yaml:"ws"`
	// TLS lists extra listeners with certificates (TLS and WSS).
	TLS              []tlsListenerConfig `yaml:"tls"`
	MaxPacketBytes   int                 `yaml:"max_packet_bytes"`
	ConnectTimeout   duration            `yaml:"connect_timeout"`
	MaxKeepalive     uint16              `yaml:"max_keepalive"`
	WriteTimeout     duration            `yaml:"write_timeout"`
	MaxPendingWrites int                 `yaml:"max_pending_writes"`
	// MaxQueuedMessages and MaxQueuedMessagesBytes bound the QoS 1/2
	// messages queued for a connected client beyond its receive maximum
	// (gateway.Options.MaxQueuedOnline, MaxQueuedOnlineBytes; defaults
	// 262,144 and 64 MiB of payload); past either, a new message is not
	// queued (ferrymq_mqtt_inflight_dropped_total). An offline session's
	// queue has its own bound: bridge.offline_max_messages, …_bytes.
	MaxQueuedMessages      int `yaml:"max_queued_messages"`
	MaxQueuedMessagesBytes int `yaml:"max_queued_messages_bytes"`
	// ReadBufferBytes and WriteBufferBytes are accepted and ignored (the
	// engine keeps no per-connection buffer; they sized mochi's).
	ReadBufferBytes  int `yaml:"read_buffer_bytes"`
	WriteBufferBytes int `yaml:"write_buffer_bytes"`
	// ProxyProtocol makes the --mqtt TCP listener expect a PROXY protocol
	// v1/v2 header from a load balancer.
	ProxyProtocol  bool   `yaml:"proxy_protocol"`
	ReceiveMaximum uint16 `yaml:"receive_maximum"`
	MaxInflight    int    `yaml:"max_inflight"`
	MaxClients     int64  `yaml:"max_clients"`
}

// tlsListenerConfig is an MQTT listener with a certificate.
type tlsListenerConfig struct {
	Name     string `yaml:"name"`
	Type     string `yaml:"type"` // tcp (MQTT over TLS) or ws (WSS)
	Addr     string `yaml:"addr"`
	Path     string `yaml:"path"`
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
	ClientCA string `yaml:"client_ca"` // set: clients must present a certificate it signed (mTLS)
}

// bridgeConfig maps MQTT onto the core and back.
type bridgeConfig struct {
	Uplink             []bridge.UplinkRule `yaml:"uplink"`
	EventsTopic        string              `yaml:"events_topic"`
	DisableEvents      bool                `yaml:"disable_events"`
	MaxInflight        int                 `yaml:"max_inflight"`
	Downlink           []downlinkConfig    `yaml:"downlink"`
	DisableDownlink    bool                `yaml:"disable_downlink"`
	ReceiptsTopic      string              `yaml:"receipts_topic"`
	DisableReceipts    bool                `yaml:"disable_receipts"`
	DeadLetterTopic    string              `yaml:"dead_letter_topic"`
	OfflineMaxMessages int                 `yaml:"offline_max_messages"`
	OfflineMaxBytes    int                 `yaml:"offline_max_bytes"`
	HoldUnknown        *duration           `yaml:"hold_unknown"`
	// Node names this gateway in events, receipts and its downlink offsets;
	// default the host name (with --core-remote: host name and process ID).
	Node string `yaml:"node"`
}

// downlinkConfig is one downlink rule; qos defaults to 1.
type downlinkConfig struct {
	Topic     string   `yaml:"topic"`
	MQTTTopic string   `yaml:"mqtt_topic"`
	QoS       *int     `yaml:"qos"`
	TTL       duration `yaml:"ttl"`
}

// bridgeOptions converts the bridge section (down: its downlink rules);
// the node fills in which core the bridge uses.
func bridgeOptions(b bridgeConfig, down []bridge.DownlinkRule) bridge.Options {
	return bridge.Options{
		Uplink:             b.Uplink,
		EventsTopic:        b.EventsTopic,
		DisableEvents:      b.DisableEvents,
		MaxInflight:        b.MaxInflight,
		Downlink:           down,
		DisableDownlink:    b.DisableDownlink,
		ReceiptsTopic:      b.ReceiptsTopic,
		DisableReceipts:    b.DisableReceipts,
		DeadLetterTopic:    b.DeadLetterTopic,
		OfflineMaxMessages: b.OfflineMaxMessages,
		OfflineMaxBytes:    b.OfflineMaxBytes,
		HoldUnknown:        holdUnknown(b.HoldUnknown),
		Node:               b.Node,
	}
}

// holdUnknown is the configured hold for unknown clients: absent is 0 (the
// mode's default: off in front of a remote core and on NATS), 0s is -1
// (off).
func holdUnknown(configured *duration) time.Duration {
	if configured == nil {
		return 0
	}
	if *configured <= 0 {
		return -1
	}
	return time.Duration(*configured)
}

// downlinkRules converts the config's rules (nil: the bridge's default).
func (b bridgeConfig) downlinkRules() ([]bridge.DownlinkRule, error) {
	if b.Downlink == nil {
		return nil, nil
	}
	rules := make([]bridge.DownlinkRule, len(b.Downlink))
	for i, d := range b.Downlink {
		qos := 1
		if d.QoS != nil {
			qos = *d.QoS
		}
		if qos < 0 || qos > 2 {
			return nil, fmt.Errorf("bridge downlink rule %d: qos %d: want 0, 1 or 2", i+1, qos)
		}
		rules[i] = bridge.DownlinkRule{Topic: d.Topic, MQTTTopic: d.MQTTTopic, QoS: byte(qos), TTL: time.Duration(d.TTL)}
	}
	return rules, nil
}

// duration is a time.Duration written as "90s", "72h".
type duration time.Duration

func (d *duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: want a duration like 30s or 72h", n.Line)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("line %d: bad duration %q", n.Line, s)
	}
	*d = duration(v)
	return nil
}

// maxConfigBytes bounds a config file.
const maxConfigBytes = 1 << 20

// loadConfig reads and strictly decodes a config file.
func loadConfig(path string) (fileConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return fileConfig{}, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return fileConfig{}, fmt.Errorf("config %s: %w", path, err)
	}
	if len(b) > maxConfigBytes {
		return fileConfig{}, fmt.Errorf("config %s: larger than %d bytes", path, maxConfigBytes)
	}
	cfg, err := parseConfig(b)
	if err != nil {
		return fileConfig{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// parseConfig decodes YAML strictly: unknown keys, wrong types and more
// than one document are errors.
func parseConfig(b []byte) (fileConfig, error) {
	var cfg fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return fileConfig{}, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return fileConfig{}, errors.New("more than one YAML document")
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fileConfig{}, err
	}
	cfg.keys = keyPaths(&doc)
	if cfg.Flush != "" && cfg.Flush != "sync" && cfg.Flush != "async" {
		return fileConfig{}, fmt.Errorf("flush %q: want sync or async", cfg.Flush)
	}
	if cfg.Store.SegmentBytes < 0 || cfg.Store.MaxDiskBytes < 0 || cfg.Store.MaxMessageBytes < 0 || cfg.Store.DefaultQueues < 0 {
		return fileConfig{}, errors.New("store sizes and counts must not be negative")
	}
	if cfg.Core.MaxFrameBytes < 0 || cfg.HTTP.MaxBodyBytes < 0 {
		return fileConfig{}, errors.New("core.max_frame_bytes and http.max_body_bytes must not be negative")
	}
	if cfg.MQTT.MaxQueuedMessages < 0 || cfg.MQTT.MaxQueuedMessagesBytes < 0 {
		return fileConfig{}, errors.New("mqtt.max_queued_messages and mqtt.max_queued_messages_bytes must not be negative")
	}
	return cfg, nil
}

// keyPaths lists the key paths a YAML document gives, each once, in
// document order: "store", "store.segment_bytes", "mqtt.tls.cert" (a
// sequence's items add no path element; the keys of a map-valued key, like
// auth.hmac.products, are path elements too).
func keyPaths(doc *yaml.Node) []string {
	var paths []string
	seen := map[string]bool{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c, prefix)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if prefix != "" {
					p = prefix + "." + p
				}
				if !seen[p] {
					seen[p] = true
					paths = append(paths, p)
				}
				walk(n.Content[i+1], p)
			}
		case yaml.AliasNode:
			if n.Alias != nil {
				walk(n.Alias, prefix)
			}
		}
	}
	walk(doc, "")
	return paths
}
