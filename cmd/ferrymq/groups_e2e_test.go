package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/rendezvous"
)

// groupLog records one consumer group's deliveries.
type groupLog struct {
	mu    sync.Mutex
	seen  map[string]int // body → deliveries
	times []time.Time    // every delivery's time
}

func (l *groupLog) add(body string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen[body]++
	l.times = append(l.times, time.Now())
}

// missing counts the bodies of acked not delivered yet.
func (l *groupLog) missing(acked []string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, b := range acked {
		if l.seen[b] == 0 {
			n++
		}
	}
	return n
}

// gapAfter is the longest pause between deliveries after t.
func (l *groupLog) gapAfter(t time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var gap time.Duration
	last := t
	for _, at := range l.times {
		if at.After(t) {
			gap = max(gap, at.Sub(last))
			last = at
		}
	}
	return gap
}

// Three `ferrymq serve --engine nats` nodes on one nats-server; six
// consumer groups, consumed through node-a's address while a producer
// sends without pause. node-b — serving the groups rendezvous hashing
// places on it — is SIGKILLed: its groups' leases expire (lease_ttl 3 s),
// the nodes left take them (by rendezvous over themselves) and every
// acknowledged message reaches every group; what was delivered and not
// committed when node-b died is delivered again (logged with the pause
// each group saw).
func TestBinaryNATSNodeKilledUnderConsumption(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	ns := natstest.RunServer(t, natstest.SyncAlways())
	names := []string{"node-a", "node-b", "node-c"}
	ports, err := freePorts(len(names))
	require.NoError(t, err)
	procs := map[string]*process{}
	cores := map[string]string{}
	for i, name := range names {
		cores[name] = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i]))
		procs[name] = startServe(t, bin, "--config", natsConfigFile(t, ns.URL, name, 1), "--data", filepath.Join(t.TempDir(), name),
			"--core", cores[name])
		printedAddrsWithin(t, procs[name], 90*time.Second, "tcp")
	}
	ctx := t.Context()
	c, err := client.Dial(ctx, client.Options{Addr: cores["node-a"], MaxBackoff: 100 * time.Millisecond, RequestTimeout: 10 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	require.Eventually(t, func() bool {
		info, err := c.Cluster(ctx)
		return err == nil && len(info.Nodes) == len(names)
	}, 30*time.Second, 50*time.Millisecond, "every node's liveness lease seen")
	_, err = c.CreateTopic(ctx, "orders", 4)
	require.NoError(t, err)

	groups := []string{"billing", "audit", "fraud", "search", "metrics", "archive"}
	logs := map[string]*groupLog{}
	onVictim := 0
	for _, g := range groups {
		if rendezvous.Pick(names, g) == "node-b" {
			onVictim++
		}
		l := &groupLog{seen: map[string]int{}}
		logs[g] = l
		pc, err := c.NewPushConsumer(consumer.Options{Group: g, Subscriptions: []group.Subscription{{Topic: "orders"}},
			HeartbeatInterval: 200 * time.Millisecond, PollWait: 500 * time.Millisecond, CommitInterval: 50 * time.Millisecond,
			Listener: func(_ context.Context, m *core.StoredMessage) consumer.Result {
				l.add(string(m.Body))
				return consumer.Success
			}})
		require.NoError(t, err)
		require.NoError(t, pc.Start(ctx))
		defer func() { _ = pc.Close(context.Background()) }()
	}
	require.Positive(t, onVictim, "some group is placed on node-b")

	var mu sync.Mutex
	var acked []string
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		p := c.NewProducer()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			body := strconv.Itoa(i)
			if _, err := p.Send(ctx, &core.Message{Topic: "orders", ShardingKey: fmt.Sprintf("car-%d", i%50), Body: []byte(body)}); err == nil {
				mu.Lock()
				acked = append(acked, body)
				mu.Unlock()
			}
		}
	}()
	time.Sleep(2 * time.Second)
	killedAt := time.Now()
	require.NoError(t, procs["node-b"].cmd.Process.Kill())
	time.Sleep(6 * time.Second) // lease_ttl 3 s, and some
	close(stop)
	<-done
	mu.Lock()
	sent := append([]string(nil), acked...)
	mu.Unlock()
	require.NotEmpty(t, sent)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		for _, g := range groups {
			assert.Zero(ct, logs[g].missing(sent), "group %s: acknowledged messages not delivered", g)
		}
	}, 60*time.Second, 100*time.Millisecond)
	info, err := c.Cluster(ctx)
	require.NoError(t, err)
	for _, g := range groups {
		l := logs[g]
		l.mu.Lock()
		deliveries := len(l.times)
		l.mu.Unlock()
		moved := rendezvous.Pick(names, g) == "node-b"
		if moved {
			require.Equal(t, rendezvous.Pick([]string{"node-a", "node-c"}, g), info.Groups[g], "group %s moved by rendezvous over the nodes left", g)
		}
		t.Logf("group %-8s on node-b: %-5v now on %s; %d acknowledged, %d deliveries (%d again); longest pause after the kill %v",
			g, moved, info.Groups[g], len(sent), deliveries, deliveries-len(sent), l.gapAfter(killedAt).Round(time.Millisecond))
	}

	// The CLI given one address: a new group placed on node-a, consumed
	// through node-c (the client follows the Moved answer), and the
	// cluster's view with each group's node.
	cli := "cli"
	for rendezvous.Pick([]string{"node-a", "node-c"}, cli) != "node-a" {
		cli += "x"
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, bin, "consume", "--server", cores["node-c"], "--topic", "orders", "--group", cli,
		"--count", strconv.Itoa(len(sent)), "--json").Output()
	require.NoError(t, err, "%s", out)
	require.Len(t, strings.Split(strings.TrimSpace(string(out)), "\n"), len(sent))
	out, err = exec.CommandContext(cctx, bin, "nodes", "--server", cores["node-c"]).Output()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `node-a +127\.0\.0\.1:\d+ +\S*.*`+cli, string(out), "the CLI's view names the group's node")
}
