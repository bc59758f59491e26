package client_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/server"
	"github.com/ferrymq/ferrymq/core/server/servertest"
)

// frontNode starts a second real server over b's store, as another node of
// a cluster would be: it serves produce, reads and topics itself, the
// consumer group "near" with services of its own, and names node b for
// every other shard (server.Options.Placement). moved counts its CodeMoved
// answers.
func frontNode(t *testing.T, b *servertest.Env, moved *atomic.Int64) string {
	t.Helper()
	return frontNodeNaming(t, b, moved, func(string) (string, string) { return "b", b.Addr })
}

// frontNodeNaming is frontNode whose CodeMoved answers name the node name
// returns for a shard.
func frontNodeNaming(t *testing.T, b *servertest.Env, moved *atomic.Int64, name func(shard string) (node, addr string)) string {
	t.Helper()
	gc, err := group.New(b.Store, group.Options{})
	require.NoError(t, err)
	gc.Start()
	rs, err := retry.New(b.Store, retry.Options{Schedule: b.Retry.Schedule(), MaxAttempts: b.Retry.MaxAttempts()}) // its schedulers are b's: not started here
	require.NoError(t, err)
	ps, err := pop.New(b.Store, rs, pop.Options{})
	require.NoError(t, err)
	ps.Start()
	srv, err := server.New(server.Options{Addr: "127.0.0.1:0", Broker: b.Store, Groups: gc, Retry: rs, Pop: ps,
		Placement: func(_ context.Context, shard string) (server.Route, error) {
			if shard == "near" {
				return server.Route{Here: true}, nil
			}
			moved.Add(1)
			node, addr := name(shard)
			return server.Route{Node: node, Addr: addr}, nil
		}})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = ps.Close()
		_ = rs.Close()
		_ = gc.Close()
	})
	return srv.Addr().String()
}

// TestMovedShardsAreFollowed: a client given one node's address produces
// there, and consumes — push and POP — a group another node serves, lists
// and measures it, and sends transactional messages (served by the other
// node, check-backs included), following the CodeMoved answers: no error
// reaches the application, and the shard's later requests go straight to
// the node that serves it (few moved answers). A group the first node
// serves stays there.
func TestMovedShardsAreFollowed(t *testing.T) {
	ctx := t.Context()
	b := servertest.Start(t, servertest.Options{})
	var moved atomic.Int64
	a := frontNode(t, b, &moved)
	c := dial(t, a)
	_, err := c.CreateTopic(ctx, "orders", 2)
	require.NoError(t, err)
	const n = 40
	for i := range n {
		_, err := c.NewProducer().Send(ctx, &core.Message{Topic: "orders", ShardingKey: string(rune('a' + i%5)), Body: []byte{byte(i)}})
		require.NoError(t, err)
	}
	require.Zero(t, moved.Load(), "produce and topics are served by any node")

	consume := func(grp string) int {
		t.Helper()
		var got atomic.Int64
		pc, err := c.NewPushConsumer(consumer.Options{Group: grp, Subscriptions: []group.Subscription{{Topic: "orders"}},
			HeartbeatInterval: 50 * time.Millisecond, PollWait: 200 * time.Millisecond, CommitInterval: 10 * time.Millisecond,
			Listener: func(context.Context, *core.StoredMessage) consumer.Result {
				got.Add(1)
				return consumer.Success
			}})
		require.NoError(t, err)
		require.NoError(t, pc.Start(ctx))
		require.Eventually(t, func() bool { return got.Load() >= n }, 20*time.Second, 10*time.Millisecond)
		lag, err := c.Lag(ctx, grp, "")
		require.NoError(t, err)
		require.NotEmpty(t, lag)
		require.NoError(t, pc.Close(ctx))
		return int(got.Load())
	}
	before := moved.Load()
	require.GreaterOrEqual(t, consume("near"), n)
	require.Equal(t, before, moved.Load(), "the group served by the first node stays there")
	for q := range 2 {
		_, err := b.Store.CommittedOffset(ctx, "near", "orders", q)
		require.NoError(t, err)
	}

	require.GreaterOrEqual(t, consume("far"), n)
	require.Less(t, moved.Load()-before, int64(10), "after the first answers the group's requests go to node b directly")
	for q := range 2 {
		off, err := b.Store.CommittedOffset(ctx, "far", "orders", q)
		require.NoError(t, err)
		info, err := b.Store.Topic(ctx, "orders")
		require.NoError(t, err)
		require.Equal(t, info.Ranges[q].Max, off, "committed through node b")
	}

	// POP through the first node's address.
	sc := c.NewSimpleConsumer("far-pop", "orders")
	popped := 0
	require.Eventually(t, func() bool {
		got, err := sc.Receive(ctx, 16, 100*time.Millisecond)
		require.NoError(t, err)
		for _, r := range got {
			require.NoError(t, sc.Ack(ctx, r.Handle))
		}
		popped += len(got)
		return popped >= n
	}, 20*time.Second, time.Millisecond)

	// Transactions: served by node b; its check-back reaches the producer.
	var checked atomic.Int64
	p, err := c.NewTransactionProducer(ctx, "tx", func(context.Context, *core.StoredMessage) client.TxnAction {
		checked.Add(1)
		return client.Commit
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	res, err := p.SendHalf(ctx, &core.Message{Topic: "orders", Body: []byte("half")})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return checked.Load() > 0 }, 10*time.Second, 10*time.Millisecond,
		"node b's check-back reached the producer through the connection the client made to it")
	_, err = b.Store.Get(ctx, res.ID)
	require.NoError(t, err)
}

// TestMovedToADeadNodeIsAskedAgain: the first node names, for a while, a
// node that is gone (as the cluster does until a dead node's leases
// expire), then the live one: the client does not fail the request, it
// asks again after a pause and is served where the shard went.
func TestMovedToADeadNodeIsAskedAgain(t *testing.T) {
	ctx := t.Context()
	b := servertest.Start(t, servertest.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	var moved atomic.Int64
	a := frontNodeNaming(t, b, &moved, func(string) (string, string) {
		if moved.Load() <= 3 {
			return "gone", dead
		}
		return "b", b.Addr
	})
	c := dial(t, a)
	_, err = c.CreateTopic(ctx, "orders", 1)
	require.NoError(t, err)
	_, err = c.NewProducer().Send(ctx, &core.Message{Topic: "orders", Body: []byte("x")})
	require.NoError(t, err)
	got, err := c.NewSimpleConsumer("far", "orders").Receive(ctx, 1, time.Second)
	require.NoError(t, err, "served once the shard was named on a live node")
	require.Len(t, got, 1)
	require.Greater(t, moved.Load(), int64(3), "asked again while the named node was gone")
}
