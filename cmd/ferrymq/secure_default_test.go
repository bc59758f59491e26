package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/alarm"
	"github.com/ferrymq/ferrymq/gateway/node"
)

// Without an auth section, the MQTT addresses nobody chose move to
// loopback; one a flag or the config chose stays (and the node judges
// it); with auth, nothing moves.
func TestServeLoopbackDefaults(t *testing.T) {
	wsInConfig := fileConfig{}
	wsAddr := ":8083"
	wsInConfig.MQTT.WS.Addr = &wsAddr
	for name, c := range map[string]struct {
		cfg      fileConfig
		changed  string
		mqtt, ws string
		want     []string
	}{
		"defaults, no auth": {mqtt: ":1883", ws: ":8083", want: []string{"127.0.0.1:1883", "127.0.0.1:8083"}},
		"flag given":        {changed: "mqtt", mqtt: ":1883", ws: ":8083", want: []string{":1883", "127.0.0.1:8083"}},
		"config gives ws":   {cfg: wsInConfig, mqtt: ":1883", ws: ":8083", want: []string{"127.0.0.1:1883", ":8083"}},
		"ws off":            {mqtt: ":1883", ws: "", want: []string{"127.0.0.1:1883", ""}},
		"auth configured":   {cfg: fileConfig{Auth: &authConfig{Anonymous: true}}, mqtt: ":1883", ws: ":8083", want: []string{":1883", ":8083"}},
	} {
		t.Run(name, func(t *testing.T) {
			o := &serveOptions{mqttAddr: c.mqtt, wsAddr: c.ws}
			o.loopbackDefaults(c.cfg, func(f string) bool { return f == c.changed })
			require.Equal(t, c.want, []string{o.mqttAddr, o.wsAddr})
		})
	}
}

// serve without auth refuses an MQTT address beyond loopback, from a flag
// or from the config, with an error that says what to do; nothing is left
// running (the data folder's store is closed again).
func TestServeRefusesAnonymousBeyondLoopback(t *testing.T) {
	var logs bytes.Buffer
	stderr = &logs
	t.Cleanup(func() { stderr = os.Stderr })
	cfg := filepath.Join(t.TempDir(), "ferrymq.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("mqtt:\n  ws: {addr: \"0.0.0.0:0\"}\n"), 0o600))
	for name, args := range map[string][]string{
		"flag":   {"--mqtt", ":0", "--ws", ""},
		"config": {"--mqtt", "127.0.0.1:0", "--config", cfg},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			cmd := newRootCmd()
			cmd.SetOut(&bytes.Buffer{})
			cmd.SetErr(&bytes.Buffer{})
			cmd.SetArgs(append([]string{"serve", "--data", dir, "--core", "127.0.0.1:0", "--http", "127.0.0.1:0"}, args...))
			err := cmd.ExecuteContext(t.Context())
			require.ErrorIs(t, err, node.ErrAnonymousBeyondLoopback)
			require.ErrorContains(t, err, "configure auth")
		})
	}
}

// auth: {anonymous: true} on every interface: the log says it loudly, the
// dashboard in headless Chromium shows the anonymous banner with the
// listener, and the anonymous_access alarm is active.
func TestServeAnonymousBeyondLoopbackIsSaidLoudly(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs chromium")
	}
	br := newBrowser(t)
	bin := buildBinary(t)
	cfg := filepath.Join(t.TempDir(), "ferrymq.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("auth: {anonymous: true}\nalarms: {interval: 200ms}\n"), 0o600))
	// Listens on every interface; the test talks only to 127.0.0.1.
	srv := startServe(t, bin, "--data", filepath.Join(t.TempDir(), "data"), "--config", cfg, "--mqtt", "0.0.0.0:0")
	addrs := printedAddrs(t, srv, "tcp", "http")
	require.Contains(t, srv.errOut.String(), "ANONYMOUS MQTT ACCESS BEYOND LOOPBACK")
	_, port, err := net.SplitHostPort(addrs["tcp"])
	require.NoError(t, err)
	dialMQTT(t, "127.0.0.1:"+port, "anon-1", nil).Disconnect(100) // no credentials: let in

	url := "http://" + addrs["http"] + "/"
	require.Eventually(t, func() bool {
		res, err := http.Get(url + "api/v1/alarms")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		var l alarm.List
		if json.NewDecoder(res.Body).Decode(&l) != nil {
			return false
		}
		for _, e := range l.Active {
			if e.Kind == alarm.KindAnonymous && e.Subject == "tcp" {
				return true
			}
		}
		return false
	}, 20*time.Second, 50*time.Millisecond, "anonymous_access tcp active")
	http.DefaultClient.CloseIdleConnections()

	p := page{br.run(t, url, 2500*time.Millisecond, "--dump-dom")}
	banners := p.tags("data-banner", "anonymous")
	require.Len(t, banners, 1)
	_, hidden := banners[0]["hidden"]
	require.False(t, hidden, "the anonymous banner shows")
	require.Contains(t, p.dom, "Anonymous MQTT clients may connect beyond loopback on tcp "+addrs["tcp"])
	alarms := p.tags("data-banner", "alarms")
	require.Len(t, alarms, 1)
	require.Equal(t, "1", alarms[0]["data-count"], "the alarm banner counts anonymous_access")
}
