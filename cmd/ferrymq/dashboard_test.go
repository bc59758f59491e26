package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/gateway/alarm"
	"github.com/ferrymq/ferrymq/gateway/node"
)

// chromiumPath finds a headless-capable Chromium. .ci/run installs
// Debian's chromium and sets FERRYMQ_REQUIRE_CHROMIUM=1, so CI fails
// instead of skipping; FERRYMQ_CHROMIUM names another binary.
func chromiumPath(t *testing.T) string {
	t.Helper()
	names := []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}
	if p := os.Getenv("FERRYMQ_CHROMIUM"); p != "" {
		names = []string{p}
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if os.Getenv("FERRYMQ_REQUIRE_CHROMIUM") != "" {
		t.Fatalf("chromium not installed (apt-get install chromium); FERRYMQ_REQUIRE_CHROMIUM is set")
	}
	msg := "!!! SKIPPING the dashboard browser test: chromium is not installed (apt-get install chromium; CI requires it)"
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
	return ""
}

// browser runs headless Chromium against one page.
type browser struct {
	path, profile string
}

func newBrowser(t *testing.T) *browser {
	return &browser{path: chromiumPath(t), profile: t.TempDir()}
}

// run runs Chromium with the page open for budget of virtual time (the
// page polls /stats meanwhile) and then args' action (--dump-dom,
// --screenshot=…); it returns stdout.
func (b *browser) run(t *testing.T, url string, budget time.Duration, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), budget+30*time.Second)
	defer cancel()
	all := append([]string{"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
		"--user-data-dir=" + b.profile, fmt.Sprintf("--virtual-time-budget=%d", budget.Milliseconds())}, args...)
	cmd := exec.CommandContext(ctx, b.path, append(all, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "chromium: %s", stderr.String())
	return stdout.String()
}

// page is the dashboard's DOM as Chromium rendered it.
type page struct{ dom string }

var (
	tagRe  = regexp.MustCompile(`<[a-z][a-z0-9]*\b[^>]*>`)
	attrRe = regexp.MustCompile(`([a-z][a-z0-9-]*)="([^"]*)"`)
)

// tags returns the attributes of every start tag that has attr (with
// value, if not empty), in document order.
func (p page) tags(attr, value string) []map[string]string {
	var out []map[string]string
	for _, tag := range tagRe.FindAllString(p.dom, -1) {
		as := map[string]string{}
		for _, m := range attrRe.FindAllStringSubmatch(tag, -1) {
			as[m[1]] = html.UnescapeString(m[2])
		}
		if v, ok := as[attr]; ok && (value == "" || v == value) {
			out = append(out, as)
		}
	}
	return out
}

// figure returns the raw value of the figure data-metric=name ("" when
// the page shows none) and fails if the figure is missing.
func (p page) figure(t *testing.T, name string) string {
	t.Helper()
	ts := p.tags("data-metric", name)
	require.NotEmpty(t, ts, "figure %s missing", name)
	return ts[0]["data-value"]
}

// number is figure as a number; it fails when the page shows none.
func (p page) number(t *testing.T, name string) float64 {
	t.Helper()
	v := p.figure(t, name)
	f, err := strconv.ParseFloat(v, 64)
	require.NoError(t, err, "figure %s = %q", name, v)
	return f
}

// row returns the cells (data-field → data-value) of the table row whose
// start tag has attr=value, and the row's own attributes; nil if absent.
func (p page) row(attr, value string) (cells, attrs map[string]string) {
	re := regexp.MustCompile(`(?s)<tr [^>]*` + regexp.QuoteMeta(attr+`="`+html.EscapeString(value)+`"`) + `[^>]*>(.*?)</tr>`)
	m := re.FindStringSubmatch(p.dom)
	if m == nil {
		return nil, nil
	}
	attrs = page{m[0]}.tags(attr, "")[0]
	cells = map[string]string{}
	for _, c := range (page{m[1]}).tags("data-field", "") {
		cells[c["data-field"]] = c["data-value"]
	}
	return cells, attrs
}

// statsSnapshot is what the test reads of /stats.
type statsSnapshot struct {
	Ready   bool              `json:"ready"`
	Metrics map[string]any    `json:"metrics"`
	Topics  []node.TopicStats `json:"topics"`
	Groups  []node.GroupStats `json:"groups"`
}

func (s statsSnapshot) metric(name string) float64 {
	switch v := s.Metrics[name].(type) {
	case float64:
		return v
	case map[string]any: // labelled: the sum
		var sum float64
		for _, x := range v {
			if f, ok := x.(float64); ok {
				sum += f
			}
		}
		return sum
	}
	return -1
}

func (s statsSnapshot) topic(name string) int64 {
	for _, t := range s.Topics {
		if t.Name == name {
			return t.Messages
		}
	}
	return -1
}

func (s statsSnapshot) lag(g, topic string) int64 {
	for _, r := range s.Groups {
		if r.Group == g && r.Topic == topic {
			return r.Lag
		}
	}
	return -1
}

// The dashboard in real headless Chromium against `ferrymq serve`, with
// MQTT devices and core producers and consumers running: every figure is
// on the page, the figures move with the traffic, and they are what /stats
// says right after.
func TestDashboardInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs chromium")
	}
	br := newBrowser(t)
	bin := buildBinary(t)
	// Alarms evaluated often, with a group lag bound the stuck group passes.
	cfg := filepath.Join(t.TempDir(), "ferrymq.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("alarms: {interval: 200ms, clear_after: 1ms, group_lag: 10}\n"), 0o600))
	srv := startServe(t, bin, "--data", filepath.Join(t.TempDir(), "data"), "--config", cfg)
	addrs := printedAddrs(t, srv, "tcp", "core", "http")
	url := "http://" + addrs["http"] + "/"
	hc := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	stats := func() statsSnapshot {
		t.Helper()
		res, err := hc.Get(url + "stats")
		require.NoError(t, err)
		defer res.Body.Close()
		var s statsSnapshot
		require.NoError(t, json.NewDecoder(res.Body).Decode(&s))
		return s
	}

	// Devices: three connected, one publishing in the background.
	var devices []paho3.Client
	connect := func(n int) {
		for range n {
			c := dialMQTT(t, addrs["tcp"], fmt.Sprintf("dev-%d", len(devices)), nil)
			devices = append(devices, c)
			t.Cleanup(func() { c.Disconnect(100) })
		}
	}
	publish := func(c paho3.Client, topic string, qos byte, n int) {
		for i := range n {
			tok := c.Publish(topic, qos, false, fmt.Sprintf("reading %d", i))
			require.True(t, tok.WaitTimeout(10*time.Second))
			require.NoError(t, tok.Error())
		}
	}
	connect(3)
	sub := devices[1].Subscribe("telemetry/dev-1", 0, func(paho3.Client, paho3.Message) {}) // messages out
	require.True(t, sub.WaitTimeout(10*time.Second))
	require.NoError(t, sub.Error())
	publish(devices[0], "telemetry/dev-0", 1, 40)
	publish(devices[1], "telemetry/dev-1", 0, 10)
	publish(devices[2], "bad topic/dev-2", 1, 1) // unbridged: not a core topic name

	// Core: orders produced; "billing" is stuck (its listener never
	// returns), so its lag is every order; "audit" keeps up.
	cc, err := client.Dial(t.Context(), client.Options{Addr: addrs["core"], ClientID: "dashboard-test"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	produce := func(n int) {
		p := cc.NewProducer()
		for i := range n {
			_, err := p.Send(t.Context(), &core.Message{Topic: "orders", ShardingKey: strconv.Itoa(i), Body: []byte("order")})
			require.NoError(t, err)
		}
	}
	produce(30)
	stuck := make(chan struct{})
	consume := func(g string, listener consumer.Listener) {
		pc, err := cc.NewPushConsumer(consumer.Options{Group: g, ClientID: g + "-1",
			Subscriptions: []group.Subscription{{Topic: "orders"}}, Listener: listener})
		require.NoError(t, err)
		require.NoError(t, pc.Start(t.Context()))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = pc.Close(ctx)
		})
	}
	consume("billing", func(ctx context.Context, _ *core.StoredMessage) consumer.Result {
		select {
		case <-stuck:
		case <-ctx.Done():
		}
		return consumer.Success
	})
	consume("audit", func(context.Context, *core.StoredMessage) consumer.Result { return consumer.Success })
	release := sync.OnceFunc(func() { close(stuck) })
	t.Cleanup(release) // before the consumers close
	require.Eventually(t, func() bool {
		s := stats()
		return s.lag("billing", "orders") == 30 && s.lag("audit", "orders") == 0 && s.topic("telemetry") == 40+10
	}, 20*time.Second, 50*time.Millisecond, "/stats shows the topics and the groups")

	// Background traffic while the first dump and the screenshot are taken.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tok := devices[0].Publish(fmt.Sprintf("telemetry/dev-%d", i%3), []byte{0, 0, 0, 1, 1, 2}[i%6], false, "live")
			tok.WaitTimeout(10 * time.Second)
			time.Sleep(time.Duration(1+i/300%4) * time.Millisecond) // paces the load, a few hundred per second in steps: the scenario, not a wait
		}
	})
	stopTraffic := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopTraffic)

	// First look, traffic flowing.
	p1 := page{br.run(t, url, 3500*time.Millisecond, "--dump-dom")}
	after1 := stats()
	for _, name := range []string{"connections", "connects-rate", "connects-total", "mqtt-in-rate", "mqtt-in-total",
		"mqtt-in-rate-qos0", "mqtt-in-rate-qos1", "mqtt-in-rate-qos2", "mqtt-out-rate", "mqtt-out-total",
		"store-append-rate", "store-messages-total", "store-fsync-rate", "store-fsyncs-total",
		"latency-p99", "latency-count", "disk-bytes", "sessions", "subscriptions", "goroutines"} {
		p1.number(t, name) // present, with a number
	}
	require.Equal(t, "ready", p1.figure(t, "status"))
	require.GreaterOrEqual(t, p1.number(t, "polls"), 2.0, "the page polled more than once")
	require.Greater(t, p1.number(t, "rate-span"), 0.0, "rates span two polls")
	t.Logf("first look: %v polls, rates over %v s", p1.number(t, "polls"), p1.number(t, "rate-span"))
	require.Greater(t, p1.number(t, "mqtt-in-rate"), 0.0, "publishes are flowing")
	require.Greater(t, p1.number(t, "store-append-rate"), 0.0, "appends are flowing")
	require.Greater(t, p1.number(t, "mqtt-out-rate"), 0.0, "a subscriber receives")
	require.Equal(t, "ferrymq_store_fsync_seconds", p1.figure(t, "latency-title"), "the embedded store exports its fsync histogram: the card shows fsync latency")
	require.Equal(t, 3.0, p1.number(t, "connections"))
	require.Equal(t, after1.metric("ferrymq_mqtt_connections"), p1.number(t, "connections"))
	require.LessOrEqual(t, p1.number(t, "mqtt-in-total"), after1.metric("ferrymq_mqtt_publishes_received_total"))
	require.Greater(t, p1.number(t, "disk-bytes"), 0.0)

	orders, attrs := p1.row("data-topic", "orders")
	require.NotNil(t, orders, "orders is among the top topics")
	require.Equal(t, "30", attrs["data-messages"])
	require.Equal(t, strconv.FormatInt(after1.topic("orders"), 10), orders["messages"])
	tel, _ := p1.row("data-topic", "telemetry")
	require.NotNil(t, tel, "telemetry is among the top topics")
	require.Greater(t, num(t, tel["rate"]), 0.0, "telemetry has a rate")

	billing, _ := p1.row("data-group", "billing")
	require.NotNil(t, billing, "billing is listed")
	require.Equal(t, "30", billing["lag"])
	require.Equal(t, strconv.FormatInt(after1.lag("billing", "orders"), 10), billing["lag"])
	require.Len(t, p1.tags("data-group", "billing"), 2, "billing is a group row and a slow consumer")
	_, auditAttrs := p1.row("data-group", "audit")
	require.NotNil(t, auditAttrs, "audit is listed")
	require.Len(t, p1.tags("data-group", "audit"), 1, "audit is caught up: not a slow consumer")

	// The stuck group raised group_lag: the banner says so, the list has it.
	banners := p1.tags("data-banner", "alarms")
	require.Len(t, banners, 1)
	_, hidden := banners[0]["hidden"]
	require.False(t, hidden, "the alarm banner shows while an alarm is active")
	require.Equal(t, "1", banners[0]["data-count"])
	require.Contains(t, p1.dom, "group_lag billing/orders", "the banner names the alarm")
	anon := p1.tags("data-banner", "anonymous")
	require.Len(t, anon, 1)
	_, hidden = anon[0]["hidden"]
	require.True(t, hidden, "no auth: MQTT on loopback only, no anonymous banner")
	lagAlarm, lagAttrs := p1.row("data-alarm", "group_lag")
	require.NotNil(t, lagAlarm, "the alarms list has it")
	require.Equal(t, "billing/orders", lagAttrs["data-subject"])
	require.Equal(t, "30", lagAlarm["value"])
	require.Equal(t, "10", lagAlarm["threshold"])

	unbridged, _ := p1.row("data-error", "ferrymq_bridge_unbridged_total{reason=invalid_core_topic}")
	require.NotNil(t, unbridged, "the unbridged publish is listed under errors")
	require.Equal(t, "1", unbridged["total"])

	// The screenshot: FERRYMQ_UPDATE_SCREENSHOT=1 writes docs/dashboard.png,
	// after letting the charts fill for longer.
	screenshot, budget := filepath.Join(t.TempDir(), "dashboard.png"), 4*time.Second
	if os.Getenv("FERRYMQ_UPDATE_SCREENSHOT") != "" {
		screenshot, err = filepath.Abs(filepath.Join("..", "..", "docs", "dashboard.png"))
		require.NoError(t, err)
		budget = 45 * time.Second
	}
	br.run(t, url, budget, "--screenshot="+screenshot, "--window-size=1400,1000")
	png, err := os.ReadFile(screenshot)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")), "a PNG")
	require.Greater(t, len(png), 20_000, "a page was drawn, not a blank")

	// Traffic stops; two more devices; more orders and telemetry.
	stopTraffic()
	connect(2)
	produce(20)
	publish(devices[4], "telemetry/dev-4", 2, 5)
	var settled statsSnapshot
	require.Eventually(t, func() bool {
		settled = stats()
		return settled.lag("billing", "orders") == 50 && settled.lag("audit", "orders") == 0 &&
			settled.metric("ferrymq_mqtt_connections") == 5
	}, 20*time.Second, 50*time.Millisecond, "/stats shows the new orders and devices")

	// Second look: the figures moved, and they are what /stats says.
	p2 := page{br.run(t, url, 2500*time.Millisecond, "--dump-dom")}
	after2 := stats()
	require.Equal(t, 5.0, p2.number(t, "connections"))
	require.Equal(t, after2.metric("ferrymq_mqtt_connections"), p2.number(t, "connections"))
	require.Greater(t, p2.number(t, "mqtt-in-total"), p1.number(t, "mqtt-in-total"))
	require.Equal(t, after2.metric("ferrymq_mqtt_publishes_received_total"), p2.number(t, "mqtt-in-total"))
	require.Equal(t, after2.metric("ferrymq_mqtt_connects_total"), p2.number(t, "connects-total"))
	require.Equal(t, after2.metric("ferrymq_mqtt_messages_sent_total"), p2.number(t, "mqtt-out-total"))
	require.Equal(t, after2.metric("ferrymq_store_disk_bytes"), p2.number(t, "disk-bytes"))
	require.Greater(t, p2.number(t, "store-messages-total"), p1.number(t, "store-messages-total"))
	require.Equal(t, after2.metric("ferrymq_store_messages_total"), p2.number(t, "store-messages-total"))

	orders, attrs = p2.row("data-topic", "orders")
	require.NotNil(t, orders)
	require.Equal(t, "50", attrs["data-messages"])
	require.Equal(t, strconv.FormatInt(after2.topic("orders"), 10), orders["messages"])
	tel2, _ := p2.row("data-topic", "telemetry")
	require.NotNil(t, tel2)
	require.Greater(t, num(t, tel2["messages"]), num(t, tel["messages"]))
	require.Equal(t, strconv.FormatInt(after2.topic("telemetry"), 10), tel2["messages"])
	billing, _ = p2.row("data-group", "billing")
	require.Equal(t, "50", billing["lag"])
	require.Equal(t, strconv.FormatInt(after2.lag("billing", "orders"), 10), billing["lag"])
	require.Zero(t, num(t, tel2["rate"]), "telemetry is quiet now")
	require.Equal(t, 0.0, p2.number(t, "mqtt-in-rate"), "no publishes since the last poll")

	// `ferrymq alarm list` says the same as the page.
	out, err := exec.Command(bin, "alarm", "list", "--http", addrs["http"], "--json").Output()
	require.NoError(t, err)
	var list alarm.List
	require.NoError(t, json.Unmarshal(out, &list))
	require.Len(t, list.Active, 1)
	require.Equal(t, alarm.KindGroupLag, list.Active[0].Kind)
	require.Equal(t, "billing/orders", list.Active[0].Subject)
	table, err := exec.Command(bin, "alarm", "list", "--http", addrs["http"]).Output()
	require.NoError(t, err)
	require.Contains(t, string(table), "group_lag")
	require.Contains(t, string(table), "billing/orders")

	// billing catches up: the alarm clears, the banner goes.
	release()
	require.Eventually(t, func() bool { return stats().lag("billing", "orders") == 0 }, 20*time.Second, 50*time.Millisecond)
	p3 := page{br.run(t, url, 2500*time.Millisecond, "--dump-dom")}
	banners = p3.tags("data-banner", "alarms")
	require.Len(t, banners, 1)
	_, hidden = banners[0]["hidden"]
	require.True(t, hidden, "no alarm active: no banner")
	require.Equal(t, "0", banners[0]["data-count"])
	gone, _ := p3.row("data-alarm", "group_lag")
	require.Nil(t, gone)
}

func num(t *testing.T, s string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err, "%q", s)
	return f
}
