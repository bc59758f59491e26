package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/shadow"
)

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

	const devices = 6
	var mu sync.Mutex
	accepted := map[string][]*shadow.Document{} // what answers accepted, per device
	record := func(id string, d *shadow.Document) {
		mu.Lock()
		accepted[id] = append(accepted[id], d)
		mu.Unlock()
	}
	var total atomic.Int64
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup

	// Backends: desired, over the core port.
	for w := range 2 {
		c, err := client.Dial(t.Context(), client.Options{Addr: addrs["core"], MaxBackoff: 50 * time.Millisecond, RequestTimeout: 5 * time.Second})
		require.NoError(t, err)
		defer c.Close()
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				id := fmt.Sprintf("car-%d", (w+i)%devices)
				d, err := c.UpdateShadow(ctx, id, json.RawMessage(fmt.Sprintf(`{"target":%d,"by":"backend-%d"}`, i, w)), 0)
				if err != nil {
					return // the server is gone
				}
				record(id, d)
				total.Add(1)
			}
		})
	}
	// Devices: reported, over MQTT 3.1.1, each waiting for its answer.
	for k := range devices {
		id := fmt.Sprintf("car-%d", k)
		answers := make(chan []byte, 16)
		o := paho3.NewClientOptions().AddBroker("tcp://" + addrs["tcp"]).SetClientID(id).SetCleanSession(true).
			SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).
			SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) {
				if m.Topic() == "$shadow/"+id+"/update/accepted" {
					answers <- m.Payload()
				}
			})
		mc := paho3.NewClient(o)
		tok := mc.Connect()
		require.True(t, tok.WaitTimeout(10*time.Second))
		require.NoError(t, tok.Error())
		defer mc.Disconnect(0)
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				mc.Publish("$shadow/"+id+"/update", 1, false, fmt.Sprintf(`{"state":{"reported":{"target":%d}}}`, i))
				select {
				case b := <-answers:
					d, err := shadow.DecodeDocument(b)
					if err != nil {
						t.Errorf("%s: accepted answer: %v", id, err)
						return
					}
					record(id, d)
					total.Add(1)
				case <-time.After(2 * time.Second):
					return // the server is gone (or refused: then nothing was accepted)
				case <-ctx.Done():
					return
				}
			}
		})
	}
	require.Eventually(t, func() bool { return total.Load() >= 400 }, 60*time.Second, 5*time.Millisecond, "updates flow")
	require.NoError(t, srv.cmd.Process.Kill()) // SIGKILL in the middle of updates: no Close, no snapshot
	<-srv.exited
	srv.exited <- nil
	stop()
	wg.Wait()
	t.Logf("%d updates accepted before the SIGKILL", total.Load())

	srv, addrs = serve()
	c, err := client.Dial(t.Context(), client.Options{Addr: addrs["core"]})
	require.NoError(t, err)
	defer c.Close()
	for id, docs := range accepted {
		msgs, err := c.FindByKey(t.Context(), shadow.DefaultTopic, id, core.KeyQuery{Max: 100_000})
		require.NoError(t, err)
		history := map[int64]*shadow.Document{}
		for i, m := range msgs {
			ev, err := shadow.DecodeEvent(m.Body)
			require.NoError(t, err)
			require.Equal(t, int64(i+1), ev.Version, "%s: the history holds every version once, in order", id)
			history[ev.Version] = ev.Shadow
		}
		var top int64
		for _, d := range docs {
			require.Equal(t, d, history[d.Version], "%s: accepted version %d is in the history as accepted", id, d.Version)
			top = max(top, d.Version)
		}
		cur, err := c.Shadow(t.Context(), id)
		require.NoError(t, err)
		require.GreaterOrEqual(t, cur.Version, top, "%s: no accepted update lost", id)
		require.Equal(t, history[cur.Version], cur, "%s: the latest is the history's last", id)
		require.Len(t, msgs, int(cur.Version))
	}
	out := cli(t, t.Context(), "", "shadow", "get", "car-0", "--server", addrs["core"])
	require.NoError(t, out.runErr, out.err)
	require.True(t, strings.HasPrefix(out.out, "shadow of car-0: version "), out.out)
	require.Contains(t, out.out, `"reported"`)
}
