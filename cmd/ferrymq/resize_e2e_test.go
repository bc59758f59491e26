package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/brokertest"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// TestBinaryKill9ResizeKeepsKeyOrder is issue #21's test on the real binary
// (`serve --flush sync`): 1,000 keys produced by 16 producers (each key in
// sequence: the next only once the last was acknowledged; a failed send is
// sent again), an orderly and a concurrent group of two members each
// consuming over the wire, the topic grown 8 → 16 and shrunk 16 → 4
// mid-stream, and the server killed with SIGKILL at a random moment and
// started again on the same data. Every acknowledged message reaches both
// groups, and the orderly group never gets a key's message before an
// earlier one of that key. The moment is logged with its seed;
// RESIZE_KILL_AT=N kills after N acknowledged messages instead (3500 falls
// between the two resizes, 1000 before both).
func TestBinaryKill9ResizeKeepsKeyOrder(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	ports, err := freePorts(3)
	require.NoError(t, err)
	addr := func(i int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i])) }
	cfg := filepath.Join(dir, "ferrymq.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("flush: sync\n"), 0o644))
	runResizeKill9(t, func() (*process, string) {
		p := startProcess(t, bin, "serve", "--config", cfg, "--data", filepath.Join(dir, "data"),
			"--core", addr(0), "--http", addr(1), "--mqtt", addr(2), "--ws", "")
		printedAddrs(t, p, "core")
		return p, addr(0)
	})
}

// runResizeKill9 is the scenario of TestBinaryKill9ResizeKeepsKeyOrder
// against the server serve starts (again after the kill, on the same data
// and address, which it returns).
func runResizeKill9(t *testing.T, serve func() (*process, string)) {
	const (
		topic    = "elastic"
		keys     = 1000
		rounds   = 8
		senders  = 16
		total    = keys * rounds
		growAt   = total * 3 / 10
		shrinkAt = total * 6 / 10
	)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 21))
	killAt := int64(total/10 + rng.IntN(total*8/10))
	if v, err := strconv.Atoi(os.Getenv("RESIZE_KILL_AT")); err == nil {
		killAt = int64(v)
	}
	t.Logf("seed %d: SIGKILL after %d of %d acknowledged", seed, killAt, total)

	srv, addr := serve()
	ctx := t.Context()
	c, err := client.Dial(ctx, client.Options{Addr: addr, ClientID: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.CreateTopic(ctx, topic, 8)
	require.NoError(t, err)

	orderly, concurrent := brokertest.NewKeyOrder(), brokertest.NewKeyOrder()
	var clog syncBuffer
	logger := zerolog.New(&clog).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	sub := []group.Subscription{{Topic: topic}}
	var consumers []*consumer.PushConsumer
	for i, o := range []consumer.Options{
		{Group: "ord", ClientID: "o1", Orderly: true},
		{Group: "ord", ClientID: "o2", Orderly: true},
		{Group: "conc", ClientID: "c1"},
		{Group: "conc", ClientID: "c2"},
	} {
		d := orderly
		if o.Group == "conc" {
			d = concurrent
		}
		o.Subscriptions = sub
		o.Logger = &logger
		o.HeartbeatInterval = 200 * time.Millisecond
		o.PollWait = time.Second
		o.CommitInterval = 50 * time.Millisecond
		o.Listener = func(ctx context.Context, m *core.StoredMessage) consumer.Result {
			d.Add(m)
			time.Sleep(50 * time.Microsecond) // the scenario: consumers a little behind the producers
			return consumer.Success
		}
		cc, err := client.Dial(ctx, client.Options{Addr: addr, ClientID: fmt.Sprintf("consumer-%d", i)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = cc.Close() })
		pc, err := cc.NewPushConsumer(o)
		require.NoError(t, err)
		require.NoError(t, pc.Start(ctx))
		consumers = append(consumers, pc)
	}
	t.Cleanup(func() {
		for _, pc := range consumers {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = pc.Close(cctx)
			cancel()
		}
	})

	var acked, failed atomic.Int64
	var wg sync.WaitGroup
	prodCtx, stop := context.WithTimeout(ctx, 3*time.Minute)
	defer stop()
	for s := range senders {
		wg.Go(func() {
			p := c.NewProducer()
			for round := range rounds {
				for k := s; k < keys; k += senders {
					key := "car-" + strconv.Itoa(k)
					m := &core.Message{Topic: topic, ShardingKey: key, Body: []byte(key + "/" + strconv.Itoa(round))}
					for {
						if _, err := p.Send(prodCtx, m); err == nil {
							break
						} else if prodCtx.Err() != nil {
							return
						}
						failed.Add(1) // the server is down: the same message again
						time.Sleep(20 * time.Millisecond)
					}
					acked.Add(1)
				}
			}
		})
	}

	began := time.Now()
	resized := 0
	killed := false
	for acked.Load() < total && prodCtx.Err() == nil {
		n := acked.Load()
		switch {
		case resized == 0 && n >= growAt:
			info, err := c.ResizeTopic(ctx, topic, 16)
			if err == nil {
				require.Equal(t, 16, info.Queues)
				resized++
			}
		case resized == 1 && n >= shrinkAt:
			info, err := c.ResizeTopic(ctx, topic, 4)
			if err == nil {
				require.Equal(t, 4, info.Queues)
				resized++
			}
		}
		if !killed && n >= killAt {
			require.NoError(t, srv.cmd.Process.Kill()) // SIGKILL: no Close, no final flush
			<-srv.exited
			srv.exited <- nil
			killed = true
			srv, _ = serve()
			t.Logf("%v: killed and restarted at %d acknowledged", time.Since(began), n)
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	require.EqualValues(t, total, acked.Load(), "every message acknowledged in the end")
	require.True(t, killed)
	require.Equal(t, 2, resized)
	t.Logf("%v: all acknowledged; %d sends failed while the server was down", time.Since(began), failed.Load())

	defer func() {
		if t.Failed() {
			for _, g := range []string{"ord", "conc"} {
				lag, err := c.Lag(context.Background(), g, "")
				t.Logf("lag of %s (%v):", g, err)
				for _, l := range lag {
					t.Logf("  %s/%d committed %d range %d-%d lag %d owner %s", l.Topic, l.Queue, l.Committed, l.Min, l.Max, l.Lag, l.Owner)
				}
			}
			groups, err := c.Groups(context.Background())
			t.Logf("groups (%v):", err)
			for _, g := range groups {
				for _, m := range g.Members {
					t.Logf("  %s %s %v", g.Group, m.ClientID, m.Queues)
				}
			}
			t.Logf("consumer log:\n%s", tail(clog.String(), 6000))
			t.Logf("server stderr:\n%s", tail(srv.errOut.String(), 4000))
		}
	}()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for name, d := range map[string]*brokertest.KeyOrder{"orderly": orderly, "concurrent": concurrent} {
			distinct, _, _ := d.Counts()
			assert.Equal(c, total, distinct, "%s group: distinct acknowledged messages delivered", name)
		}
	}, 30*time.Second, 100*time.Millisecond)
	_, dupO, violation := orderly.Counts()
	_, dupC, _ := concurrent.Counts()
	t.Logf("%v: all delivered; deliveries: orderly %d, concurrent %d, for %d messages", time.Since(began), dupO, dupC, total)
	require.Empty(t, violation, "orderly group: a key out of order")

	info, err := c.Topic(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, 4, info.Queues)
	require.Len(t, info.Epochs, 3)
	for _, pc := range consumers {
		require.NoError(t, pc.Close(ctx))
	}
	srv.interrupt(t)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestBinaryNATSKill9ResizeKeepsKeyOrder is the same scenario through the
// JetStream engine: `ferrymq serve --engine nats` on a real nats-server
// (in this process, so it outlives the kill) is killed with SIGKILL at a
// random moment and started again; the topic's epochs live in its stream.
func TestBinaryNATSKill9ResizeKeepsKeyOrder(t *testing.T) {
	bin := buildBinary(t)
	ns := natstest.RunServer(t, natstest.SyncAlways())
	ports, err := freePorts(3)
	require.NoError(t, err)
	addr := func(i int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i])) }
	cfg := natsConfigFile(t, ns.URL, "n1", 1)
	data := filepath.Join(t.TempDir(), "n1")
	runResizeKill9(t, func() (*process, string) {
		p := startProcess(t, bin, "serve", "--config", cfg, "--data", data,
			"--core", addr(0), "--http", addr(1), "--mqtt", addr(2), "--ws", "")
		// Every node serves the core port from its start (produce goes on
		// at once); the consumer groups wait for the core lease of the
		// killed incarnation to expire (lease_ttl 3 s).
		printedAddrsWithin(t, p, time.Minute, "tcp")
		return p, addr(0)
	})
}
