package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
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

// The sample in testdata/ must stay valid.
func TestSampleConfigParses(t *testing.T) {
	cfg, err := loadConfig(filepath.Join("..", "..", "testdata", "ferrymq.yaml"))
	require.NoError(t, err)
	require.Equal(t, "sync", cfg.Flush)
	require.Equal(t, ":10911", cfg.Core.Addr)
	require.Equal(t, defaultGCPercent, cfg.GCPercent)
}

// An empty listener address in the file disables that listener, as the
// empty flag does; an absent one keeps the default.
func TestConfigEmptyListenerDisables(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferrymq.yaml")
	require.NoError(t, os.WriteFile(path, []byte("mqtt:\n  ws: {addr: \"\"}\n"), 0o644))
	o := &serveOptions{}
	cmd := &cobra.Command{Use: "serve"}
	o.AddFlags(cmd)
	require.NoError(t, cmd.Flags().Parse([]string{"--config", path}))
	_, err := o.applyConfig(cmd)
	require.NoError(t, err)
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
	path := filepath.Join(t.TempDir(), "ferrymq.yaml")
	require.NoError(t, os.WriteFile(path, []byte("mqtt: {max_queued_messages: 1000, max_queued_messages_bytes: 1048576}\n"), 0o644))
	o := &serveOptions{}
	cmd := &cobra.Command{Use: "serve"}
	o.AddFlags(cmd)
	require.NoError(t, cmd.Flags().Parse([]string{"--config", path}))
	cfg, err := o.applyConfig(cmd)
	require.NoError(t, err)
	nopts, err := o.nodeOptions(cfg, io.Discard, &zerolog.Logger{})
	require.NoError(t, err)
	require.Equal(t, 1000, nopts.Gateway.MaxQueuedOnline)
	require.Equal(t, 1<<20, nopts.Gateway.MaxQueuedOnlineBytes)

	nopts, err = o.nodeOptions(fileConfig{}, io.Discard, &zerolog.Logger{})
	require.NoError(t, err)
	require.Zero(t, nopts.Gateway.MaxQueuedOnline, "zero: the gateway's default")

	_, err = parseConfig([]byte("mqtt: {max_queued_messages: -1}"))
	require.ErrorContains(t, err, "max_queued_messages")
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
