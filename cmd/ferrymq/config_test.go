package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

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
	require.NoError(t, o.applyConfig(cmd))
	require.Equal(t, filepath.Join(dir, "from-config"), o.dataDir, "the file sets what no flag set")
	require.Equal(t, "async", o.flush, "a flag wins over the file")
	require.Equal(t, "127.0.0.1:0", o.coreAddr)

	require.NoError(t, os.WriteFile(path, []byte("bogus: 1\n"), 0o644))
	require.ErrorContains(t, o.applyConfig(cmd), "bogus")
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
	require.NoError(t, o.applyConfig(cmd))
	require.Equal(t, "", o.wsAddr, "ws disabled by the file")
	require.Equal(t, ":1883", o.mqttAddr, "mqtt keeps its default")
}
