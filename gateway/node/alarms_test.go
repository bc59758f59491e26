package node_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/gateway/alarm"
	"github.com/ferrymq/ferrymq/gateway/node"
)

// The alarm tests make each condition happen for real — a group that
// falls behind, messages dead-lettered, a tmpfs that fills, a certificate
// that expires soon, a nats-server killed — and see each alarm raised
// once and cleared once at a real webhook (an HTTP server in the test),
// with GET /api/v1/alarms, /metrics and %ALARM% where it matters.

// hookSink is a webhook receiver: every event POSTed to it.
type hookSink struct {
	srv    *httptest.Server
	mu     sync.Mutex
	events []alarm.Event
}

func newHookSink(t *testing.T) *hookSink {
	h := &hookSink{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var e alarm.Event
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" ||
			json.NewDecoder(r.Body).Decode(&e) != nil {
			http.Error(w, "want a JSON POST of an event", http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		h.events = append(h.events, e)
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// find returns the events of kind (and subject, unless "") in state.
func (h *hookSink) find(kind alarm.Kind, subject, state string) []alarm.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []alarm.Event
	for _, e := range h.events {
		if e.Kind == kind && (subject == "" || e.Subject == subject) && e.State == state {
			out = append(out, e)
		}
	}
	return out
}

// wait waits for an event of kind (and subject) in state and returns it.
func (h *hookSink) wait(t *testing.T, kind alarm.Kind, subject, state string) alarm.Event {
	t.Helper()
	var got []alarm.Event
	require.Eventuallyf(t, func() bool {
		got = h.find(kind, subject, state)
		return len(got) > 0
	}, 30*time.Second, 10*time.Millisecond, "webhook: no %s %s %s; got %v", kind, subject, state, h.all())
	return got[0]
}

func (h *hookSink) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, e := range h.events {
		out = append(out, fmt.Sprintf("%s %s %s", e.Kind, e.Subject, e.State))
	}
	return out
}

// alarmOptions evaluate every 50 ms, clear at the first evaluation that
// finds a condition gone, and post to h.
func alarmOptions(h *hookSink) *node.AlarmOptions {
	return &node.AlarmOptions{Interval: 50 * time.Millisecond, ClearAfter: -1,
		Webhooks: []alarm.Webhook{{URL: h.srv.URL, Backoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}}}
}

func httpGet(t *testing.T, n *node.Node, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + n.HTTPAddr().String() + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func activeKinds(t *testing.T, n *node.Node) map[string]bool {
	t.Helper()
	code, body := httpGet(t, n, "/api/v1/alarms")
	require.Equal(t, http.StatusOK, code, body)
	var l alarm.List
	require.NoError(t, json.Unmarshal([]byte(body), &l))
	out := map[string]bool{}
	for _, e := range l.Active {
		out[string(e.Kind)+" "+e.Subject] = true
	}
	return out
}

// storedEvents reads %ALARM% back.
func storedEvents(t *testing.T, b core.Broker) []string {
	t.Helper()
	events, err := (&alarm.Log{B: b}).Restore(t.Context())
	require.NoError(t, err)
	var out []string
	for _, e := range events {
		out = append(out, fmt.Sprintf("%s %s %s", e.Kind, e.Subject, e.State))
	}
	return out
}

func dialCore(t *testing.T, n *node.Node) *client.Client {
	t.Helper()
	c, err := client.Dial(t.Context(), client.Options{Addr: n.CoreAddr().String(), ClientID: "alarm-test"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func startConsumer(t *testing.T, c *client.Client, g, topic string, l consumer.Listener) *consumer.PushConsumer {
	t.Helper()
	pc, err := c.NewPushConsumer(consumer.Options{Group: g, ClientID: g + "-1", Subscriptions: []group.Subscription{{Topic: topic}},
		Listener: l, CommitInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, pc.Start(t.Context()))
	t.Cleanup(func() { closeConsumer(pc) })
	return pc
}

func closeConsumer(pc *consumer.PushConsumer) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = pc.Close(ctx)
}

// produceUntil sends a message to topic every 40 ms until stop closes.
func produceUntil(t *testing.T, c *client.Client, topic string, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Go(func() {
		p := c.NewProducer()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(40 * time.Millisecond):
			}
			if _, err := p.Send(context.Background(), &core.Message{Topic: topic, ShardingKey: strconv.Itoa(i), Body: []byte("m")}); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
		}
	})
	return &wg
}

// A group whose consumer is stuck falls behind: group_lag once its lag
// passes the bound, group_lag_growing once it grew all through the period;
// both clear when it catches up. Each is one raise and one clear, at the
// webhook and in %ALARM%, listed by the API and exported while active. A
// group whose consumers are all gone keeps being watched from its
// committed offsets.
func TestAlarmGroupLag(t *testing.T) {
	hook := newHookSink(t)
	o := options(t)
	o.Alarms = alarmOptions(hook)
	o.Alarms.GroupLag = 20
	o.Alarms.GroupLagGrowing = 600 * time.Millisecond
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, n) }) // after the consumers close (Cleanup: last in, first out)
	c := dialCore(t, n)
	_, err = c.CreateTopic(t.Context(), "orders", 2)
	require.NoError(t, err)

	gate := make(chan struct{})
	pc := startConsumer(t, c, "billing", "orders", func(ctx context.Context, _ *core.StoredMessage) consumer.Result {
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return consumer.Success
	})
	p := c.NewProducer()
	for i := range 30 {
		_, err := p.Send(t.Context(), &core.Message{Topic: "orders", ShardingKey: strconv.Itoa(i), Body: []byte("order")})
		require.NoError(t, err)
	}
	raised := hook.wait(t, alarm.KindGroupLag, "billing/orders", alarm.StateRaised)
	require.GreaterOrEqual(t, raised.Value, 21.0)
	require.Equal(t, 20.0, raised.Threshold)
	require.Contains(t, raised.Message, "billing/orders")
	require.True(t, activeKinds(t, n)["group_lag billing/orders"], "GET /api/v1/alarms lists it")
	_, metrics := httpGet(t, n, "/metrics")
	require.Contains(t, metrics, `ferrymq_alarm_active{kind="group_lag",subject="billing/orders"} 1`)
	require.Contains(t, metrics, `ferrymq_group_lag{group="billing",member="",topic="orders"}`)
	_, stats := httpGet(t, n, "/stats")
	require.Contains(t, stats, `"active_total"`)

	stop := make(chan struct{})
	wg := produceUntil(t, c, "orders", stop)
	hook.wait(t, alarm.KindGroupLagGrowing, "billing/orders", alarm.StateRaised)
	close(stop)
	wg.Wait()

	close(gate) // the consumer catches up
	hook.wait(t, alarm.KindGroupLag, "billing/orders", alarm.StateCleared)
	hook.wait(t, alarm.KindGroupLagGrowing, "billing/orders", alarm.StateCleared)
	require.Len(t, hook.find(alarm.KindGroupLag, "", alarm.StateRaised), 1, "one alarm per condition, not one per evaluation")
	require.Len(t, hook.find(alarm.KindGroupLagGrowing, "", alarm.StateRaised), 1)
	require.False(t, activeKinds(t, n)["group_lag billing/orders"])
	_, metrics = httpGet(t, n, "/metrics")
	require.NotContains(t, metrics, `ferrymq_alarm_active{kind="group_lag",subject="billing/orders"} 1`)
	require.Eventually(t, func() bool {
		s := strings.Join(storedEvents(t, n.Broker()), "\n")
		return strings.Contains(s, "group_lag billing/orders raised") && strings.Contains(s, "group_lag billing/orders cleared")
	}, 10*time.Second, 20*time.Millisecond, "%%ALARM%% holds the raise and the clear")

	// Its consumer gone, the group is read from its committed offsets: new
	// orders nobody consumes raise group_lag again.
	closeConsumer(pc)
	for i := range 30 {
		_, err := p.Send(t.Context(), &core.Message{Topic: "orders", ShardingKey: strconv.Itoa(i), Body: []byte("order")})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return len(hook.find(alarm.KindGroupLag, "billing/orders", alarm.StateRaised)) == 2 },
		30*time.Second, 10*time.Millisecond, "a group without members falling behind: %v", hook.all())
}

// Messages whose retries run out land in %DLQ%<group>: dead_letters is
// raised, and cleared once none arrived for the quiet period.
func TestAlarmDeadLetters(t *testing.T) {
	hook := newHookSink(t)
	o := options(t)
	o.Core.Retry = retry.Options{Schedule: []time.Duration{20 * time.Millisecond}, MaxAttempts: 1, PollInterval: 20 * time.Millisecond}
	o.Alarms = alarmOptions(hook)
	o.Alarms.DeadLetterQuiet = 500 * time.Millisecond
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, n) }) // after the consumers close (Cleanup: last in, first out)
	c := dialCore(t, n)
	_, err = c.CreateTopic(t.Context(), "payments", 1)
	require.NoError(t, err)
	startConsumer(t, c, "pay", "payments", func(context.Context, *core.StoredMessage) consumer.Result { return consumer.Retry })
	p := c.NewProducer()
	for i := range 3 {
		_, err := p.Send(t.Context(), &core.Message{Topic: "payments", ShardingKey: strconv.Itoa(i), Body: []byte("pay")})
		require.NoError(t, err)
	}
	raised := hook.wait(t, alarm.KindDeadLetters, "pay", alarm.StateRaised)
	require.GreaterOrEqual(t, raised.Value, 1.0)
	require.Contains(t, raised.Message, retry.DLQTopic("pay"))
	cleared := hook.wait(t, alarm.KindDeadLetters, "pay", alarm.StateCleared)
	require.GreaterOrEqual(t, cleared.Time.Sub(raised.Time), 500*time.Millisecond, "raised for the quiet period at least")
	require.Len(t, hook.find(alarm.KindDeadLetters, "", alarm.StateRaised), 1)
	_, metrics := httpGet(t, n, "/metrics")
	require.Contains(t, metrics, `ferrymq_dead_letter_messages_total{group="pay"} 3`)
}

// A consumer that sends every message back, with a schedule of an hour:
// the retry backlog grows while messages arrive (raised) and stays flat
// once they stop (cleared).
func TestAlarmRetryBacklogGrowing(t *testing.T) {
	hook := newHookSink(t)
	o := options(t)
	o.Core.Retry = retry.Options{Schedule: []time.Duration{time.Hour}}
	o.Alarms = alarmOptions(hook)
	o.Alarms.RetryBacklogGrowing = 600 * time.Millisecond
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, n) }) // after the consumers close (Cleanup: last in, first out)
	c := dialCore(t, n)
	_, err = c.CreateTopic(t.Context(), "jobs", 1)
	require.NoError(t, err)
	startConsumer(t, c, "workers", "jobs", func(context.Context, *core.StoredMessage) consumer.Result { return consumer.Retry })
	stop := make(chan struct{})
	wg := produceUntil(t, c, "jobs", stop)
	raised := hook.wait(t, alarm.KindRetryBacklog, "retry", alarm.StateRaised)
	close(stop)
	wg.Wait()
	require.Greater(t, raised.Value, raised.Threshold, "the backlog now, above where the period began")
	hook.wait(t, alarm.KindRetryBacklog, "retry", alarm.StateCleared)
	_, metrics := httpGet(t, n, "/metrics")
	require.Contains(t, metrics, "ferrymq_retry_backlog ")
}

// MQTT clients that connect and drop at once, faster than the bound:
// disconnect_rate is raised, and cleared once the window holds no more.
func TestAlarmDisconnectRate(t *testing.T) {
	hook := newHookSink(t)
	o := options(t)
	o.Alarms = alarmOptions(hook)
	o.Alarms.DisconnectRate = 5
	o.Alarms.DisconnectWindow = time.Second
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	defer shutdown(t, n)
	for i := range 30 {
		c := paho3.NewClient(paho3.NewClientOptions().AddBroker("tcp://" + n.Addr("tcp").String()).
			SetClientID("flap-" + strconv.Itoa(i)).SetAutoReconnect(false).SetConnectRetry(false))
		tok := c.Connect()
		require.True(t, tok.WaitTimeout(10*time.Second))
		require.NoError(t, tok.Error())
		c.Disconnect(0)
	}
	raised := hook.wait(t, alarm.KindDisconnectRate, "mqtt", alarm.StateRaised)
	require.Greater(t, raised.Value, 5.0)
	hook.wait(t, alarm.KindDisconnectRate, "mqtt", alarm.StateCleared)
}

// fsync_slow with a bound below what any fsync takes: raised while the
// commit log fsyncs (real fsyncs, flush sync), cleared once the window
// holds none.
func TestAlarmFsyncSlow(t *testing.T) {
	hook := newHookSink(t)
	o := options(t)
	o.Delay, o.Trace = nil, nil // nothing else writes while the test waits for quiet
	o.Alarms = alarmOptions(hook)
	o.Alarms.FsyncP99 = time.Nanosecond
	o.Alarms.FsyncWindow = 500 * time.Millisecond
	o.Alarms.FsyncMinCount = 5
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	defer shutdown(t, n)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := n.Broker().Produce(context.Background(), &core.Message{Topic: "t", Body: []byte("x")}); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
		}
	})
	raised := hook.wait(t, alarm.KindFsyncSlow, "commitlog", alarm.StateRaised)
	close(stop)
	wg.Wait()
	require.Greater(t, raised.Value, 0.0)
	hook.wait(t, alarm.KindFsyncSlow, "commitlog", alarm.StateCleared)
	_, metrics := httpGet(t, n, "/metrics")
	require.Contains(t, metrics, "ferrymq_store_fsync_seconds_bucket")
}

// mountTmpfs mounts a tmpfs of size bytes on a new folder (the test runs
// as root in CI: .ci/run; failing to mount fails the test).
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Fatalf("mount a %d-byte tmpfs on %s (needs root, as .ci/run runs): %v", size, dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// The data folder on a 24 MiB tmpfs that fills: the store refuses writes
// (store_failed; /readyz 503 with the reason; ferrymq_store_writable 0),
// the filesystem is full (disk_usage), a delayed message comes due and
// cannot be delivered (delay_overdue), trace hops and presence events are
// lost (trace_dropping, presence_dropping). Freeing space clears
// disk_usage; the store stays failed until a restart, after which it
// takes writes, /readyz is 200, the delayed message is delivered and no
// alarm is active. Trace and presence clear after their quiet period.
//
// The events raised while the store refused writes could not be stored in
// %ALARM% (it lives in that store): the webhook, the log, the API and the
// metric carry them.
func TestAlarmDiskFull(t *testing.T) {
	hook := newHookSink(t)
	dir := mountTmpfs(t, 24<<20)
	ballast := filepath.Join(dir, "ballast")
	require.NoError(t, os.WriteFile(ballast, make([]byte, 6<<20), 0o600))
	o := options(t)
	o.DataDir = dir
	o.Store.SegmentBytes, o.Store.MaxMessageBytes = 1<<20, 512<<10
	o.Trace = &trace.Options{All: true}
	o.Delay = &delay.Options{PollInterval: 20 * time.Millisecond}
	o.Alarms = alarmOptions(hook)
	o.Alarms.DiskUsage = 0.9
	o.Alarms.DelayOverdue = 300 * time.Millisecond
	o.Alarms.DropQuiet = 500 * time.Millisecond
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	stopped := false
	defer func() {
		if !stopped {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_ = n.Shutdown(ctx)
		}
	}()
	code, _ := httpGet(t, n, "/readyz")
	require.Equal(t, http.StatusOK, code)
	_, err = n.Broker().Produce(t.Context(), &core.Message{Topic: "later", Body: []byte("due soon"), DeliverAt: time.Now().Add(1500 * time.Millisecond)})
	require.NoError(t, err)

	for i := range 5 { // traced orders, consumed once the store refuses writes
		_, err = n.Broker().Produce(t.Context(), &core.Message{Topic: "orders", ShardingKey: strconv.Itoa(i), Body: []byte("order")})
		require.NoError(t, err)
	}
	body := bytes.Repeat([]byte{'x'}, 256<<10)
	var failure error
	for i := 0; i < 200 && failure == nil; i++ {
		_, failure = n.Broker().Produce(t.Context(), &core.Message{Topic: "fill", Body: body})
	}
	require.ErrorIs(t, failure, core.ErrStoreFailed, "24 MiB filled")

	raised := hook.wait(t, alarm.KindStoreFailed, "store", alarm.StateRaised)
	require.Contains(t, raised.Message, "refuses writes")
	hook.wait(t, alarm.KindDiskUsage, dir, alarm.StateRaised)
	code, reason := httpGet(t, n, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, reason, "store refuses writes")
	_, metrics := httpGet(t, n, "/metrics")
	require.Contains(t, metrics, "ferrymq_store_writable 0")
	require.Contains(t, metrics, `ferrymq_alarm_active{kind="store_failed",subject="store"} 1`)
	hook.wait(t, alarm.KindDelayOverdue, "delay", alarm.StateRaised)

	// A device that connects: its presence event cannot be stored. A
	// consumer that reads the orders (reads still work): their "delivered"
	// trace hops cannot be stored.
	mc := paho3.NewClient(paho3.NewClientOptions().AddBroker("tcp://" + n.Addr("tcp").String()).SetClientID("car-1").
		SetAutoReconnect(false).SetConnectRetry(false))
	tok := mc.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	mc.Disconnect(100)
	pc := startConsumer(t, dialCore(t, n), "late", "orders", func(context.Context, *core.StoredMessage) consumer.Result { return consumer.Success })
	hook.wait(t, alarm.KindPresenceDropping, "presence", alarm.StateRaised)
	hook.wait(t, alarm.KindTraceDropping, "trace", alarm.StateRaised)
	hook.wait(t, alarm.KindPresenceDropping, "presence", alarm.StateCleared)
	hook.wait(t, alarm.KindTraceDropping, "trace", alarm.StateCleared)

	require.NoError(t, os.Remove(ballast))
	hook.wait(t, alarm.KindDiskUsage, dir, alarm.StateCleared)
	require.True(t, activeKinds(t, n)["store_failed store"], "sticky: the store needs a restart")
	require.Empty(t, hook.find(alarm.KindStoreFailed, "", alarm.StateCleared))
	require.NotContains(t, storedEvents(t, n.Broker()), "store_failed store raised", "the full disk refused it")

	closeConsumer(pc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	_ = n.Shutdown(ctx) // the store's last flush fails: an error is expected
	cancel()
	stopped = true

	n, err = node.New(t.Context(), o, nil)
	require.NoError(t, err, "the store recovers on the freed filesystem")
	defer shutdown(t, n)
	code, _ = httpGet(t, n, "/readyz")
	require.Equal(t, http.StatusOK, code)
	_, metrics = httpGet(t, n, "/metrics")
	require.Contains(t, metrics, "ferrymq_store_writable 1")
	require.Eventually(t, func() bool {
		info, err := n.Broker().Topic(t.Context(), "later")
		return err == nil && info.Ranges[0].Max+sumMax(info.Ranges[1:]) == 1
	}, 20*time.Second, 20*time.Millisecond, "the delayed message is delivered after the restart")
	// The raises the full disk refused were spilled at shutdown: restored,
	// then cleared, and now in %ALARM% with their clears.
	hook.wait(t, alarm.KindStoreFailed, "store", alarm.StateCleared)
	hook.wait(t, alarm.KindDelayOverdue, "delay", alarm.StateCleared)
	require.Eventually(t, func() bool { return len(activeKinds(t, n)) == 0 }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		stored := storedEvents(t, n.Broker())
		return slices.Contains(stored, "store_failed store raised") && slices.Contains(stored, "store_failed store cleared") &&
			slices.Contains(stored, "delay_overdue delay cleared")
	}, 10*time.Second, 20*time.Millisecond, "%ALARM%: %v", storedEvents(t, n.Broker()))
	require.NoFileExists(t, filepath.Join(dir, node.AlarmSpillFile), "stored: removed")
	require.Len(t, hook.find(alarm.KindStoreFailed, "", alarm.StateRaised), 1, "restored, not raised again")
	_, err = n.Broker().Produce(t.Context(), &core.Message{Topic: "fill", Body: []byte("room again")})
	require.NoError(t, err)
}

func sumMax(rs []core.QueueRange) int64 {
	var n int64
	for _, r := range rs {
		n += r.Max
	}
	return n
}

// writeCert writes a self-signed ECDSA certificate valid until notAfter
// and its key, and returns their paths.
func writeCert(t *testing.T, dir, name string, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{"localhost"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile
}

// A TLS listener whose certificate expires in 3 days, JWT keys given as a
// certificate expiring in 2 and HMAC secrets due for rotation in 5:
// certificate_expiry and key_expiry are raised (the warning is 14 days).
// The operator renews them and restarts: the node takes up the alarms it
// had raised, from %ALARM%, and clears them.
func TestAlarmCertificateAndKeyExpiry(t *testing.T) {
	hook := newHookSink(t)
	dir := t.TempDir()
	o := options(t)
	o.Alarms = alarmOptions(hook)
	withDates := func(cert, jwtKey, hmac time.Duration) node.Options {
		c, k := writeCert(t, dir, "mqtt-tls", time.Now().Add(cert))
		jc, _ := writeCert(t, dir, "jwt-signer", time.Now().Add(jwtKey))
		o.TLS = []node.TLSListener{{Name: "mqtts", Type: "tcp", Addr: "127.0.0.1:0", Cert: c, Key: k}}
		o.Auth = &node.AuthOptions{
			HMAC:        &auth.HMACOptions{ProductSecrets: map[string][]byte{"fleet": []byte("s3cret")}},
			HMACExpires: time.Now().Add(hmac),
			JWT:         &node.JWTAuth{PublicKeys: jc},
		}
		return o
	}
	const day = 24 * time.Hour
	n, err := node.New(t.Context(), withDates(3*day, 2*day, 5*day), nil)
	require.NoError(t, err)
	cert := hook.wait(t, alarm.KindCertExpiry, "listener mqtts", alarm.StateRaised)
	require.InDelta(t, 3, cert.Value, 0.1, "days left")
	require.Equal(t, 14.0, cert.Threshold)
	jwtKey := hook.wait(t, alarm.KindKeyExpiry, "jwt public key 1 (jwt-signer)", alarm.StateRaised)
	require.InDelta(t, 2, jwtKey.Value, 0.1)
	hook.wait(t, alarm.KindKeyExpiry, "hmac secrets", alarm.StateRaised)
	_, metrics := httpGet(t, n, "/metrics")
	require.Contains(t, metrics, `ferrymq_certificate_expiry_timestamp_seconds{subject="listener mqtts"}`)
	require.Contains(t, metrics, `ferrymq_key_expiry_timestamp_seconds{subject="hmac secrets"}`)
	require.Eventually(t, func() bool { return len(storedEvents(t, n.Broker())) == 3 }, 10*time.Second, 20*time.Millisecond)
	shutdown(t, n)

	n, err = node.New(t.Context(), withDates(90*day, 90*day, 60*day), nil) // the same data folder
	require.NoError(t, err)
	defer shutdown(t, n)
	hook.wait(t, alarm.KindCertExpiry, "listener mqtts", alarm.StateCleared)
	hook.wait(t, alarm.KindKeyExpiry, "jwt public key 1 (jwt-signer)", alarm.StateCleared)
	hook.wait(t, alarm.KindKeyExpiry, "hmac secrets", alarm.StateCleared)
	require.Len(t, hook.find(alarm.KindCertExpiry, "", alarm.StateRaised), 1, "restored, not raised again")
	require.Empty(t, activeKinds(t, n))
}

// The JetStream engine's nats-server is killed: nats_unreachable is
// raised (ferrymq_nats_reachable 0); started again, the node reconnects
// and the alarm clears.
func TestAlarmNATSUnreachable(t *testing.T) {
	hook := newHookSink(t)
	ns := natstest.RunProcessServer(t)
	o := natsOptions(t, ns.URL, "gw-1")
	o.NATS.Timeout = time.Second
	o.Alarms = alarmOptions(hook)
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	defer shutdown(t, n)
	_, metrics := httpGet(t, n, "/metrics")
	require.Contains(t, metrics, "ferrymq_nats_reachable 1")

	ns.Kill()
	raised := hook.wait(t, alarm.KindNATSUnreachable, "nats", alarm.StateRaised)
	require.Contains(t, raised.Message, "does not answer")
	require.True(t, activeKinds(t, n)["nats_unreachable nats"])
	_, metrics = httpGet(t, n, "/metrics")
	require.Contains(t, metrics, "ferrymq_nats_reachable 0")

	ns.Start()
	ns.WaitReady(t, 30*time.Second)
	hook.wait(t, alarm.KindNATSUnreachable, "nats", alarm.StateCleared)
	require.Len(t, hook.find(alarm.KindNATSUnreachable, "", alarm.StateRaised), 1)
	require.Eventually(t, func() bool {
		s := strings.Join(storedEvents(t, n.Broker()), "\n")
		return strings.Contains(s, "nats_unreachable nats raised\nnats_unreachable nats cleared")
	}, 20*time.Second, 50*time.Millisecond, "the raise NATS refused is stored ahead of the clear")
}

func httpPost(t *testing.T, n *node.Node, path, body string) (int, string) {
	t.Helper()
	return httpDo(t, n, http.MethodPost, path, body)
}

// httpDo sends a request with a JSON body (none if empty) to n's HTTP API
// and returns the status and the body of the answer.
func httpDo(t testing.TB, n *node.Node, method, path, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+n.HTTPAddr().String()+path, rd)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}
