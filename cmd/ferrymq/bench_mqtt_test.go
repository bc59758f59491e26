package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/mqttbench"
	"github.com/ferrymq/ferrymq/gateway/mqttbench/mqttbenchtest"
)

func decodeMQTTResult(t *testing.T, s string) mqttbench.Result {
	t.Helper()
	var r mqttbench.Result
	require.NoError(t, json.Unmarshal([]byte(s), &r), s)
	return r
}

func TestBenchMQTTPubSubJSON(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	out, progress := runBench(t, "mqtt", "--addr", b.Addr, "--publishers", "3", "--subscribers", "2", "--qos", "1",
		"--count", "100", "--size", "32", "--topic", "cli/dev-%i", "--label", "in memory", "--json")
	r := decodeMQTTResult(t, out)
	require.Equal(t, mqttbench.ModePubSub, r.Mode)
	require.Equal(t, "in memory", r.Label)
	require.Equal(t, 3, r.Publishers)
	require.EqualValues(t, 1, r.QoS)
	require.Equal(t, 32, r.SizeBytes)
	require.EqualValues(t, 300, r.Sent)
	require.EqualValues(t, 300, r.Acked)
	require.EqualValues(t, 600, r.MQTT.Received)
	require.Zero(t, r.MQTT.Lost)
	require.Positive(t, r.MQTT.Latency.P50)
	require.Positive(t, r.AckLatency.P50)
	require.Contains(t, progress, "pubsub")
}

func TestBenchMQTTPubSubTables(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	out, _ := runBench(t, "mqtt", "--addr", b.Addr, "--publishers", "2", "--qos", "0", "--count", "50",
		"--mqtt-version", "5")
	for _, want := range []string{"PUBLISHERS", "SUBSCRIBERS", "ACKED/S", "ACK P50", "RECEIVER", "EXPECTED", "LOSS", "P99.9", "mqtt ×1", " 100 "} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, "core", "no core consumer row without --core")
	require.NotContains(t, out, "errors:")
}

func TestBenchMQTTConnect(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	out, progress := runBench(t, "mqtt", "--mode", "connect", "--addr", b.Addr, "--conns", "100", "--workers", "4")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	for _, col := range []string{"CONNS", "CONNECTED", "CONNS/S", "P50", "P99.9", "HELD", "ALIVE", "SOURCES"} {
		require.Contains(t, lines[0], col)
	}
	require.Contains(t, lines[1], "connect")
	require.Contains(t, lines[1], " 100 ")
	require.Contains(t, progress, "connected")
}

func TestBenchMQTTIdleJSON(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	out, progress := runBench(t, "mqtt", "--mode", "idle", "--addr", b.Addr, "--conns", "30", "--hold", "100ms",
		"--source", "127.0.0.2", "--per-source", "10", "--json")
	r := decodeMQTTResult(t, out)
	require.Equal(t, mqttbench.ModeIdle, r.Mode)
	require.EqualValues(t, 30, r.Conns.Connected)
	require.Equal(t, 30, r.Conns.Held)
	require.Equal(t, 30, r.Conns.Alive)
	require.Equal(t, 3, r.Conns.Sources, "127.0.0.2, .3 and .4")
	require.Contains(t, progress, "holding 30 connections\n")
}

func TestBenchMQTTRejectsBadOptions(t *testing.T) {
	cmd := newBenchCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"mqtt", "--qos", "3", "--source", "nowhere", "--core", "127.0.0.1:1"})
	err := cmd.ExecuteContext(t.Context())
	require.ErrorContains(t, err, "--qos 3")
	require.ErrorContains(t, err, "--source")
	require.ErrorContains(t, err, "--core needs --core-topic")

	cmd = newBenchCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"mqtt", "--mode", "storm"})
	err = cmd.ExecuteContext(t.Context())
	require.ErrorIs(t, err, mqttbench.ErrInvalidOptions)
	require.ErrorContains(t, err, `mode "storm"`)
}

func TestBenchMQTTIdleTLSAndSubscribe(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{})
	for _, trust := range [][]string{{"--ca", b.CAFile}, {"--tls-insecure"}} {
		args := append([]string{"mqtt", "--mode", "idle", "--addr", b.TLSAddr, "--conns", "20", "--hold", "100ms",
			"--subscribe", "cli/%i", "--sub-qos", "1", "--json"}, trust...)
		out, progress := runBench(t, args...)
		r := decodeMQTTResult(t, out)
		require.EqualValues(t, 20, r.Conns.Connected, "%v: %v", trust, r.Errors)
		require.Equal(t, 20, r.Conns.Alive)
		require.Equal(t, "cli/%i", r.Conns.Subscribe)
		require.EqualValues(t, 1, r.Conns.SubQoS)
		require.Contains(t, progress, "holding 20 connections\n")
	}
	out, _ := runBench(t, "mqtt", "--mode", "idle", "--addr", b.WSAddr, "--conns", "10", "--hold", "50ms", "--json")
	require.EqualValues(t, 10, decodeMQTTResult(t, out).Conns.Connected)
}

func TestBenchMQTTConnectCredentials(t *testing.T) {
	b := mqttbenchtest.Start(t, mqttbenchtest.Options{Auth: benchAuth{}})
	out, _ := runBench(t, "mqtt", "--mode", "connect", "--addr", b.Addr, "--conns", "10", "--username", "bench",
		"--password", "s3cret", "--json")
	require.EqualValues(t, 10, decodeMQTTResult(t, out).Conns.Connected)

	out, _ = runBench(t, "mqtt", "--mode", "connect", "--addr", b.Addr, "--conns", "10", "--username", "bench",
		"--password", "wrong")
	require.Contains(t, out, "errors:")
	require.Contains(t, out, "10× mqttbench: connection refused: return code 4 (bad user name or password)")
}

func TestBenchMQTTRejectsBadTLSOptions(t *testing.T) {
	cmd := newBenchCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"mqtt", "--mode", "idle", "--addr", "tls://127.0.0.1:1", "--ca", "/nonexistent.pem", "--sub-qos", "3"})
	err := cmd.ExecuteContext(t.Context())
	require.ErrorContains(t, err, "--ca")
	require.ErrorContains(t, err, "--sub-qos 3")
}

// benchAuth lets in user bench with password s3cret.
type benchAuth struct{}

func (benchAuth) Authenticate(_ context.Context, ci *engine.ConnectInfo) (engine.Identity, error) {
	if ci.Username != "bench" || string(ci.Password) != "s3cret" {
		return engine.Identity{}, &engine.Refusal{Code: engine.BadUsernameOrPassword, Reason: "bad credentials"}
	}
	return engine.Identity{Username: ci.Username}, nil
}
