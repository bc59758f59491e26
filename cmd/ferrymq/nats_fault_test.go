package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// Fault tests of `ferrymq serve --engine nats` on NATS nodes that are child
// processes of the test binary, so that they can be SIGKILLed: the queue
// must keep every publish the gateway acknowledged, in per-device order,
// whatever happens to NATS.

const (
	// faultTopic is the core topic the devices publish to (telemetry/<id>).
	faultTopic = "telemetry"
	// faultStream is faultTopic's JetStream stream.
	faultStream = "FMQ_" + faultTopic
	// faultAckWait bounds the wait for one PUBACK: well past the engine's
	// 5 s JetStream publish timeout, after which the gateway disconnects
	// the device without an ack.
	faultAckWait = 15 * time.Second
)

// faultDevice is an MQTT 3.1.1 device that publishes numbered QoS 1
// messages ("<id> <seq>") to telemetry/<id>, one at a time, at least once:
// it waits for each PUBACK, and after an error or a lost connection it
// connects again and resends the same number. Its fields are the test
// goroutine's to read once run has returned; acks may be read any time.
type faultDevice struct {
	id, addr string
	// limit, when > 0, ends run once next reaches it.
	limit int

	next     int           // number to publish next; all before it were acknowledged
	acked    []int         // numbers acknowledged, in order
	attempts map[int]int   // publishes per number
	failures []string      // why attempts were not acknowledged
	stall    time.Duration // longest time between two acks (or start and first ack)
	connects int           // successful connects, the first included
	acks     atomic.Int64
}

func newFaultDevice(id, addr string) *faultDevice {
	return &faultDevice{id: id, addr: addr, attempts: map[int]int{}}
}

func (d *faultDevice) body(seq int) string { return fmt.Sprintf("%s %06d", d.id, seq) }

// connect dials until a CONNECT is accepted or ctx ends (nil then).
func (d *faultDevice) connect(ctx context.Context) paho3.Client {
	for ctx.Err() == nil {
		o := paho3.NewClientOptions().AddBroker("tcp://" + d.addr).SetClientID(d.id).SetCleanSession(true).
			SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(5 * time.Second).SetWriteTimeout(5 * time.Second)
		c := paho3.NewClient(o)
		tok := c.Connect()
		if tok.WaitTimeout(6*time.Second) && tok.Error() == nil {
			d.connects++
			return c
		}
		c.Disconnect(0)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

// run publishes until ctx ends or the limit is reached.
func (d *faultDevice) run(ctx context.Context) {
	c := d.connect(ctx)
	last := time.Now()
	for c != nil && ctx.Err() == nil && (d.limit == 0 || d.next < d.limit) {
		seq := d.next
		d.attempts[seq]++
		tok := c.Publish("telemetry/"+d.id, 1, false, d.body(seq))
		if tok.WaitTimeout(faultAckWait) && tok.Error() == nil {
			now := time.Now()
			d.stall = max(d.stall, now.Sub(last))
			last = now
			d.acked = append(d.acked, seq)
			d.next++
			d.acks.Add(1)
			continue
		}
		why := "no PUBACK within " + faultAckWait.String()
		if err := tok.Error(); err != nil {
			why = err.Error()
		}
		d.failures = append(d.failures, fmt.Sprintf("%d: %s", seq, why))
		c.Disconnect(0)
		c = d.connect(ctx)
	}
	if c != nil {
		c.Disconnect(250)
	}
}

// runDevices runs the devices until ctx ends or each reached its limit.
func runDevices(ctx context.Context, devs []*faultDevice) (wait func()) {
	var wg sync.WaitGroup
	for _, d := range devs {
		wg.Go(func() { d.run(ctx) })
	}
	return wg.Wait
}

// publishAll runs the devices until each reached its limit and fails the
// test if that takes longer than timeout.
func publishAll(t *testing.T, timeout time.Duration, devs ...*faultDevice) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	runDevices(ctx, devs)()
	for _, d := range devs {
		require.Equal(t, d.limit, d.next, "%s: acknowledged up to %d in %v, not %d; failures: %v", d.id, d.next, timeout, d.limit, d.failures)
	}
}

// httpNoKeepAlive keeps no idle connections (no goroutine outlives a
// request, for goleak).
var httpNoKeepAlive = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// httpStatus GETs url; code 0 when there was no answer.
func httpStatus(url string) (int, string) {
	resp, err := httpNoKeepAlive.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// clientShows is a poll condition: the admin API at httpAddr describes
// MQTT client id with want in its JSON (`"parked":true`, `"queued":1`).
func clientShows(httpAddr, id, want string) func() bool {
	return func() bool {
		code, body := httpStatus("http://" + httpAddr + "/api/v1/clients/" + id)
		return code == http.StatusOK && strings.Contains(body, want)
	}
}

// waitStatus polls url until it answers code and returns how long that took
// from since; it fails the test after timeout.
func waitStatus(t *testing.T, url string, code int, since time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got, body := httpStatus(url)
		assert.Equal(c, code, got, "%s answered %q", url, body)
	}, timeout, 50*time.Millisecond, "%s did not answer %d within %v", url, code, timeout)
	return time.Since(since)
}

// lastPrinted is the address on the last line serve printed for key ("" if
// none): the core line comes again with a new port each time the node
// takes the core lease.
func lastPrinted(p *process, key string) string {
	addr := ""
	for _, l := range nonEmptyLines(p.out.String()) {
		if rest, ok := strings.CutPrefix(l, key+" "); ok {
			addr = strings.TrimSpace(rest)
		}
	}
	return addr
}

// natsCore waits until one of the serve nodes holds the core lease and
// answers on its core port, and returns that address. On failure the
// nodes' logs are printed.
func natsCore(t *testing.T, timeout time.Duration, nodes ...*process) string {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range nodes {
				t.Logf("%s stderr:\n%s", p.cmd.Args, p.errOut.String())
			}
		}
	})
	var addr string
	require.Eventually(t, func() bool {
		for _, p := range nodes {
			a := lastPrinted(p, "core")
			if a == "" {
				continue
			}
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			c, err := client.Dial(ctx, client.Options{Addr: a, DialTimeout: time.Second})
			if err == nil {
				_, err = c.Topics(ctx)
				_ = c.Close()
			}
			cancel()
			if err == nil {
				addr = a
				return true
			}
		}
		return false
	}, timeout, 100*time.Millisecond, "no serve node answers on its core port")
	return addr
}

// readTopic reads every queue of topic from the start, without a group,
// and returns the messages queue by queue in queue order.
func readTopic(t *testing.T, coreAddr, topic string) []*core.StoredMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Addr: coreAddr})
	require.NoError(t, err)
	defer c.Close()
	info, err := c.Topic(ctx, topic)
	require.NoError(t, err)
	var all []*core.StoredMessage
	for q, rg := range info.Ranges {
		for off := rg.Min; off < rg.Max; {
			res, err := c.Pull(ctx, topic, q, off, 256, 0)
			require.NoError(t, err)
			if len(res.Messages) == 0 {
				break
			}
			all = append(all, res.Messages...)
			off = res.NextOffset
		}
	}
	return all
}

// consumeGroup runs `ferrymq consume --orderly` as group until it printed
// count messages and returns them.
func consumeGroup(t *testing.T, bin, coreAddr, group string, count int) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "consume", "--server", coreAddr, "--topic", faultTopic, "--group", group,
		"--orderly", "--count", strconv.Itoa(count), "--json").Output()
	require.NoError(t, err, "%s", out)
	var msgs []map[string]any
	for _, l := range nonEmptyLines(string(out)) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		msgs = append(msgs, m)
	}
	require.Len(t, msgs, count)
	return msgs
}

func jsonBodies(msgs []map[string]any) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m["body"].(string))
	}
	return out
}

// requireServing fails the test if a serve process exited or logged a
// panic or a data race.
func requireServing(t *testing.T, ps ...*process) {
	t.Helper()
	bad := regexp.MustCompile(`panic:|DATA RACE|fatal error:`)
	for _, p := range ps {
		select {
		case err := <-p.exited:
			p.exited <- err // for Cleanup
			t.Fatalf("serve exited: %v; stderr:\n%s", err, p.errOut.String())
		default:
		}
		require.False(t, bad.MatchString(p.errOut.String()), "serve logged:\n%s", p.errOut.String())
	}
}

// checkDeviceOrder checks what the core holds of each device against what
// the device was told: every acknowledged number is there; per device the
// numbers run 0, 1, 2, … without gap or step back, where a number may
// repeat right after itself (a resend after an unacknowledged attempt that
// was stored nonetheless) but at most once per extra attempt. It returns
// the duplicates found. Messages of other keys are ignored.
func checkDeviceOrder(t *testing.T, devs []*faultDevice, stored []*core.StoredMessage) (dups []string) {
	t.Helper()
	seqs := map[string][]int{}
	for _, m := range stored {
		if !slices.ContainsFunc(devs, func(d *faultDevice) bool { return d.id == m.ShardingKey }) {
			continue
		}
		id, num, ok := strings.Cut(string(m.Body), " ")
		require.True(t, ok, "body %q", m.Body)
		require.Equal(t, m.ShardingKey, id, "sharding key of %q", m.Body)
		n, err := strconv.Atoi(num)
		require.NoError(t, err, "body %q", m.Body)
		seqs[id] = append(seqs[id], n)
	}
	for _, d := range devs {
		got := seqs[d.id]
		copies := map[int]int{}
		prev := -1
		for i, n := range got {
			copies[n]++
			switch n {
			case prev + 1:
				prev = n
			case prev:
				dups = append(dups, d.body(n))
			default:
				t.Errorf("%s: stored number %d follows %d (position %d of %d): a gap or a step back", d.id, n, prev, i, len(got))
			}
		}
		for n, k := range copies {
			require.LessOrEqual(t, k, d.attempts[n], "%s: number %d stored %d times but published %d times", d.id, n, k, d.attempts[n])
		}
		require.NotEmpty(t, d.acked, d.id)
		last := d.acked[len(d.acked)-1]
		require.GreaterOrEqual(t, prev, last, "%s: acknowledged %d, the core ends at %d", d.id, last, prev)
		require.LessOrEqual(t, prev, d.next, "%s: the core holds %d, never published", d.id, prev)
		for _, n := range d.acked {
			require.Positive(t, copies[n], "%s: acknowledged %d is missing", d.id, n)
		}
	}
	return dups
}

// SIGKILL the NATS node leading the topic's stream, again and again, while
// six devices on two serve nodes publish QoS 1 at least once: nothing
// acknowledged is lost and each device's messages stay in order, with
// duplicates only of resent messages, right after their first copy.
func TestBinaryNATSFaultStreamLeaderKillLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and kills NATS processes")
	}
	bin := buildBinary(t)
	cl := natstest.RunProcessCluster(t, 3, natstest.SyncAlways())
	nodeA := startNATSNode(t, bin, cl.URLs(), "node-a", 3)
	addrA := printedAddrsWithin(t, nodeA, 90*time.Second, "tcp", "core")
	nodeB := startNATSNode(t, bin, cl.URLs(), "node-b", 3)
	addrB := printedAddrsWithin(t, nodeB, 90*time.Second, "tcp")

	var devs []*faultDevice
	for i := range 6 {
		addr := addrA["tcp"]
		if i%2 == 1 {
			addr = addrB["tcp"]
		}
		devs = append(devs, newFaultDevice(fmt.Sprintf("dev-%d", i), addr))
	}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	wait := runDevices(ctx, devs)
	defer wait()
	require.Eventually(t, func() bool {
		for _, d := range devs {
			if d.acks.Load() < 20 {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "every device publishes")

	const rounds = 3
	for round := 1; round <= rounds; round++ {
		leader := cl.WaitStreamLeader(t, faultStream, 20*time.Second)
		before := sumAcks(devs)
		killed := time.Now()
		cl.Kill(leader)
		next := -1
		require.Eventually(t, func() bool {
			next = cl.StreamLeader(faultStream)
			return next >= 0 && next != leader
		}, 20*time.Second, 20*time.Millisecond, "no new leader of %s after killing %s", faultStream, cl.Nodes[leader].Name)
		elected := time.Since(killed)
		acks := sumAcks(devs)
		time.Sleep(time.Second) // traffic on two nodes for a while: the scenario, not a wait
		require.Eventually(t, func() bool { return sumAcks(devs) > acks }, 30*time.Second, 20*time.Millisecond,
			"publishes are acknowledged with %s down", cl.Nodes[leader].Name)
		cl.Start(leader)
		cl.WaitReady(t, 45*time.Second)
		t.Logf("round %d: killed leader %s; %s leads after %v; %s back and cluster ready after %v; %d acks meanwhile",
			round, cl.Nodes[leader].Name, cl.Nodes[next].Name, elected.Round(time.Millisecond), cl.Nodes[leader].Name,
			time.Since(killed).Round(time.Millisecond), sumAcks(devs)-before)
		acks = sumAcks(devs)
		time.Sleep(2 * time.Second) // traffic on three nodes for a while: the scenario, not a wait
		require.Eventually(t, func() bool { return sumAcks(devs) > acks }, 30*time.Second, 20*time.Millisecond,
			"publishes are acknowledged with %s back", cl.Nodes[leader].Name)
	}
	before := sumAcks(devs)
	require.Eventually(t, func() bool { return sumAcks(devs) >= before+30 }, 30*time.Second, 20*time.Millisecond,
		"publishes are acknowledged after the kills")
	stop()
	wait()
	requireServing(t, nodeA, nodeB)

	stored := readTopic(t, natsCore(t, 60*time.Second, nodeA, nodeB), faultTopic)
	dups := checkDeviceOrder(t, devs, stored)
	failed, acked := 0, 0
	var stall time.Duration
	for _, d := range devs {
		failed += len(d.failures)
		acked += len(d.acked)
		stall = max(stall, d.stall)
		if len(d.failures) > 0 {
			t.Logf("%s: %d acked, %d failed attempts, %d connects, longest stall %v; failures: %s", d.id, len(d.acked),
				len(d.failures), d.connects, d.stall.Round(time.Millisecond), strings.Join(d.failures, "; "))
		}
	}
	t.Logf("%d publishes acknowledged, %d attempts failed during elections, longest stall %v; core holds %d messages, %d duplicates %v",
		acked, failed, stall.Round(time.Millisecond), len(stored), len(dups), dups)
	logs := nodeA.errOut.String() + nodeB.errOut.String()
	t.Logf("core lease: %d terms started, %d failed to start, %d lost; %d publishes refused (devices disconnected without ack)",
		strings.Count(logs, "core services started"), strings.Count(logs, "core services did not start"),
		strings.Count(logs, "lease lost"), strings.Count(logs, "client disconnected without ack"))
}

func sumAcks(devs []*faultDevice) int64 {
	var n int64
	for _, d := range devs {
		n += d.acks.Load()
	}
	return n
}

// SIGKILL every NATS node at once after acknowledged traffic and committed
// group progress, then start them again: the serve node gets ready again by
// itself, every acknowledged message is still there, the group resumes
// after its committed offsets and new publishes are acknowledged.
func TestBinaryNATSFaultRestartAllNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and kills NATS processes")
	}
	bin := buildBinary(t)
	cl := natstest.RunProcessCluster(t, 3, natstest.SyncAlways())
	node := startNATSNode(t, bin, cl.URLs(), "node-a", 3)
	up := time.Now()
	addrs := printedAddrsWithin(t, node, 90*time.Second, "tcp", "http", "core")
	t.Logf("serve node up with the core lease after %v", time.Since(up).Round(time.Millisecond))
	readyz := "http://" + addrs["http"] + "/readyz"

	const perDevice, first = 75, 120
	var devs []*faultDevice
	for i := range 4 {
		d := newFaultDevice(fmt.Sprintf("car-%d", i), addrs["tcp"])
		d.limit = perDevice
		devs = append(devs, d)
	}
	publishAll(t, 60*time.Second, devs...)
	var all []string
	for _, d := range devs {
		require.Empty(t, d.failures, d.id)
		require.Len(t, d.acked, perDevice, d.id)
		for _, n := range d.acked {
			all = append(all, d.body(n))
		}
	}
	got1 := jsonBodies(consumeGroup(t, bin, addrs["core"], "g1", first))

	killed := time.Now()
	cl.KillAll()
	notReady := waitStatus(t, readyz, http.StatusServiceUnavailable, killed, 10*time.Second)
	code, _ := httpStatus("http://" + addrs["http"] + "/healthz")
	require.Equal(t, http.StatusOK, code, "healthz while NATS is down")
	time.Sleep(time.Second) // NATS stays down a while: the outage is the scenario, not a wait
	code, body := httpStatus(readyz)
	require.Equal(t, http.StatusServiceUnavailable, code, "readyz while NATS stays down: %s", body)
	code, body = httpStatus("http://" + addrs["http"] + "/healthz")
	require.Equal(t, http.StatusOK, code, "healthz while NATS stays down: %s", body)
	started := time.Now()
	cl.StartAll()
	cl.WaitReady(t, 60*time.Second)
	clusterReady := time.Since(started)
	ready := waitStatus(t, readyz, http.StatusOK, started, 60*time.Second)
	coreAddr := natsCore(t, 90*time.Second, node) // a recovery bound, not a speed target: CI runs other packages alongside
	t.Logf("readyz 503 %v after KillAll; after StartAll: cluster ready in %v, readyz 200 in %v, core %s (was %s) in %v",
		notReady.Round(time.Millisecond), clusterReady.Round(time.Millisecond), ready.Round(time.Millisecond), coreAddr,
		addrs["core"], time.Since(started).Round(time.Millisecond))

	require.ElementsMatch(t, all, jsonBodies(consumeGroup(t, bin, coreAddr, "g2", len(all))), "a new group reads everything acknowledged, once")
	rest := slices.DeleteFunc(slices.Clone(all), func(b string) bool { return slices.Contains(got1, b) })
	require.Len(t, rest, len(all)-first)
	require.ElementsMatch(t, rest, jsonBodies(consumeGroup(t, bin, coreAddr, "g1", len(rest))), "g1 resumes after its committed offsets")

	// New publishes are acknowledged at once and reach the group.
	var fresh []string
	for _, d := range devs {
		d.limit = perDevice + 1
		fresh = append(fresh, d.body(perDevice))
	}
	publishAll(t, 30*time.Second, devs...)
	for _, d := range devs {
		require.Empty(t, d.failures, d.id)
	}
	require.ElementsMatch(t, fresh, jsonBodies(consumeGroup(t, bin, coreAddr, "g1", len(fresh))))
	requireServing(t, node)
}

// The only NATS server dies: the serve node's /readyz answers 503 within
// seconds while /healthz stays 200; a QoS 1 publish gets no PUBACK (the
// MQTT 3 device is disconnected without one); once NATS is back /readyz
// turns 200 by itself and publishes are acknowledged and consumable again.
func TestBinaryNATSFaultNATSUnreachable(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and kills NATS processes")
	}
	bin := buildBinary(t)
	ns := natstest.RunProcessServer(t, natstest.SyncAlways())
	node := startNATSNode(t, bin, ns.URL, "node-a", 1)
	addrs := printedAddrsWithin(t, node, 90*time.Second, "tcp", "http", "core")
	readyz, healthz := "http://"+addrs["http"]+"/readyz", "http://"+addrs["http"]+"/healthz"
	code, body := httpStatus(readyz)
	require.Equal(t, http.StatusOK, code, body)

	d := newFaultDevice("car-1", addrs["tcp"])
	d.limit = 20
	publishAll(t, 30*time.Second, d)
	require.Empty(t, d.failures)

	lost := make(chan error, 1)
	dev := dialMQTT(t, addrs["tcp"], "car-2", func(o *paho3.ClientOptions) {
		o.SetConnectionLostHandler(func(_ paho3.Client, err error) { lost <- err })
	})
	t.Cleanup(func() { dev.Disconnect(0) })

	killed := time.Now()
	ns.Kill()
	notReady := waitStatus(t, readyz, http.StatusServiceUnavailable, killed, 5*time.Second)
	_, why := httpStatus(readyz)
	code, _ = httpStatus(healthz)
	require.Equal(t, http.StatusOK, code, "healthz while NATS is down")

	sent := time.Now()
	tok := dev.Publish("telemetry/car-2", 1, false, "car-2 during outage")
	require.True(t, tok.WaitTimeout(faultAckWait), "the publish neither acknowledged nor failed in %v", faultAckWait)
	require.Error(t, tok.Error(), "a publish NATS did not store must not be acknowledged")
	refused := time.Since(sent)
	select {
	case err := <-lost:
		t.Logf("device disconnected without PUBACK after %v: %v (publish: %v)", refused.Round(time.Millisecond), err, tok.Error())
	case <-time.After(5 * time.Second):
		t.Fatal("the device was not disconnected")
	}
	require.Eventually(t, func() bool { return strings.Contains(node.errOut.String(), "client disconnected without ack") },
		5*time.Second, 10*time.Millisecond, "serve logs the refused publish")
	code, _ = httpStatus(healthz)
	require.Equal(t, http.StatusOK, code, "healthz while NATS is down")
	code, _ = httpStatus(readyz)
	require.Equal(t, http.StatusServiceUnavailable, code, "readyz while NATS is down")

	restarted := time.Now()
	ns.Start()
	ready := waitStatus(t, readyz, http.StatusOK, restarted, 30*time.Second)
	t.Logf("readyz 503 %v after the kill (%s); 200 again %v after the restart", notReady.Round(time.Millisecond), why,
		ready.Round(time.Millisecond))

	d.limit = 30
	publishAll(t, 30*time.Second, d)
	require.Empty(t, d.failures, "publishes after NATS is back")
	stored := readTopic(t, natsCore(t, 60*time.Second, node), faultTopic)
	checkDeviceOrder(t, []*faultDevice{d}, stored)
	var phantom []string
	for _, m := range stored {
		if m.ShardingKey == "car-2" {
			phantom = append(phantom, string(m.Body))
		}
	}
	t.Logf("core holds %d messages; of the unacknowledged publish: %q", len(stored), phantom)
	requireServing(t, node)
}
