package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/brokertest"
	"github.com/ferrymq/ferrymq/core/store"
)

// QoS 2 exactly once into the core, whatever crashes: devices publish
// numbered QoS 2 messages (MQTT 5, paho.golang's autopaho reconnecting on
// its own with its session, session expiry 10 min) while `ferrymq serve
// --flush sync` is killed with SIGKILL four times and restarted on the same
// data directory and MQTT port. Afterwards the core holds every message a
// device completed (PUBCOMP) exactly once, and no message twice.
//
// MQTT 5 and paho.golang because paho.mqtt.golang (v1.5.1) does not store
// the PUBREL it answers a PUBREC with: after a reconnect it resends the
// PUBLISH of a flow the server may have released already, which is then a
// new publication by the protocol (docs/commands.md, "QoS 2: exactly once
// into the core").
func TestBinaryQoS2ExactlyOnceUnderKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	data := filepath.Join(t.TempDir(), "data")
	port := freeLoopbackPort(t)
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", port)
	srv, httpAddr := startQoS2Serve(t, bin, data, mqttAddr)
	found := 0 // unsure resends the servers found stored already

	const devices, perDevice, kills = 6, 8, 4 // perDevice: publishes each keeps in flight
	var mu sync.Mutex
	completed := map[string]bool{} // payload → PUBCOMP received
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	u, err := url.Parse("mqtt://" + mqttAddr)
	require.NoError(t, err)
	for d := range devices {
		id := fmt.Sprintf("q2-%d", d)
		cm, err := autopaho.NewConnection(context.WithoutCancel(ctx), autopaho.ClientConfig{
			ServerUrls: []*url.URL{u}, KeepAlive: 30, SessionExpiryInterval: 600,
			ConnectRetryDelay: 50 * time.Millisecond, ReconnectBackoff: func(int) time.Duration { return 50 * time.Millisecond },
			ConnectTimeout: 5 * time.Second,
			ClientConfig:   paho.ClientConfig{ClientID: id, PacketTimeout: 30 * time.Second},
		})
		require.NoError(t, err)
		awaitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		require.NoError(t, cm.AwaitConnection(awaitCtx))
		cancel()
		var next atomic.Int64
		var dw sync.WaitGroup
		for range perDevice {
			dw.Go(func() {
				for ctx.Err() == nil {
					p := fmt.Sprintf("%s-%06d", id, next.Add(1))
					for {
						// Not cancelled by stop: a publish on its way completes.
						pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						res, err := cm.Publish(pctx, &paho.Publish{QoS: 2, Topic: "telemetry/" + id, Payload: []byte(p)})
						cancel()
						if errors.Is(err, autopaho.ConnectionDownError) && ctx.Err() == nil {
							// Never sent: send it once connected again.
							actx, cancel := context.WithTimeout(ctx, 30*time.Second)
							_ = cm.AwaitConnection(actx)
							cancel()
							continue
						}
						if err == nil && res.ReasonCode < 0x80 {
							mu.Lock()
							completed[p] = true
							mu.Unlock()
						}
						break
					}
				}
			})
		}
		wg.Go(func() {
			dw.Wait()
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = cm.Disconnect(dctx)
			<-cm.Done()
		})
	}
	progress := func(n int) {
		t.Helper()
		mu.Lock()
		from := len(completed)
		mu.Unlock()
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(completed) >= from+n
		}, 30*time.Second, 5*time.Millisecond, "devices complete QoS 2 publishes")
	}
	for range kills {
		progress(300)
		found += unsureResendsStored(t, httpAddr)
		require.NoError(t, srv.cmd.Process.Signal(syscall.SIGKILL))
		<-srv.exited
		srv.exited <- nil
		srv, httpAddr = startQoS2Serve(t, bin, data, mqttAddr)
	}
	progress(300) // the resends after the last kill went through
	stop()
	wg.Wait()
	found += unsureResendsStored(t, httpAddr)
	srv.interrupt(t)

	st, err := store.Open(data, store.Options{})
	require.NoError(t, err)
	defer st.Close()
	msgs, err := brokertest.ReadTopic(t.Context(), st, "telemetry")
	require.NoError(t, err)
	copies := map[string]int{}
	for _, m := range msgs {
		copies[string(m.Body)]++
	}
	for p, n := range copies {
		require.Equal(t, 1, n, "%s is in the core %d times", p, n)
	}
	mu.Lock()
	defer mu.Unlock()
	for p := range completed {
		require.Equal(t, 1, copies[p], "%s completed, in the core %d times", p, copies[p])
	}
	t.Logf("%d QoS 2 messages completed through %d kills, %d stored (each once); %d resends found stored already",
		len(completed), kills, len(copies), found)
}

// freeLoopbackPort returns a TCP port on 127.0.0.1 that was free a moment
// ago: the MQTT port every restart of the server binds again, so that the
// devices reconnect on their own.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// startQoS2Serve runs `ferrymq serve --flush sync` on data with MQTT on
// mqttAddr, waits for its listeners and returns its HTTP address.
func startQoS2Serve(t *testing.T, bin, data, mqttAddr string) (*process, string) {
	t.Helper()
	p := startServe(t, bin, "--data", data, "--flush", "sync", "--mqtt", mqttAddr)
	return p, printedAddrs(t, p, "tcp", "core", "http")["http"]
}

// unsureResendsStored reads from a server's /metrics how many unsure QoS 2
// resends it found stored already (and did not store again).
func unsureResendsStored(t *testing.T, httpAddr string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, `ferrymq_bridge_qos2_unsure_resends_total{outcome="stored"} `); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			require.NoError(t, err, l)
			return n
		}
	}
	return 0
}
