package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/trace"
)

// serveAddrs runs `ferrymq serve` in process with cfg and returns its
// addresses by name (core, http, tcp).
func serveAddrs(t *testing.T, cfg string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "ferrymq.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o644))
	srv := startCLI(t, "serve", "--config", path, "--data", filepath.Join(dir, "data"), "--core", "127.0.0.1:0",
		"--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "")
	addrs := map[string]string{}
	require.Eventually(t, func() bool {
		for _, l := range nonEmptyLines(srv.out.String()) {
			if f := strings.Fields(l); len(f) == 2 {
				addrs[f[0]] = f[1]
			}
		}
		return addrs["core"] != "" && addrs["tcp"] != "" && addrs["http"] != ""
	}, 20*time.Second, 10*time.Millisecond, "serve prints its addresses: %s", srv.out.String())
	return addrs
}

// TestTraceDevicePublishThroughTwoGroups: a device's QoS 1 publish,
// consumed by two groups of which one fails it once. `ferrymq trace`
// shows every hop in order: the publish, where it was stored, the PUBACK,
// then per group its deliveries, the retry and the commits.
func TestTraceDevicePublishThroughTwoGroups(t *testing.T) {
	addrs := serveAddrs(t, "trace: {topics: [tel], node: gw-1}\nretry: {schedule: [50ms, 100ms]}\n")
	ctx := t.Context()

	// Two backend groups on the core port.
	var mu sync.Mutex
	done := map[string]int{}
	start := func(g string, listen consumer.Listener) {
		c, err := client.Dial(ctx, client.Options{Addr: addrs["core"], ClientID: g + "-1"})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		pc, err := c.NewPushConsumer(consumer.Options{Group: g, ClientID: g + "-1", Subscriptions: []group.Subscription{{Topic: "tel"}},
			HeartbeatInterval: 50 * time.Millisecond, PollWait: 200 * time.Millisecond, CommitInterval: 10 * time.Millisecond, Listener: listen})
		require.NoError(t, err)
		require.NoError(t, pc.Start(ctx))
		t.Cleanup(func() { _ = pc.Close(context.Background()) })
	}
	start("billing", func(context.Context, *core.StoredMessage) consumer.Result {
		mu.Lock()
		done["billing"]++
		mu.Unlock()
		return consumer.Success
	})
	start("alerts", func(_ context.Context, m *core.StoredMessage) consumer.Result {
		if m.ReconsumeCount == 0 {
			return consumer.Retry
		}
		mu.Lock()
		done["alerts"]++
		mu.Unlock()
		return consumer.Success
	})

	// The device.
	dev := paho3.NewClient(paho3.NewClientOptions().AddBroker("tcp://" + addrs["tcp"]).SetClientID("car-42").SetAutoReconnect(false))
	tok := dev.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	t.Cleanup(func() { dev.Disconnect(0) })
	tok = dev.Publish("tel/car-42", 1, false, `{"speed":88}`)
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return done["billing"] == 1 && done["alerts"] == 1
	}, 20*time.Second, 5*time.Millisecond)

	// Find it by its client, then trace it.
	r := mustCLI(t, "", "msg", "query", "--server", addrs["core"], "--client", "car-42", "--json")
	recs := parseRecords(t, r.out)
	require.Len(t, recs, 1)
	id := recs[0].ID
	want := map[string][]string{
		"billing": {"mqtt.publish actor=car-42 qos=1 mqtt_topic=tel/car-42 rule=#", "stored topic=tel", "mqtt.ack actor=car-42",
			"delivered group=billing attempt=1", "committed group=billing"},
		"alerts": {"mqtt.publish", "stored", "mqtt.ack", "delivered group=alerts attempt=1", "retry group=alerts attempt=1",
			"delivered group=alerts attempt=2", "committed group=alerts"},
	}
	var hops []trace.Event
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		r := cli(t, ctx, "", "trace", id, "--server", addrs["core"], "--json")
		if !assert.NoError(c, r.runErr) {
			return
		}
		hops = hops[:0]
		for _, l := range nonEmptyLines(r.out) {
			var e trace.Event
			if assert.NoError(c, json.Unmarshal([]byte(l), &e)) {
				hops = append(hops, e)
			}
		}
		for g, steps := range want {
			assert.Empty(c, firstMissing(hops, steps), "group %s", g)
		}
	}, 20*time.Second, 20*time.Millisecond)
	for _, e := range hops {
		require.Equal(t, "gw-1", e.Node)
	}

	// The timeline for people names the message and every hop.
	table := mustCLI(t, "", "trace", id, "--server", addrs["core"]).out
	require.Contains(t, table, "message "+id+"  topic tel")
	for _, hop := range []string{"mqtt.publish", "stored", "mqtt.ack", "delivered", "retry", "committed"} {
		require.Contains(t, table, hop)
	}
}

// firstMissing returns the first of steps ("hop name=value …", actor= for
// the actor) that hops, in order, do not contain as a subsequence.
func firstMissing(hops []trace.Event, steps []string) string {
	i := 0
	for _, e := range hops {
		if i < len(steps) && stepMatches(e, steps[i]) {
			i++
		}
	}
	if i == len(steps) {
		return ""
	}
	return fmt.Sprintf("%q in %d hops", steps[i], len(hops))
}

func stepMatches(e trace.Event, step string) bool {
	f := strings.Fields(step)
	if e.Hop != f[0] {
		return false
	}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		if k == "actor" {
			if e.Actor != v {
				return false
			}
		} else if e.Attrs[k] != v {
			return false
		}
	}
	return true
}

// TestTraceThroughRemoteCore: a gateway run with --core-remote records its
// hops (the device's publish, where the core stored it, the PUBACK) in the
// core server's trace, under its own node name, beside the core's own hops
// of the same message (the gateway's produce, as the core saw it).
func TestTraceThroughRemoteCore(t *testing.T) {
	coreAddrs := serveAddrs(t, "trace: {topics: [tel], node: core-1}\n")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("trace: {topics: [tel], node: gw-1}\n"), 0o644))
	gw := startCLI(t, "serve", "--core-remote", coreAddrs["core"], "--config", cfg, "--data", filepath.Join(dir, "data"),
		"--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "")
	var mqttAddr string
	require.Eventually(t, func() bool {
		for _, l := range nonEmptyLines(gw.out.String()) {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "tcp" {
				mqttAddr = f[1]
			}
		}
		return mqttAddr != ""
	}, 20*time.Second, 10*time.Millisecond, "the gateway prints its MQTT address: %s", gw.out.String())

	dev := paho3.NewClient(paho3.NewClientOptions().AddBroker("tcp://" + mqttAddr).SetClientID("car-7").SetAutoReconnect(false))
	tok := dev.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	t.Cleanup(func() { dev.Disconnect(0) })
	tok = dev.Publish("tel/car-7", 1, false, `{"speed":42}`)
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())

	r := mustCLI(t, "", "msg", "query", "--server", coreAddrs["core"], "--client", "car-7", "--json")
	recs := parseRecords(t, r.out)
	require.Len(t, recs, 1)
	id := recs[0].ID
	gwSteps := []string{"mqtt.publish actor=car-7 qos=1 mqtt_topic=tel/car-7", "stored topic=tel key=car-7", "mqtt.ack actor=car-7"}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		r := cli(t, t.Context(), "", "trace", id, "--server", coreAddrs["core"], "--json")
		if !assert.NoError(c, r.runErr) {
			return
		}
		byNode := map[string][]trace.Event{}
		for _, l := range nonEmptyLines(r.out) {
			var e trace.Event
			if assert.NoError(c, json.Unmarshal([]byte(l), &e)) {
				byNode[e.Node] = append(byNode[e.Node], e)
			}
		}
		assert.Empty(c, firstMissing(byNode["gw-1"], gwSteps), "the gateway's hops")
		assert.Empty(c, firstMissing(byNode["core-1"], []string{"produce", "stored topic=tel"}), "the core's hops")
		for _, e := range byNode["gw-1"] {
			assert.Empty(c, e.Attrs["flush"], "the gateway does not know the remote core's flush policy")
		}
	}, 20*time.Second, 20*time.Millisecond)
}
