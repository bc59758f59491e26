package client_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/server/servertest"
)

// stored counts a topic's messages on one server, per sharding key.
func stored(t *testing.T, env *servertest.Env, topic string) map[string]int {
	t.Helper()
	out := map[string]int{}
	info, err := env.Store.Topic(t.Context(), topic)
	if err != nil {
		return out
	}
	for q, r := range info.Ranges {
		for off := r.Min; off < r.Max; {
			res, err := env.Store.Read(t.Context(), core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 256})
			require.NoError(t, err)
			for _, m := range res.Messages {
				out[m.ShardingKey]++
			}
			off = res.NextOffset
		}
	}
	return out
}

type transitions struct {
	mu  sync.Mutex
	log []string
}

func (tr *transitions) add(addr string, from, to client.BreakerState) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.log = append(tr.log, fmt.Sprintf("%s %s→%s", addr, from, to))
}

func (tr *transitions) String() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.log, "; ")
}

func (tr *transitions) of(addr string) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []string
	for _, l := range tr.log {
		if a, change, _ := strings.Cut(l, " "); a == addr {
			out = append(out, change)
		}
	}
	return out
}

// TestClusterIsolatesAFaultyNode: three real servers (the faults are
// injected in one's broker: servertest.Faults), one of which first
// fails every produce (its store refuses writes), then stalls, then heals.
// No send fails for the application; the faulty node's breaker opens and
// it gets no traffic while open, its probes fail while it is faulty, and
// it is readmitted — and takes its keys' messages again — once it is
// healthy. Every message is stored on some node.
func TestClusterIsolatesAFaultyNode(t *testing.T) {
	a := servertest.Start(t, servertest.Options{})
	b := servertest.Start(t, servertest.Options{})
	fb := &servertest.Faults{}
	c := servertest.Start(t, servertest.Options{ServerBroker: fb.Wrap})
	t.Cleanup(func() { fb.Set(servertest.Healthy) }) // release what a stall holds before the servers stop

	var tr transitions
	cl, err := client.DialCluster(t.Context(), client.ClusterOptions{Addrs: []string{a.Addr, b.Addr, c.Addr},
		Breaker:        client.BreakerOptions{Window: 2 * time.Second, MinCalls: 3, OpenFor: 200 * time.Millisecond, MaxOpenFor: 400 * time.Millisecond},
		AttemptTimeout: 300 * time.Millisecond, OnStateChange: tr.add})
	require.NoError(t, err)
	defer cl.Close()
	status := func() client.NodeStatus { return cl.Nodes()[2] }

	sent := map[string]int{}
	seq := 0
	send := func(phase string, n int) {
		for range n {
			seq++
			key := fmt.Sprintf("dev-%d", seq%30)
			_, err := cl.Send(t.Context(), &core.Message{Topic: "cars", ShardingKey: key, Body: []byte(phase)})
			require.NoError(t, err, "%s: send %d failed for the application", phase, seq)
			sent[key]++
		}
	}

	// Healthy: all three take traffic.
	send("healthy", 60)
	require.Positive(t, status().Sent, "the third node takes its keys")

	// Its store fails: the sends go elsewhere, its breaker opens.
	fb.Set(servertest.FailProduce)
	send("failing", 60)
	require.Equal(t, []string{"closed→open"}, tr.of(c.Addr), "%v", &tr)
	failed := status().Failed
	require.GreaterOrEqual(t, failed, int64(3), "it opened after MinCalls failures")
	send("while open", 30) // within the pause: not one try
	require.Equal(t, failed, status().Failed, "an open node gets no traffic")

	// It stalls: a probe after the pause times out and opens it again.
	fb.Set(servertest.StallProduce)
	require.Eventually(t, func() bool {
		send("stalling", 5)
		ch := tr.of(c.Addr)
		return len(ch) >= 3 && ch[len(ch)-1] == "half-open→open"
	}, 10*time.Second, 10*time.Millisecond, "a stalled probe reopens the breaker: %v", &tr)

	// Healthy again: a probe succeeds and it is readmitted.
	fb.Set(servertest.Healthy)
	require.Eventually(t, func() bool {
		send("healed", 5)
		return status().State == client.BreakerClosed
	}, 10*time.Second, 10*time.Millisecond, "readmitted")
	before := stored(t, c, "cars")
	send("readmitted", 60)
	after := stored(t, c, "cars")
	total := func(m map[string]int) (n int) {
		for _, v := range m {
			n += v
		}
		return n
	}
	require.Greater(t, total(after), total(before), "the readmitted node takes its keys' messages again")

	// Every message acknowledged is stored somewhere (a try that timed out
	// may have landed too: at least once).
	got := map[string]int{}
	for _, env := range []*servertest.Env{a, b, c} {
		for k, n := range stored(t, env, "cars") {
			got[k] += n
		}
	}
	for k, n := range sent {
		require.GreaterOrEqual(t, got[k], n, "key %s", k)
	}
	require.Positive(t, status().Changes[client.BreakerOpen])
}

// A node that is down when the Cluster is made is dialled in the
// background: the Cluster works with the others, the node's breaker opens,
// and once the node is up it is connected and readmitted. A send refused
// for the message's own fault fails at once, with no try elsewhere and no
// mark against the node.
func TestClusterNodeDownAtStart(t *testing.T) {
	a := servertest.Start(t, servertest.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now

	var tr transitions
	cl, err := client.DialCluster(t.Context(), client.ClusterOptions{Addrs: []string{a.Addr, down},
		Client:         client.Options{DialTimeout: 200 * time.Millisecond, MaxBackoff: 100 * time.Millisecond},
		Breaker:        client.BreakerOptions{Window: 2 * time.Second, MinCalls: 2, OpenFor: 100 * time.Millisecond, MaxOpenFor: 100 * time.Millisecond},
		AttemptTimeout: 200 * time.Millisecond, OnStateChange: tr.add})
	require.NoError(t, err)
	defer cl.Close()
	require.False(t, cl.Nodes()[1].Connected)

	for i := range 40 {
		_, err := cl.Send(t.Context(), &core.Message{Topic: "t", ShardingKey: fmt.Sprint(i), Body: []byte("x")})
		require.NoError(t, err)
	}
	require.Contains(t, tr.of(down), "closed→open")

	// The node comes up on its address.
	d := servertest.Start(t, servertest.Options{Addr: down})
	require.Eventually(t, func() bool { return cl.Nodes()[1].Connected }, 10*time.Second, 10*time.Millisecond)
	k := 0
	require.Eventually(t, func() bool { // keys that rank it first probe it once its pause is over
		k++
		_, err := cl.Send(t.Context(), &core.Message{Topic: "t", ShardingKey: fmt.Sprint(k), Body: []byte("x")})
		require.NoError(t, err)
		return cl.Nodes()[1].State == client.BreakerClosed
	}, 10*time.Second, 10*time.Millisecond)
	for i := range 40 {
		_, err := cl.Send(t.Context(), &core.Message{Topic: "t", ShardingKey: fmt.Sprint(i), Body: []byte("x")})
		require.NoError(t, err)
	}
	require.NotEmpty(t, stored(t, d, "t"), "the node that came up takes messages")

	before := cl.Nodes()
	_, err = cl.Send(t.Context(), &core.Message{Topic: "bad topic!", Body: []byte("x")})
	require.ErrorIs(t, err, core.ErrInvalidTopic)
	after := cl.Nodes()
	for i := range before {
		require.Equal(t, before[i].Failed, after[i].Failed, "a bad request is not the node's fault")
	}
	require.Equal(t, before[0].Sent+before[1].Sent+1, after[0].Sent+after[1].Sent, "one try, not three")
}

// DialCluster with no node reachable fails with each node's error; ctx
// bounds it.
func TestDialClusterNoNode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err = client.DialCluster(ctx, client.ClusterOptions{Addrs: []string{addr}, Client: client.Options{DialTimeout: 100 * time.Millisecond}})
	require.ErrorContains(t, err, "no node answered")
	require.ErrorContains(t, err, addr)
	_, err = client.DialCluster(ctx, client.ClusterOptions{})
	require.Error(t, err)
}

// TestClusterSendAsync: async sends through three real servers while one
// stalls (it takes the sends and never answers): every send is answered
// without error, no caller is held past the tries, the stalled node's
// breaker opens, and every message is stored on a node that answered; a
// key's messages keep their order on their node while it is healthy.
func TestClusterSendAsync(t *testing.T) {
	a := servertest.Start(t, servertest.Options{})
	b := servertest.Start(t, servertest.Options{})
	fb := &servertest.Faults{}
	c := servertest.Start(t, servertest.Options{ServerBroker: fb.Wrap})
	t.Cleanup(func() { fb.Set(servertest.Healthy) })

	var tr transitions
	cl, err := client.DialCluster(t.Context(), client.ClusterOptions{Addrs: []string{a.Addr, b.Addr, c.Addr},
		Breaker:        client.BreakerOptions{MinCalls: 3, OpenFor: time.Minute},
		AttemptTimeout: 300 * time.Millisecond, OnStateChange: tr.add})
	require.NoError(t, err)
	defer cl.Close()

	send := func(n int, body string) {
		var wg sync.WaitGroup
		var failed atomic.Int32
		for i := range n {
			wg.Add(1)
			cl.SendAsync(t.Context(), &core.Message{Topic: "cars", ShardingKey: fmt.Sprintf("car-%d", i%20), Body: []byte(fmt.Sprintf("%s %d", body, i))},
				func(_ core.SendResult, err error) {
					if err != nil {
						t.Errorf("send %d: %v", i, err)
						failed.Add(1)
					}
					wg.Done()
				})
		}
		wg.Wait()
		require.Zero(t, failed.Load())
	}
	send(200, "healthy")
	require.Positive(t, cl.Nodes()[2].Sent)

	fb.Set(servertest.StallProduce)
	start := time.Now()
	send(200, "stalled")
	require.Less(t, time.Since(start), 10*time.Second, "the stalled node held nobody for long")
	require.Contains(t, tr.of(c.Addr), "closed→open")
	require.Equal(t, client.BreakerOpen, cl.Nodes()[2].State)

	// Order per key on the healthy nodes: each key's messages in the
	// order sent, within each phase.
	for _, env := range []*servertest.Env{a, b} {
		info, err := env.Store.Topic(t.Context(), "cars")
		require.NoError(t, err)
		last := map[string]int{}
		for q, r := range info.Ranges {
			res, err := env.Store.Read(t.Context(), core.ReadRequest{Topic: "cars", Queue: q, Offset: r.Min, MaxCount: 1000})
			require.NoError(t, err)
			for _, m := range res.Messages {
				var phase string
				var i int
				_, err := fmt.Sscanf(string(m.Body), "%s %d", &phase, &i)
				require.NoError(t, err)
				k := phase + "/" + m.ShardingKey
				if phase == "healthy" {
					require.Greater(t, i, last[k]-1, "key %s out of order", k)
				}
				last[k] = i
			}
		}
	}
}

// A node that goes away under a Cluster is passed over at once while its
// connection is being re-established: with a try timeout of an hour, sends
// still complete (on the other node) — a try that waited for the
// reconnect would hold the test until its deadline.
func TestClusterNodeGoneIsPassedOver(t *testing.T) {
	a := servertest.Start(t, servertest.Options{})
	b := servertest.Start(t, servertest.Options{})
	cl, err := client.DialCluster(t.Context(), client.ClusterOptions{Addrs: []string{a.Addr, b.Addr},
		Client: client.Options{MaxBackoff: 50 * time.Millisecond}, AttemptTimeout: time.Hour})
	require.NoError(t, err)
	defer cl.Close()
	b.Stop()
	require.Eventually(t, func() bool { return !cl.Nodes()[1].Connected || cl.Nodes()[1].Failed > 0 }, 10*time.Second, time.Millisecond)
	for i := range 40 {
		_, err := cl.Send(t.Context(), &core.Message{Topic: "t", ShardingKey: fmt.Sprint(i), Body: []byte("x")})
		require.NoError(t, err)
		done := make(chan error, 1)
		cl.SendAsync(t.Context(), &core.Message{Topic: "t", ShardingKey: fmt.Sprint(i), Body: []byte("y")},
			func(_ core.SendResult, err error) { done <- err })
		require.NoError(t, <-done)
	}
	require.Len(t, stored(t, a, "t"), 40, "every key on the node that stayed")
	require.Positive(t, cl.Nodes()[1].Failed)
}
