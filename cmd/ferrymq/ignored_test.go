package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ignoredFor resolves serve's flags args over the config file cfg, as serve
// does, and returns the keys ignoredSettings reports, with the mode.
func ignoredFor(t *testing.T, cfg string, args ...string) (string, []string) {
	t.Helper()
	o, cmd, fc := configured(t, cfg, args...)
	var keys []string
	for _, s := range ignoredSettings(o.mode(), o, fc, cmd.Flags().Changed) {
		require.NotEmpty(t, s.Why, s.Key)
		keys = append(keys, s.Key)
	}
	return o.mode(), keys
}

// Each mode names the settings given that it does not use, one key each,
// and none that it uses.
func TestIgnoredSettingsByMode(t *testing.T) {
	getenv = func(string) string { return "" }
	t.Cleanup(func() { getenv = os.Getenv })
	for _, tc := range []struct {
		name string
		cfg  string
		args []string
		mode string
		want []string
	}{
		{name: "embedded, everything applies", mode: modeEmbedded,
			cfg:  "flush: sync\nstore: {segment_bytes: 1024, retention: 1h}\ntrace: {topics: [tel], node: n1, sample: 0.5}\ndelay: {max_delay: 1h}\n",
			args: []string{"--flush", "sync"}},
		{name: "embedded, NATS settings", mode: modeEmbedded,
			cfg:  "nats: {urls: [nats://a:4222], node: n1, tls: {ca: ca.pem}}\n",
			args: []string{"--nats", "nats://b:4222", "--node", "n2"},
			want: []string{"--nats", "nats.urls", "nats.node", "nats.tls.ca", "--node"}},
		{name: "nats, commit-log settings", mode: modeNATS,
			cfg:  "engine: nats\nflush: sync\nstore: {segment_bytes: 1024, group_commit_delay: 1ms, retention: 1h, max_disk_bytes: 10}\nnats: {urls: [nats://a:4222], node: n1}\ntrace: {all: true, node: t1}\n",
			args: []string{"--segment-bytes", "2048", "--node", "n2"},
			want: []string{"--segment-bytes", "flush", "store.segment_bytes", "store.group_commit_delay", "trace.node"}},
		{name: "core-remote, the core's settings", mode: modeCoreRemote,
			cfg: "engine: nats\nflush: async\nstore: {retention: 1h, auto_create_topics: false}\ndelay: {max_delay: 1h}\nretry: {max_attempts: 3}\n" +
				"transactions: {max_checks: 2}\ncore: {addr: \":1\", token: secret}\nnats: {urls: [nats://a:4222]}\ntrace: {topics: [tel], node: gw}\nbridge: {node: gw}\n",
			args: []string{"--core-remote", "127.0.0.1:1", "--retention", "2h", "--core", ":2", "--node", "n"},
			want: []string{"--retention", "flush", "store.retention", "store.auto_create_topics", "--core", "core.addr", "delay.max_delay",
				"retry.max_attempts", "transactions.max_checks", "engine", "nats.urls", "--node"}},
		{name: "every mode: buffers, listeners off, trace that traces nothing, mTLS without client_ca", mode: modeEmbedded,
			cfg: "mqtt: {read_buffer_bytes: 1, write_buffer_bytes: 2, proxy_protocol: true, ws: {path: /x}, tls: [{cert: c, key: k}]}\n" +
				"trace: {node: n, sample: 0.5}\nauth: {mtls: {field: cn}}\n",
			args: []string{"--ws", "", "--mqtt", ""},
			want: []string{"mqtt.read_buffer_bytes", "mqtt.write_buffer_bytes", "trace.node", "trace.sample", "mqtt.ws.path",
				"mqtt.proxy_protocol", "auth.mtls.field"}},
		{name: "trace.all wins over trace.topics", mode: modeEmbedded,
			cfg:  "trace: {all: true, topics: [a]}\n",
			want: []string{"trace.topics"}},
		{name: "mTLS with a listener that asks for certificates", mode: modeEmbedded,
			cfg: "mqtt: {tls: [{cert: c, key: k, client_ca: ca}]}\nauth: {mtls: {field: cn}}\n"},
		{name: "an empty section is one key", mode: modeCoreRemote,
			cfg: "store: {}\n", args: []string{"--core-remote", "127.0.0.1:1"},
			want: []string{"store"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode, got := ignoredFor(t, tc.cfg, tc.args...)
			require.Equal(t, tc.mode, mode)
			require.Equal(t, tc.want, got)
		})
	}
}

// With GOGC in the environment, gc_percent and --gc-percent are ignored.
func TestIgnoredGCPercentUnderGOGC(t *testing.T) {
	getenv = func(k string) string {
		if k == "GOGC" {
			return "100"
		}
		return ""
	}
	t.Cleanup(func() { getenv = os.Getenv })
	_, got := ignoredFor(t, "gc_percent: 30\n", "--gc-percent", "40")
	require.Equal(t, []string{"--gc-percent", "gc_percent"}, got)
}

// serve logs one warning per ignored setting, naming the key and the mode.
func TestServeWarnsOfIgnoredSettings(t *testing.T) {
	var logs syncBuffer
	stderr = &logs
	t.Cleanup(func() { stderr = os.Stderr }) // after serve stopped: cleanups run last first
	dir := t.TempDir()
	path := filepath.Join(dir, "ferrymq.yaml")
	require.NoError(t, os.WriteFile(path, []byte("nats: {urls: [nats://127.0.0.1:4222]}\n"), 0o644))
	srv := startCLI(t, "serve", "--config", path, "--data", filepath.Join(dir, "data"), "--node", "n1",
		"--core", "127.0.0.1:0", "--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"message":"serving"`) },
		20*time.Second, 10*time.Millisecond, "serve starts: %s", srv.err.String())
	warned := map[string]string{}
	for _, l := range nonEmptyLines(logs.String()) {
		var e map[string]string
		if json.Unmarshal([]byte(l), &e) == nil && e["level"] == "warn" && e[logKey] != "" {
			warned[e[logKey]] = e[logMode]
			require.NotEmpty(t, e[logReason], l)
		}
	}
	require.Equal(t, map[string]string{"nats.urls": modeEmbedded, "--node": modeEmbedded}, warned)
}
