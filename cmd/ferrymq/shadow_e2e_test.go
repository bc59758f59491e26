package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
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
	"github.com/ferrymq/ferrymq/core/shadow"
)

// shadowLoad runs shadow updates from both sides until stopped, and keeps
// every document an answer accepted.
type shadowLoad struct {
	t        *testing.T
	ctx      context.Context
	stop     context.CancelFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	accepted map[string][]*shadow.Document
	total    atomic.Int64
}

func newShadowLoad(t *testing.T) *shadowLoad {
	l := &shadowLoad{t: t, accepted: map[string][]*shadow.Document{}}
	l.ctx, l.stop = context.WithCancel(t.Context())
	return l
}

func (l *shadowLoad) record(id string, d *shadow.Document) {
	l.mu.Lock()
	l.accepted[id] = append(l.accepted[id], d)
	l.mu.Unlock()
	l.total.Add(1)
}

// backend updates desired of devices over the core port at addr, in turn.
func (l *shadowLoad) backend(addr string, w int, devices []string) {
	c, err := client.Dial(l.t.Context(), client.Options{Addr: addr, MaxBackoff: 50 * time.Millisecond, RequestTimeout: 5 * time.Second})
	require.NoError(l.t, err)
	l.t.Cleanup(func() { _ = c.Close() })
	l.wg.Go(func() {
		for i := 0; l.ctx.Err() == nil; i++ {
			id := devices[(w+i)%len(devices)]
			d, err := c.UpdateShadow(l.ctx, id, json.RawMessage(fmt.Sprintf(`{"target":%d,"by":"core-%d"}`, i, w)), 0)
			if err != nil {
				return // the server is gone
			}
			l.record(id, d)
		}
	})
}

// httpBackend updates desired of devices through the admin API at addr.
func (l *shadowLoad) httpBackend(addr string, devices []string) {
	l.wg.Go(func() {
		for i := 0; l.ctx.Err() == nil; i++ {
			id := devices[i%len(devices)]
			req, err := http.NewRequestWithContext(l.ctx, http.MethodPatch, "http://"+addr+"/api/v1/devices/"+id+"/shadow",
				strings.NewReader(fmt.Sprintf(`{"state":{"desired":{"target":%d,"by":"http"}}}`, i)))
			require.NoError(l.t, err)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				return
			}
			d, err := shadow.DecodeDocument(b)
			require.NoError(l.t, err)
			l.record(id, d)
		}
	})
}

// device reports over MQTT 3.1.1 at addr as id, each update waiting for
// its accepted answer.
func (l *shadowLoad) device(addr, id string) {
	answers := make(chan []byte, 16)
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetCleanSession(true).
		SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).
		SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) {
			if m.Topic() == "$shadow/"+id+"/update/accepted" {
				answers <- m.Payload()
			}
		})
	mc := paho3.NewClient(o)
	tok := mc.Connect()
	require.True(l.t, tok.WaitTimeout(10*time.Second))
	require.NoError(l.t, tok.Error())
	l.t.Cleanup(func() { mc.Disconnect(0) })
	l.wg.Go(func() {
		for i := 0; l.ctx.Err() == nil; i++ {
			mc.Publish("$shadow/"+id+"/update", 1, false, fmt.Sprintf(`{"state":{"reported":{"target":%d}}}`, i))
			select {
			case b := <-answers:
				d, err := shadow.DecodeDocument(b)
				if err != nil {
					l.t.Errorf("%s: accepted answer: %v", id, err)
					return
				}
				l.record(id, d)
			case <-time.After(2 * time.Second):
				return // the server is gone (or refused: then nothing was accepted)
			case <-l.ctx.Done():
				return
			}
		}
	})
}

// killMidway waits for n accepted updates, SIGKILLs p and stops the load.
func (l *shadowLoad) killMidway(p *process, n int64) {
	require.Eventually(l.t, func() bool { return l.total.Load() >= n }, 60*time.Second, 5*time.Millisecond, "updates flow")
	require.NoError(l.t, p.cmd.Process.Kill()) // SIGKILL in the middle of updates: no Close, no snapshot
	<-p.exited
	p.exited <- nil
	l.stop()
	l.wg.Wait()
	l.t.Logf("%d updates accepted before the SIGKILL", l.total.Load())
}

// check reads every device back through c: the shadow is at least at the
// last accepted version and is the history's last; the history holds
// every version, first seen in order (repeats allowed when repeats is
// set: the JetStream engine's), each the document that was accepted.
func (l *shadowLoad) check(c *client.Client, repeats bool) error {
	for id, docs := range l.accepted {
		msgs, err := c.FindByKey(l.t.Context(), shadow.DefaultTopic, id, core.KeyQuery{Max: 100_000})
		if err != nil {
			return err
		}
		history := map[int64]*shadow.Document{}
		var last int64
		for _, m := range msgs {
			ev, err := shadow.DecodeEvent(m.Body)
			require.NoError(l.t, err)
			if ev.Version <= last && repeats {
				require.Equal(l.t, history[ev.Version], ev.Shadow, "%s: a repeat is the same event", id)
				continue
			}
			if ev.Version != last+1 {
				return fmt.Errorf("%s: version %d after %d in the history", id, ev.Version, last)
			}
			history[ev.Version], last = ev.Shadow, ev.Version
		}
		var top int64
		for _, d := range docs {
			h, ok := history[d.Version]
			if !ok {
				return fmt.Errorf("%s: accepted version %d not in the history (it ends at %d)", id, d.Version, last)
			}
			require.Equal(l.t, d, h, "%s: accepted version %d is in the history as accepted", id, d.Version)
			top = max(top, d.Version)
		}
		cur, err := c.Shadow(l.t.Context(), id)
		if err != nil {
			return err
		}
		require.GreaterOrEqual(l.t, cur.Version, top, "%s: no accepted update lost", id)
		if cur.Version != last {
			return fmt.Errorf("%s: at version %d, the history at %d", id, cur.Version, last)
		}
		require.Equal(l.t, history[cur.Version], cur, "%s: the latest is the history's last", id)
	}
	return nil
}

// TestBinaryKill9ShadowUpdates: `ferrymq serve --flush sync` takes shadow
// updates from both sides at once — backends over the core port (desired)
// and devices over MQTT (reported, $shadow/<id>/update) — and is killed
// with SIGKILL in the middle of them. After a restart every accepted
// update is there: each device's shadow is at least at the last version
// any answer accepted, the topic device-shadows holds every version once,
// in order, each the document that was accepted, and the CLI reads it.
func TestBinaryKill9ShadowUpdates(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	serve := func() (*process, map[string]string) {
		p := startProcess(t, bin, "serve", "--flush", "sync", "--data", filepath.Join(dir, "data"), "--core", "127.0.0.1:0",
			"--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "")
		return p, printedAddrs(t, p, "tcp", "core")
	}
	srv, addrs := serve()
	var devices []string
	for k := range 6 {
		devices = append(devices, fmt.Sprintf("car-%d", k))
	}
	load := newShadowLoad(t)
	load.backend(addrs["core"], 0, devices)
	load.backend(addrs["core"], 1, devices)
	for _, id := range devices {
		load.device(addrs["tcp"], id)
	}
	load.killMidway(srv, 400)

	_, addrs = serve()
	c, err := client.Dial(t.Context(), client.Options{Addr: addrs["core"]})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, load.check(c, false))
	out := cli(t, t.Context(), "", "shadow", "get", "car-0", "--server", addrs["core"])
	require.NoError(t, out.runErr, out.err)
	require.True(t, strings.HasPrefix(out.out, "shadow of car-0: version "), out.out)
	require.Contains(t, out.out, `"reported"`)
}

// TestBinaryKill9ShadowUpdatesNATS: two `ferrymq serve --engine nats`
// nodes on one nats-server (fsync always) take shadow updates of the same
// devices — over the first node's core port and MQTT, the second's admin
// API and MQTT — and the first is SIGKILLed in the middle of them. Every
// update any node accepted is in the shared bucket, and its event in
// device-shadows (the second node repairs the events the first left
// unappended), every version first seen in order.
func TestBinaryKill9ShadowUpdatesNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	ns := natstest.RunServer(t, natstest.SyncAlways())
	nodeA := startNATSNode(t, bin, ns.URL, "node-a", 1)
	addrA := printedAddrsWithin(t, nodeA, 90*time.Second, "tcp", "core") // the first node takes the core lease
	nodeB := startNATSNode(t, bin, ns.URL, "node-b", 1)
	addrB := printedAddrsWithin(t, nodeB, 90*time.Second, "tcp", "http")

	var devices []string
	for k := range 6 {
		devices = append(devices, fmt.Sprintf("car-%d", k))
	}
	load := newShadowLoad(t)
	load.backend(addrA["core"], 0, devices)
	load.httpBackend(addrB["http"], devices)
	for i, id := range devices {
		load.device([]string{addrA["tcp"], addrB["tcp"]}[i%2], id)
	}
	load.killMidway(nodeA, 300)

	core := printedAddrsWithin(t, nodeB, 60*time.Second, "core")["core"] // node-b took the core lease
	c, err := client.Dial(t.Context(), client.Options{Addr: core})
	require.NoError(t, err)
	defer c.Close()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NoError(ct, load.check(c, true))
	}, 30*time.Second, 200*time.Millisecond, "every accepted update and its event, after the repair")
}
