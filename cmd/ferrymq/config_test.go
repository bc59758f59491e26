package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/httpapi"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/core/wire"
	"github.com/ferrymq/ferrymq/gateway/alarm"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/node"
)

func TestParseConfig(t *testing.T) {
	cfg, err := parseConfig([]byte(`
data: /var/lib/ferrymq
flush: sync
log: {level: debug}
store:
  retention: 24h
  max_disk_bytes: 1000000
  auto_create_topics: false
core: {addr: "127.0.0.1:1", token: "t"}
http: {addr: "127.0.0.1:2"}
`))
	require.NoError(t, err)
	require.Equal(t, "/var/lib/ferrymq", cfg.Data)
	require.Equal(t, "sync", cfg.Flush)
	require.Equal(t, 24*time.Hour, time.Duration(cfg.Store.Retention))
	require.False(t, *cfg.Store.AutoCreateTopics)
	require.Equal(t, "127.0.0.1:2", cfg.HTTP.Addr)

	empty, err := parseConfig(nil)
	require.NoError(t, err)
	require.Empty(t, empty.Data)

	for name, bad := range map[string]string{
		"unknown key":     "dat: x",
		"unknown nested":  "store: {segment: 1}",
		"wrong type":      "store: {segment_bytes: lots}",
		"bad duration":    "store: {retention: forever}",
		"bad flush":       "flush: sometimes",
		"negative":        "store: {max_disk_bytes: -1}",
		"two documents":   "data: a\n---\ndata: b",
		"not a mapping":   "- a\n- b",
		"malformed yaml":  "data: [",
		"tab indentation": "store:\n\tretention: 1h",
	} {
		_, err := parseConfig([]byte(bad))
		require.Error(t, err, name)
	}
}

func TestServeConfigFileAndFlagPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ferrymq.yaml")
	require.NoError(t, os.WriteFile(path, []byte("data: "+filepath.Join(dir, "from-config")+"\nflush: sync\ncore: {addr: \"127.0.0.1:0\"}\n"), 0o644))
	o := &serveOptions{}
	cmd := &cobra.Command{Use: "serve"}
	o.AddFlags(cmd)
	require.NoError(t, cmd.Flags().Parse([]string{"--config", path, "--flush", "async"}))
	_, err := o.applyConfig(cmd)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "from-config"), o.dataDir, "the file sets what no flag set")
	require.Equal(t, "async", o.flush, "a flag wins over the file")
	require.Equal(t, "127.0.0.1:0", o.coreAddr)

	require.NoError(t, os.WriteFile(path, []byte("bogus: 1\n"), 0o644))
	_, err = o.applyConfig(cmd)
	require.ErrorContains(t, err, "bogus")
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("data: ./data\nflush: sync\nstore: {retention: 1h}\n"))
	f.Add([]byte("core: {addr: \":10911\"}"))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseConfig(b) // must never panic
	})
}

// The sample in testdata/ must stay valid, and every key it sets must
// decode to the value written there: the table below names each key of the
// file by its path, and a key the file sets that the table does not check
// (or the other way round) fails the test, so the two are kept in step.
func TestSampleConfigParses(t *testing.T) {
	path := filepath.Join("..", "..", "testdata", "ferrymq.yaml")
	cfg, err := loadConfig(path)
	require.NoError(t, err)
	require.Equal(t, defaultGCPercent, cfg.GCPercent, "the sample shows the default")

	// Sections and lists the table reaches into: absent, it would panic.
	a := cfg.Auth
	require.NotNil(t, a)
	require.NotNil(t, a.Static)
	require.NotNil(t, a.HMAC)
	require.NotNil(t, a.JWT)
	require.NotNil(t, a.MTLS)
	require.NotNil(t, a.Quotas)
	require.Len(t, a.ACL, 2)
	require.Len(t, cfg.MQTT.TLS, 1)
	require.Len(t, cfg.Bridge.Uplink, 2)
	require.Len(t, cfg.Bridge.Downlink, 1)
	m, b, q, al := cfg.MQTT, cfg.Bridge, a.Quotas, cfg.Alarms
	require.NotNil(t, al.Enabled)
	require.Len(t, al.Webhooks, 1)
	d := func(s string) duration {
		v, err := time.ParseDuration(s)
		require.NoError(t, err)
		return duration(v)
	}

	keys := []struct {
		key       string
		got, want any
	}{
		{"data", cfg.Data, "./data"},
		{"flush", cfg.Flush, "sync"},
		{"log.level", cfg.Log.Level, "info"},
		{"log.pretty", cfg.Log.Pretty, false},
		{"gc_percent", cfg.GCPercent, 50},

		{"store.segment_bytes", cfg.Store.SegmentBytes, int64(1 << 30)},
		{"store.group_commit_delay", cfg.Store.GroupCommitDelay, ptr(d("200us"))},
		{"store.retention", cfg.Store.Retention, d("72h")},
		{"store.max_disk_bytes", cfg.Store.MaxDiskBytes, int64(0)},
		{"store.max_message_bytes", cfg.Store.MaxMessageBytes, core.DefaultMaxMessageBytes},
		{"store.default_queues", cfg.Store.DefaultQueues, 8},
		{"store.tail_cache_bytes", cfg.Store.TailCacheBytes, int64(store.DefaultTailCacheBytes)},
		{"store.reader_cold_read_bytes_per_sec", cfg.Store.ReaderColdReadBytesPerSec, int64(store.DefaultReaderColdReadBytesPerSec)},
		{"store.cold_read_bytes_per_sec", cfg.Store.ColdReadBytesPerSec, int64(0)},
		{"store.cold_read_max_bytes", cfg.Store.ColdReadMaxBytes, store.DefaultColdReadMaxBytes},

		{"delay.max_delay", cfg.Delay.MaxDelay, d("960h")},
		{"delay.max_hold", cfg.Delay.MaxHold, d("18h12m16s")},
		{"shadows.max_bytes", cfg.Shadows.MaxBytes, shadow.DefaultMaxBytes},
		{"shadows.max_depth", cfg.Shadows.MaxDepth, shadow.DefaultMaxDepth},
		{"retry.schedule", cfg.Retry.Schedule, []duration{d("10s"), d("30s"), d("1m"), d("2m"), d("3m"), d("4m"), d("5m"), d("6m"),
			d("7m"), d("8m"), d("9m"), d("10m"), d("20m"), d("30m"), d("1h"), d("2h")}},
		{"retry.max_attempts", cfg.Retry.MaxAttempts, 16},
		{"trace.all", cfg.Trace.All, false},
		{"trace.topics", cfg.Trace.Topics, []string{}},
		{"trace.node", cfg.Trace.Node, ""},
		{"trace.sample", cfg.Trace.Sample, 0.0},
		{"transactions.first_check", cfg.Transactions.FirstCheck, d("6s")},
		{"transactions.check_interval", cfg.Transactions.CheckInterval, d("30s")},
		{"transactions.max_checks", cfg.Transactions.MaxChecks, 15},
		{"transactions.max_pending", cfg.Transactions.MaxPending, 100000},
		{"store.auto_create_topics", cfg.Store.AutoCreateTopics, ptr(true)},

		{"engine", cfg.Engine, "embedded"},
		{"nats.urls", cfg.NATS.URLs, []string{"nats://127.0.0.1:4222"}},
		{"nats.creds", cfg.NATS.Creds, ""},
		{"nats.user", cfg.NATS.User, ""},
		{"nats.password", cfg.NATS.Password, ""},
		{"nats.token", cfg.NATS.Token, ""},
		{"nats.tls.ca", cfg.NATS.TLS.CA, ""},
		{"nats.tls.cert", cfg.NATS.TLS.Cert, ""},
		{"nats.tls.key", cfg.NATS.TLS.Key, ""},
		{"nats.replicas", cfg.NATS.Replicas, 1},
		{"nats.node", cfg.NATS.Node, ""},
		{"nats.lease_ttl", cfg.NATS.LeaseTTL, d("10s")},
		{"nats.timeout", cfg.NATS.Timeout, d("5s")},
		{"nats.mirror_of", cfg.NATS.MirrorOf, ""},

		{"core.addr", cfg.Core.Addr, ":10911"},
		{"core.token", cfg.Core.Token, ""},
		{"core.max_frame_bytes", cfg.Core.MaxFrameBytes, wire.DefaultMaxFrame},
		{"core.advertise", cfg.Core.Advertise, ""},
		{"http.addr", cfg.HTTP.Addr, ":18083"},
		{"http.max_body_bytes", cfg.HTTP.MaxBodyBytes, int64(httpapi.DefaultMaxBodyBytes)},

		{"mqtt.addr", m.Addr, ptr(":1883")},
		{"mqtt.ws.addr", m.WS.Addr, ptr(":8083")},
		{"mqtt.ws.path", m.WS.Path, "/mqtt"},
		{"mqtt.tls[0].name", m.TLS[0].Name, "tls"},
		{"mqtt.tls[0].type", m.TLS[0].Type, "tcp"},
		{"mqtt.tls[0].addr", m.TLS[0].Addr, ":8883"},
		{"mqtt.tls[0].cert", m.TLS[0].Cert, "testdata/tls/server.pem"},
		{"mqtt.tls[0].key", m.TLS[0].Key, "testdata/tls/server-key.pem"},
		{"mqtt.tls[0].client_ca", m.TLS[0].ClientCA, ""},
		{"mqtt.tls[0].path", m.TLS[0].Path, ""},
		{"mqtt.max_packet_bytes", m.MaxPacketBytes, engine.DefaultMaxPacketBytes},
		{"mqtt.connect_timeout", m.ConnectTimeout, d("10s")},
		{"mqtt.max_keepalive", m.MaxKeepalive, uint16(1200)},
		{"mqtt.write_timeout", m.WriteTimeout, d("15s")},
		{"mqtt.max_pending_writes", m.MaxPendingWrites, 65536},
		{"mqtt.proxy_protocol", m.ProxyProtocol, false},
		{"mqtt.receive_maximum", m.ReceiveMaximum, uint16(256)},
		{"mqtt.max_inflight", m.MaxInflight, 1024},
		{"mqtt.max_queued_messages", m.MaxQueuedMessages, 262144},
		{"mqtt.max_queued_messages_bytes", m.MaxQueuedMessagesBytes, 64 << 20},
		{"mqtt.max_clients", m.MaxClients, int64(0)},
		{"mqtt.read_buffer_bytes", m.ReadBufferBytes, 0},
		{"mqtt.write_buffer_bytes", m.WriteBufferBytes, 0},

		{"bridge.uplink[0].filter", b.Uplink[0].Filter, "vehicles/+/telemetry/#"},
		{"bridge.uplink[0].topic", b.Uplink[0].Topic, "telemetry"},
		{"bridge.uplink[0].key", b.Uplink[0].Key, "${level:2}"},
		{"bridge.uplink[0].tag", b.Uplink[0].Tag, "${level:4}"},
		{"bridge.uplink[1].filter", b.Uplink[1].Filter, "#"},
		{"bridge.uplink[1].topic", b.Uplink[1].Topic, "${level:1}"},
		{"bridge.uplink[1].key", b.Uplink[1].Key, "${clientid}"},
		{"bridge.events_topic", b.EventsTopic, "device-events"},
		{"bridge.disable_events", b.DisableEvents, false},
		{"bridge.max_inflight", b.MaxInflight, 256},
		{"bridge.downlink[0].topic", b.Downlink[0].Topic, "commands"},
		{"bridge.downlink[0].mqtt_topic", b.Downlink[0].MQTTTopic, "commands/${key}"},
		{"bridge.downlink[0].qos", b.Downlink[0].QoS, ptr(1)},
		{"bridge.downlink[0].ttl", b.Downlink[0].TTL, d("24h")},
		{"bridge.disable_downlink", b.DisableDownlink, false},
		{"bridge.receipts_topic", b.ReceiptsTopic, "device-receipts"},
		{"bridge.disable_receipts", b.DisableReceipts, false},
		{"bridge.node", b.Node, ""},
		{"bridge.offline_max_messages", b.OfflineMaxMessages, 1000},
		{"bridge.offline_max_bytes", b.OfflineMaxBytes, bridge.DefaultOfflineMaxBytes},
		{"bridge.hold_unknown", b.HoldUnknown, ptr(d("1h"))},
		{"bridge.dead_letter_topic", b.DeadLetterTopic, "downlink-dlq"},

		{"auth.anonymous", a.Anonymous, false},
		{"auth.static.file", a.Static.File, "testdata/auth/users.yaml"},
		{"auth.static.reload", a.Static.Reload, d("10s")},
		{"auth.hmac.products.fleet", a.HMAC.Products["fleet"], "product-secret"},
		{"auth.hmac.devices.fleet:car-7", a.HMAC.Devices["fleet:car-7"], "device-secret"},
		{"auth.hmac.skew", a.HMAC.Skew, d("5m")},
		{"auth.jwt.secret", a.JWT.Secret, "jwt-shared-secret"},
		{"auth.jwt.public_keys", a.JWT.PublicKeys, ""},
		{"auth.jwt.algorithms", a.JWT.Algorithms, []string{"HS256"}},
		{"auth.jwt.issuer", a.JWT.Issuer, ""},
		{"auth.jwt.audience", a.JWT.Audience, ""},
		{"auth.mtls.field", a.MTLS.Field, "cn"},
		{"auth.mtls.require_clientid", a.MTLS.RequireClientID, true},
		{"auth.acl[0].action", a.ACL[0].Action, "allow"},
		{"auth.acl[0].publish", a.ACL[0].Publish, []string{"devices/%c/#", "telemetry/%c/#"}},
		{"auth.acl[0].subscribe", a.ACL[0].Subscribe, []string{"devices/%c/commands/#", "commands/%c", "cars/%c/#"}},
		{"auth.acl[1].action", a.ACL[1].Action, "allow"},
		{"auth.acl[1].users", a.ACL[1].Users, []string{"ops"}},
		{"auth.acl[1].clients", a.ACL[1].Clients, []string{"console-1"}},
		{"auth.acl[1].subscribe", a.ACL[1].Subscribe, []string{"#"}},
		{"auth.quotas.max_connections", q.MaxConnections, 0},
		{"auth.quotas.max_connections_per_ip", q.MaxConnectionsPerIP, 0},
		{"auth.quotas.connect_rate_per_ip", q.ConnectRatePerIP, 100.0},
		{"auth.quotas.connect_burst_per_ip", q.ConnectBurstPerIP, 200},
		{"auth.quotas.ban_after", q.BanAfter, 5},
		{"auth.quotas.ban_for", q.BanFor, 5 * time.Minute},
		{"auth.quotas.publish_rate", q.PublishRate, 100.0},
		{"auth.quotas.publish_burst", q.PublishBurst, 200},
		{"auth.quotas.byte_rate", q.ByteRate, float64(1 << 20)},
		{"auth.quotas.byte_burst", q.ByteBurst, core.DefaultMaxMessageBytes},
		{"auth.quotas.max_subscriptions", q.MaxSubscriptions, 100},
		{"auth.quotas.max_topic_levels", q.MaxTopicLevels, 32},
		{"auth.quotas.max_topic_length", q.MaxTopicLength, 1024},
		{"auth.quotas.max_tracked_ips", q.MaxTrackedIPs, 50000},
		{"auth.quotas.ipv6_prefix_bits", q.IPv6PrefixBits, 64},
		{"auth.hmac.expires", time.Time(a.HMAC.Expires), time.Time{}},
		{"auth.jwt.secret_expires", time.Time(a.JWT.SecretExpires), time.Time{}},

		// The alarms section shows node's and alarm's defaults.
		{"alarms.enabled", *al.Enabled, true},
		{"alarms.interval", time.Duration(al.Interval), alarm.DefaultInterval},
		{"alarms.clear_after", time.Duration(al.ClearAfter), alarm.DefaultClearAfter},
		{"alarms.disabled", al.Disabled, []string{}},
		{"alarms.disk_usage", al.DiskUsage, node.DefaultDiskUsage},
		{"alarms.fsync_p99", time.Duration(al.FsyncP99), node.DefaultFsyncP99},
		{"alarms.fsync_window", time.Duration(al.FsyncWindow), node.DefaultFsyncWindow},
		{"alarms.fsync_min_count", al.FsyncMinCount, int64(node.DefaultFsyncMinCount)},
		{"alarms.group_lag", al.GroupLag, int64(node.DefaultGroupLag)},
		{"alarms.group_lag_growing", time.Duration(al.GroupLagGrowing), node.DefaultGrowingPeriod},
		{"alarms.retry_backlog_growing", time.Duration(al.RetryBacklogGrowing), node.DefaultGrowingPeriod},
		{"alarms.dead_letter_quiet", time.Duration(al.DeadLetterQuiet), node.DefaultArrivalsQuiet},
		{"alarms.drop_quiet", time.Duration(al.DropQuiet), node.DefaultArrivalsQuiet},
		{"alarms.delay_overdue", time.Duration(al.DelayOverdue), node.DefaultDelayOverdue},
		{"alarms.disconnect_rate", al.DisconnectRate, float64(node.DefaultDisconnectRate)},
		{"alarms.disconnect_window", time.Duration(al.DisconnectWindow), node.DefaultDisconnectWindow},
		{"alarms.certificate_expiry_days", time.Duration(al.CertificateDays) * 24 * time.Hour, node.DefaultExpiryWarning},
		{"alarms.key_expiry_days", time.Duration(al.KeyDays) * 24 * time.Hour, node.DefaultExpiryWarning},
		{"alarms.webhooks[0].url", al.Webhooks[0].URL, "http://127.0.0.1:9099/ferrymq-alarms"},
		{"alarms.webhooks[0].headers.Authorization", al.Webhooks[0].Headers["Authorization"], "Bearer alarm-hook-secret"},
		{"alarms.webhooks[0].timeout", time.Duration(al.Webhooks[0].Timeout), alarm.DefaultWebhookTimeout},
		{"alarms.webhooks[0].attempts", al.Webhooks[0].Attempts, alarm.DefaultWebhookAttempts},
		{"alarms.webhooks[0].queue", al.Webhooks[0].Queue, alarm.DefaultWebhookQueue},
	}
	checked := map[string]bool{}
	for _, k := range keys {
		require.Falsef(t, checked[k.key], "%s is in the table twice", k.key)
		checked[k.key] = true
		require.Equalf(t, k.want, k.got, "%s", k.key)
	}
	// The sections that say they show the defaults show the packages' own.
	var schedule []time.Duration
	for _, v := range cfg.Retry.Schedule {
		schedule = append(schedule, time.Duration(v))
	}
	require.Equal(t, retry.DefaultSchedule, schedule, "retry.schedule")
	require.Equal(t, retry.DefaultMaxAttempts, cfg.Retry.MaxAttempts, "retry.max_attempts")
	require.Equal(t, delay.DefaultMaxDelay, time.Duration(cfg.Delay.MaxDelay), "delay.max_delay")
	require.Equal(t, delay.DefaultMaxHold, time.Duration(cfg.Delay.MaxHold), "delay.max_hold")
	require.Equal(t, txn.DefaultFirstCheck, time.Duration(cfg.Transactions.FirstCheck), "transactions.first_check")
	require.Equal(t, txn.DefaultCheckInterval, time.Duration(cfg.Transactions.CheckInterval), "transactions.check_interval")
	require.Equal(t, txn.DefaultMaxChecks, cfg.Transactions.MaxChecks, "transactions.max_checks")
	require.Equal(t, txn.DefaultMaxPending, cfg.Transactions.MaxPending, "transactions.max_pending")
	require.Equal(t, store.DefaultGroupCommitDelay, time.Duration(*cfg.Store.GroupCommitDelay), "store.group_commit_delay")

	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	set := map[string]bool{}
	for _, k := range yamlKeys(doc.Content[0], "") {
		set[k] = true
		require.Truef(t, checked[k], "the sample sets %s, which the table does not check", k)
	}
	for k := range checked {
		require.Truef(t, set[k], "the table checks %s, which the sample does not set", k)
	}
}

// yamlKeys lists the paths of a YAML value's leaves ("store.retention",
// "mqtt.tls[0].name"); a list of scalars is one leaf.
func yamlKeys(n *yaml.Node, path string) []string {
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch {
	case n.Kind == yaml.MappingNode:
		var out []string
		for i := 0; i+1 < len(n.Content); i += 2 {
			out = append(out, yamlKeys(n.Content[i+1], join(n.Content[i].Value))...)
		}
		return out
	case n.Kind == yaml.SequenceNode && len(n.Content) > 0 && n.Content[0].Kind == yaml.MappingNode:
		var out []string
		for i, e := range n.Content {
			out = append(out, yamlKeys(e, fmt.Sprintf("%s[%d]", path, i))...)
		}
		return out
	}
	return []string{path}
}

func ptr[T any](v T) *T { return &v }

// configured resolves serve's flags args over a config file holding cfg,
// as serve does, and returns the options, the command (its flags parsed)
// and the file's contents.
func configured(t *testing.T, cfg string, args ...string) (*serveOptions, *cobra.Command, fileConfig) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ferrymq.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o644))
	o := &serveOptions{}
	cmd := &cobra.Command{Use: "serve"}
	o.AddFlags(cmd)
	require.NoError(t, cmd.Flags().Parse(append([]string{"--config", path}, args...)))
	fc, err := o.applyConfig(cmd)
	require.NoError(t, err)
	return o, cmd, fc
}

// An empty listener address in the file disables that listener, as the
// empty flag does; an absent one keeps the default.
func TestConfigEmptyListenerDisables(t *testing.T) {
	o, _, _ := configured(t, "mqtt:\n  ws: {addr: \"\"}\n")
	require.Equal(t, "", o.wsAddr, "ws disabled by the file")
	require.Equal(t, ":1883", o.mqttAddr, "mqtt keeps its default")
}

// The nats section's TLS files become the engine's client TLS: a CA pool
// and a client certificate; a missing or empty file is a clear error.
func TestNATSTLSFromConfig(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tls")
	var c natsConfig
	cfg, err := natsTLS(c)
	require.NoError(t, err)
	require.Nil(t, cfg, "no TLS configured")
	c.TLS.CA, c.TLS.Cert, c.TLS.Key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	cfg, err = natsTLS(c)
	require.NoError(t, err)
	require.NotNil(t, cfg.RootCAs)
	require.Len(t, cfg.Certificates, 1)
	c.TLS.CA = filepath.Join(dir, "missing.pem")
	_, err = natsTLS(c)
	require.ErrorContains(t, err, "nats tls ca")
	empty := filepath.Join(t.TempDir(), "empty.pem")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	c.TLS.CA = empty
	_, err = natsTLS(c)
	require.ErrorContains(t, err, "no certificate")
}

// mqtt.max_queued_messages and mqtt.max_queued_messages_bytes bound a
// connected client's queue: they reach the gateway's MaxQueuedOnline and
// MaxQueuedOnlineBytes; absent, the gateway's defaults stay.
func TestConfigMaxQueuedMessages(t *testing.T) {
	o, _, cfg := configured(t, "mqtt: {max_queued_messages: 1000, max_queued_messages_bytes: 1048576}\n")
	nopts, err := o.nodeOptions(cfg, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 1000, nopts.Gateway.MaxQueuedOnline)
	require.Equal(t, 1<<20, nopts.Gateway.MaxQueuedOnlineBytes)

	nopts, err = o.nodeOptions(fileConfig{}, io.Discard)
	require.NoError(t, err)
	require.Zero(t, nopts.Gateway.MaxQueuedOnline, "zero: the gateway's default")

	_, err = parseConfig([]byte("mqtt: {max_queued_messages: -1}"))
	require.ErrorContains(t, err, "max_queued_messages")
}

// store.tail_cache_bytes and the cold-read budgets reach the store's
// options as given (negative: none, no bound); absent, the store's defaults.
func TestConfigTailCacheAndColdReads(t *testing.T) {
	o, _, cfg := configured(t, "store: {tail_cache_bytes: -1, reader_cold_read_bytes_per_sec: 52428800, cold_read_bytes_per_sec: 104857600, cold_read_max_bytes: -1}\n")
	nopts, err := o.nodeOptions(cfg, io.Discard)
	require.NoError(t, err)
	require.Equal(t, int64(-1), nopts.Store.TailCacheBytes)
	require.Equal(t, int64(50<<20), nopts.Store.ReaderColdReadBytesPerSec)
	require.Equal(t, int64(100<<20), nopts.Store.ColdReadBytesPerSec)
	require.Equal(t, -1, nopts.Store.ColdReadMaxBytes)

	nopts, err = o.nodeOptions(fileConfig{}, io.Discard)
	require.NoError(t, err)
	require.Zero(t, nopts.Store.TailCacheBytes, "zero: the store's default")
	require.Zero(t, nopts.Store.ReaderColdReadBytesPerSec)
}

// The collector target: serve's default, the file's gc_percent, the flag
// over the file, and GOGC in the environment over both.
func TestServeGCTarget(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferrymq.yaml")
	require.NoError(t, os.WriteFile(path, []byte("gc_percent: 30\n"), 0o644))
	noEnv := func(string) string { return "" }
	target := func(args ...string) (int, bool, error) {
		o := &serveOptions{}
		cmd := &cobra.Command{Use: "serve"}
		o.AddFlags(cmd)
		require.NoError(t, cmd.Flags().Parse(args))
		_, err := o.applyConfig(cmd)
		require.NoError(t, err)
		return o.gcTarget(noEnv)
	}
	pct, ok, err := target()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, defaultGCPercent, pct)
	pct, _, err = target("--config", path)
	require.NoError(t, err)
	require.Equal(t, 30, pct)
	pct, _, err = target("--config", path, "--gc-percent", "80")
	require.NoError(t, err)
	require.Equal(t, 80, pct)
	_, _, err = target("--gc-percent", "5")
	require.ErrorContains(t, err, "want 10 to 1000")

	o := &serveOptions{gcPercent: 80}
	_, ok, err = o.gcTarget(func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	})
	require.NoError(t, err)
	require.False(t, ok, "GOGC set: the runtime follows it")
}

// TestSampleConfigShowsEveryKey: testdata/ferrymq.yaml gives every key of
// the config file's structure (fileConfig walked by its yaml tags, through
// nested sections and lists of sections; a map's keys are the user's), and
// nothing else (it loads strictly).
func TestSampleConfigShowsEveryKey(t *testing.T) {
	path := filepath.Join("..", "..", "testdata", "ferrymq.yaml")
	cfg, err := loadConfig(path)
	require.NoError(t, err, "the sample has no unknown keys")
	given := map[string]bool{}
	for _, k := range cfg.keys {
		given[k] = true
	}
	want := configKeyPaths(reflect.TypeFor[fileConfig](), "")
	// The walk reaches behind pointers and into lists of sections; if it
	// did not, the test would pass with nothing to check.
	require.Contains(t, want, "auth.quotas.ipv6_prefix_bits")
	require.Contains(t, want, "bridge.downlink.qos")
	require.NotContains(t, want, "keys", "unexported fields are no keys")
	var missing []string
	for _, k := range want {
		if !given[k] {
			missing = append(missing, k)
		}
	}
	require.Empty(t, missing, "keys of the config that %s does not show", path)
}

// configKeyPaths lists the key paths of a config type: each yaml-tagged
// field's, and below a section (a struct, a list of structs) its fields'.
// A type that decodes itself (duration), a map and a list of scalars are
// leaves.
func configKeyPaths(typ reflect.Type, prefix string) []string {
	unmarshaler := reflect.TypeFor[yaml.Unmarshaler]()
	var paths []string
	for f := range typ.Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		section := ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(unmarshaler) && ft != reflect.TypeFor[time.Time]()
		if strings.Contains(opts, "inline") && section {
			paths = append(paths, configKeyPaths(ft, prefix)...)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name) // yaml's default key
		}
		p := name
		if prefix != "" {
			p = prefix + "." + name
		}
		paths = append(paths, p)
		if section {
			paths = append(paths, configKeyPaths(ft, p)...)
		}
	}
	return paths
}
