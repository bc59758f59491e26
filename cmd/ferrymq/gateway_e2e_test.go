package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/store"
)

// `ferrymq serve --flush sync` is killed with SIGKILL while 8 devices
// publish QoS 1 as fast as the gateway acknowledges: every message that got
// its PUBACK is in the store afterwards, in per-device order.
func TestGatewayKill9KeepsEveryAckedMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	data := filepath.Join(t.TempDir(), "data")
	mqttAddr, _, srv := startSyncServe(t, bin, data)

	const devices = 8
	var mu sync.Mutex
	acked := map[string][]int{} // device → acknowledged sequence numbers
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for d := range devices {
		id := fmt.Sprintf("car-%d", d)
		c := dialMQTT(t, mqttAddr, id, func(o *paho3.ClientOptions) {
			o.SetConnectRetry(false).SetCleanSession(true).SetWriteTimeout(5 * time.Second)
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Disconnect(0)
			type sent struct {
				seq int
				tok paho3.Token
			}
			window := make(chan sent, 32) // 32 in flight per device
			var ww sync.WaitGroup
			ww.Add(1)
			go func() {
				defer ww.Done()
				for s := range window {
					if s.tok.WaitTimeout(10*time.Second) && s.tok.Error() == nil {
						mu.Lock()
						acked[id] = append(acked[id], s.seq)
						mu.Unlock()
					}
				}
			}()
			for seq := 0; ctx.Err() == nil; seq++ {
				window <- sent{seq, c.Publish("telemetry/"+id, 1, false, fmt.Sprintf("%s-%06d", id, seq))}
			}
			close(window)
			ww.Wait()
		}()
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range acked {
			n += len(s)
		}
		return n >= 2000
	}, 60*time.Second, 5*time.Millisecond, "publishers make progress")
	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGKILL))
	<-srv.exited
	srv.exited <- nil
	stop()
	wg.Wait()

	st, err := store.Open(data, store.Options{})
	require.NoError(t, err)
	defer st.Close()
	stored := map[string][]string{}
	info, err := st.Topic(t.Context(), "telemetry")
	require.NoError(t, err)
	for q := range info.Queues {
		for off := int64(0); ; {
			res, err := st.Read(t.Context(), core.ReadRequest{Topic: "telemetry", Queue: q, Offset: off, MaxCount: 1000})
			require.NoError(t, err)
			if len(res.Messages) == 0 {
				break
			}
			for _, m := range res.Messages {
				stored[m.ShardingKey] = append(stored[m.ShardingKey], string(m.Body))
			}
			off = res.NextOffset
		}
	}
	total := 0
	for id, seqs := range acked {
		have := map[string]bool{}
		for i, b := range stored[id] {
			have[b] = true
			if i > 0 {
				require.Less(t, stored[id][i-1], b, "%s: stored out of order", id)
			}
		}
		for _, s := range seqs {
			require.True(t, have[fmt.Sprintf("%s-%06d", id, s)], "%s: acknowledged message %d lost", id, s)
		}
		total += len(seqs)
	}
	t.Logf("%d acknowledged messages, all stored after SIGKILL", total)
}

// `ferrymq produce --topic commands --key car42 --prop mqtt.topic=…` from a
// backend reaches a subscribed paho device through a running `ferrymq serve`,
// and a point-to-point command reaches a device that subscribed to nothing.
func TestBinaryCommandReachesDevice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	srv := startServe(t, bin, "--data", filepath.Join(t.TempDir(), "data"))
	a := printedAddrs(t, srv, "tcp", "core")
	mqttAddr, coreAddr := a["tcp"], a["core"]

	got := make(chan string, 4)
	connect := func(id string) paho3.Client {
		c := dialMQTT(t, mqttAddr, id, func(o *paho3.ClientOptions) {
			o.SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got <- id + " " + m.Topic() + " " + string(m.Payload()) })
		})
		t.Cleanup(func() { c.Disconnect(100) })
		return c
	}
	car42 := connect("car42")
	tok := car42.Subscribe("cars/car42/cmd", 1, nil)
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	connect("car7")

	produce := func(args ...string) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, append([]string{"produce", "--server", coreAddr}, args...)...).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	produce("--topic", "commands", "--key", "car42", "--prop", "mqtt.topic=cars/car42/cmd", "unlock")
	produce("--topic", "commands", "--key", "car7", "--prop", "mqtt.clientid=car7", "honk")
	var recv []string
	for len(recv) < 2 {
		select {
		case s := <-got:
			recv = append(recv, s)
		case <-time.After(20 * time.Second):
			t.Fatalf("devices got only %v", recv)
		}
	}
	require.ElementsMatch(t, []string{"car42 cars/car42/cmd unlock", "car7 commands/car7 honk"}, recv)
}

// A car with a persistent session subscribes QoS 1 and goes offline; 100
// commands are produced; `ferrymq serve` is killed with SIGKILL and
// restarted; the car reconnects with clean session 0 and gets all 100 in
// order, and a "delivered" receipt appears for each.
func TestBinarySessionSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	data := filepath.Join(t.TempDir(), "data")
	mqttAddr, coreAddr, srv := startSyncServe(t, bin, data)
	got := make(chan string, 200)
	dial := func(addr string) paho3.Client {
		return dialMQTT(t, addr, "car42", func(o *paho3.ClientOptions) {
			o.SetCleanSession(false).SetOrderMatters(true).
				SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got <- string(m.Payload()) })
		})
	}
	c := dial(mqttAddr)
	tok := c.Subscribe("cars/car42/cmd", 1, nil)
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	c.Disconnect(100)

	const n = 100
	var lines strings.Builder
	for i := range n {
		fmt.Fprintf(&lines, "c%03d\n", i)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	prod := exec.CommandContext(ctx, bin, "produce", "--server", coreAddr, "--topic", "commands", "--key", "car42",
		"--prop", "mqtt.topic=cars/car42/cmd", "-")
	prod.Stdin = strings.NewReader(lines.String())
	out, err := prod.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Eventually(t, func() bool { // every command's payload written to the session log (binary: docs/sessions.md)
		b, err := os.ReadFile(filepath.Join(data, "sessions", "sessions.log"))
		if err != nil {
			return false
		}
		for i := range n {
			if !bytes.Contains(b, fmt.Appendf(nil, "c%03d", i)) {
				return false
			}
		}
		return true
	}, 20*time.Second, 10*time.Millisecond, "commands queued in the session")

	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGKILL))
	<-srv.exited
	srv.exited <- nil

	mqttAddr, coreAddr, _ = startSyncServe(t, bin, data)
	c = dial(mqttAddr)
	defer c.Disconnect(100)
	var recv []string
	for len(recv) < n {
		select {
		case s := <-got:
			recv = append(recv, s)
		case <-time.After(20 * time.Second):
			t.Fatalf("got %d of %d commands: %v", len(recv), n, recv)
		}
	}
	want := strings.Fields(lines.String())
	require.Equal(t, want, recv)

	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, "consume", "--server", coreAddr, "--topic", "device-receipts",
			"--group", fmt.Sprintf("r%d", time.Now().UnixNano()), "--from", "earliest", "--count", fmt.Sprint(n), "--json",
			"--idle-timeout", "3s").Output()
		return err == nil && strings.Count(string(out), `\"outcome\":\"delivered\"`) >= n
	}, 30*time.Second, 500*time.Millisecond, "a delivered receipt per command")
}

// A persistent session with a will whose connection dies with the process
// (kill -9) gets its will published when the gateway comes back — once: a
// later graceful restart does not send it again.
func TestBinaryWillAfterKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	data := filepath.Join(t.TempDir(), "data")
	mqttAddr, _, srv := startSyncServe(t, bin, data)
	c := dialMQTT(t, mqttAddr, "car-w", func(o *paho3.ClientOptions) {
		o.SetCleanSession(false).SetWill("status/car-w", "offline", 1, false)
	})
	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGKILL))
	<-srv.exited
	srv.exited <- nil
	c.Disconnect(0)

	wills := func(coreAddr string) int {
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, "consume", "--server", coreAddr, "--topic", "status",
			"--group", fmt.Sprintf("w%d", time.Now().UnixNano()), "--from", "earliest", "--json", "--idle-timeout", "2s").CombinedOutput()
		t.Logf("consume: %v %s", err, out)
		return strings.Count(string(out), `"body":"offline"`)
	}
	_, coreAddr, srv := startSyncServe(t, bin, data)
	require.Eventually(t, func() bool { return wills(coreAddr) == 1 }, 20*time.Second, 200*time.Millisecond)
	srv.interrupt(t)
	_, coreAddr, _ = startSyncServe(t, bin, data)
	require.Equal(t, 1, wills(coreAddr), "the will is sent once")
}

// Two gateway processes (`serve --core-remote`) in front of one core
// process: a point-to-point command reaches its device on whichever node it
// is connected to, exactly once, and uplink from both nodes lands in the one
// core.
func TestBinaryTwoGatewaysOneCore(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	coreProc := startServe(t, bin, "--data", filepath.Join(t.TempDir(), "core"))
	coreAddr := printedAddrs(t, coreProc, "core")["core"]
	var gws []string
	for i := range 2 {
		p := startProcess(t, bin, "serve", "--core-remote", coreAddr, "--data", filepath.Join(t.TempDir(), fmt.Sprint("gw", i)),
			"--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "")
		gws = append(gws, printedAddrs(t, p, "tcp")["tcp"])
	}

	got := make(chan string, 16)
	connect := func(addr, id string) paho3.Client {
		c := dialMQTT(t, addr, id, func(o *paho3.ClientOptions) {
			o.SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got <- id + " " + string(m.Payload()) })
		})
		t.Cleanup(func() { c.Disconnect(100) })
		return c
	}
	a := connect(gws[0], "car-a")
	b := connect(gws[1], "car-b")

	// Uplink from both nodes, acknowledged once the core has it.
	for _, c := range []struct {
		cl paho3.Client
		id string
	}{{a, "car-a"}, {b, "car-b"}} {
		tok := c.cl.Publish("telemetry/"+c.id, 1, false, "hello from "+c.id)
		require.True(t, tok.WaitTimeout(10*time.Second))
		require.NoError(t, tok.Error())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "consume", "--server", coreAddr, "--topic", "telemetry", "--group", "t",
		"--from", "earliest", "--count", "2", "--json").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), `"body":"hello from car-a"`)
	require.Contains(t, string(out), `"body":"hello from car-b"`)

	// Downlink: both nodes see every command; each reaches its device once.
	// Wait until both nodes' broadcast consumers own the commands queues
	// (a new member starts at the latest offset).
	cc, err := client.Dial(ctx, client.Options{Addr: coreAddr})
	require.NoError(t, err)
	defer cc.Close()
	require.Eventually(t, func() bool {
		gs, err := cc.Groups(ctx)
		if err != nil {
			return false
		}
		ready := 0
		for _, g := range gs {
			for _, m := range g.Members {
				if strings.HasPrefix(g.Group, "gateway-") && len(m.Queues) > 0 {
					ready++
				}
			}
		}
		return ready == 2
	}, 20*time.Second, 20*time.Millisecond)
	requireCommandsOnce(t, bin, coreAddr, got, "car-a", "car-b")
}

// requireCommandsOnce produces a point-to-point command to each device
// (property mqtt.clientid) through the core at coreAddr and requires that
// got, fed "<id> <payload>" by the devices' handlers, carries each exactly
// once and nothing more.
func requireCommandsOnce(t *testing.T, bin, coreAddr string, got <-chan string, ids ...string) {
	t.Helper()
	var want []string
	for _, id := range ids {
		out, err := exec.CommandContext(t.Context(), bin, "produce", "--server", coreAddr, "--topic", "commands", "--key", id,
			"--prop", "mqtt.clientid="+id, "cmd for "+id).CombinedOutput()
		require.NoError(t, err, "%s", out)
		want = append(want, id+" cmd for "+id)
	}
	var recv []string
	for len(recv) < len(ids) {
		select {
		case s := <-got:
			recv = append(recv, s)
		case <-time.After(20 * time.Second):
			t.Fatalf("devices got only %v", recv)
		}
	}
	select { // and nothing twice
	case s := <-got:
		t.Fatalf("delivered twice: %s (after %v)", s, recv)
	case <-time.After(time.Second):
	}
	require.ElementsMatch(t, want, recv)
}

// printedAddrs waits until serve printed a line for each key ("tcp",
// "core", "http") and returns the addresses.
func printedAddrs(t *testing.T, p *process, keys ...string) map[string]string {
	t.Helper()
	return printedAddrsWithin(t, p, 30*time.Second, keys...)
}

// printedAddrsWithin is printedAddrs with its own bound: a node on NATS
// prints "core" only once it holds the core lease and created the system
// topics' replicated streams, which a loaded CI machine takes a while for.
func printedAddrsWithin(t *testing.T, p *process, within time.Duration, keys ...string) map[string]string {
	t.Helper()
	got := map[string]string{}
	printed := func() bool {
		for _, l := range nonEmptyLines(p.out.String()) {
			for _, k := range keys {
				if rest, ok := strings.CutPrefix(l, k+" "); ok {
					got[k] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(rest), "remote "))
				}
			}
		}
		return len(got) == len(keys)
	}
	if !assert.Eventually(t, printed, within, 10*time.Millisecond, "%s printed %v", p.cmd.Args[1], keys) {
		// What the process said, for the next one to read.
		logs := nonEmptyLines(p.errOut.String())
		t.Fatalf("%s printed:\n%s\nlast log lines:\n%s", p.cmd.Args[1], p.out.String(),
			strings.Join(logs[max(0, len(logs)-30):], "\n"))
	}
	return got
}

// startServe runs `ferrymq serve` with the core, HTTP and MQTT TCP
// listeners on loopback ports the kernel picks, no websocket, plus extra
// flags.
func startServe(t *testing.T, bin string, extra ...string) *process {
	t.Helper()
	args := append([]string{"serve", "--core", "127.0.0.1:0", "--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", ""}, extra...)
	return startProcess(t, bin, args...)
}

// startSyncServe runs `ferrymq serve --flush sync` on data (startServe)
// and returns the MQTT and core addresses.
func startSyncServe(t *testing.T, bin, data string) (mqttAddr, coreAddr string, p *process) {
	t.Helper()
	p = startServe(t, bin, "--data", data, "--flush", "sync")
	a := printedAddrs(t, p, "tcp", "core")
	return a["tcp"], a["core"], p
}

// serve with an auth section: the sample device logs in with its password,
// a wrong password is refused, and the device is confined by the ACL.
func TestBinaryServeWithAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	users, err := filepath.Abs("../../testdata/auth/users.yaml")
	require.NoError(t, err)
	cfg := filepath.Join(t.TempDir(), "ferrymq.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("auth:\n  static: {file: "+users+"}\n  acl:\n    - {action: allow, publish: [\"devices/%c/#\"]}\n"), 0o600))
	srv := startServe(t, bin, "--config", cfg, "--data", filepath.Join(t.TempDir(), "data"))
	addr := printedAddrs(t, srv, "tcp")["tcp"]
	connect := func(pass string, lost chan struct{}) (paho3.Client, error) {
		o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("car-42").SetUsername("car-42").
			SetPassword(pass).SetAutoReconnect(false).SetConnectRetry(false).
			SetConnectionLostHandler(func(paho3.Client, error) { close(lost) })
		c := paho3.NewClient(o)
		tok := c.Connect()
		require.True(t, tok.WaitTimeout(10*time.Second))
		return c, tok.Error()
	}
	_, err = connect("wrong", make(chan struct{}))
	require.Error(t, err)
	lost := make(chan struct{})
	c, err := connect("demo-password", lost)
	require.NoError(t, err)
	tok := c.Publish("devices/car-42/t", 1, false, "mine")
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	c.Publish("devices/car-7/t", 1, false, "not mine")
	select {
	case <-lost: // MQTT 3: disconnected for publishing outside its topics
	case <-time.After(10 * time.Second):
		t.Fatal("not disconnected")
	}
}

// serve listening beyond loopback without a configured token generates one
// (written to <data>/token): the HTTP API answers 401 without it, the core
// port refuses clients without it, and both work with it; health stays open.
func TestBinaryTokenWhenExposed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	data := filepath.Join(t.TempDir(), "data")
	srv := startProcess(t, bin, "serve", "--data", data, "--core", ":0", "--http", ":0", "--mqtt", "127.0.0.1:0", "--ws", "")
	a := printedAddrs(t, srv, "core", "http")
	_, corePort, _ := net.SplitHostPort(a["core"])
	_, httpPort, _ := net.SplitHostPort(a["http"])
	tok, err := os.ReadFile(filepath.Join(data, "token"))
	require.NoError(t, err)
	token := strings.TrimSpace(string(tok))
	require.Len(t, token, 48)

	get := func(path, auth string) int {
		req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+httpPort+path, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		return res.StatusCode
	}
	require.Equal(t, http.StatusUnauthorized, get("/api/v1/topics/x/messages", ""))
	require.Equal(t, http.StatusUnauthorized, get("/api/v1/topics/x/messages", "wrong"))
	require.NotEqual(t, http.StatusUnauthorized, get("/api/v1/topics/x/messages", token))
	require.Equal(t, http.StatusOK, get("/healthz", ""))

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	produce := func(args ...string) error {
		cmd := exec.CommandContext(ctx, bin, append([]string{"produce", "--server", "127.0.0.1:" + corePort, "--topic", "t"}, args...)...)
		cmd.Dir = t.TempDir() // no data/token here
		cmd.Env = append(os.Environ(), "FERRYMQ_TOKEN=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	require.Error(t, produce("x"))
	require.NoError(t, produce("--token", token, "x"))
}

// dialMQTT connects a paho MQTT 3.1.1 client (no automatic reconnect) and
// fails the test if the CONNECT is refused; tune adds options.
func dialMQTT(t *testing.T, addr, id string, tune func(*paho3.ClientOptions)) paho3.Client {
	t.Helper()
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetAutoReconnect(false)
	if tune != nil {
		tune(o)
	}
	c := paho3.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	return c
}
