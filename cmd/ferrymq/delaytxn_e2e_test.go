package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
)

// TestBinaryKill9DelayedAndTransactions runs `ferrymq serve` (sync flush)
// as a child process, leaves delayed messages pending (one cancelled) and
// two transactions between half message and commit, and kills the server
// with SIGKILL. After a restart on the same folder, past the delays' due
// time: every delayed message arrives except the cancelled one, and a
// producer of the group that reconnects answers the check-backs — the
// half it commits arrives once, the one it rolls back never.
func TestBinaryKill9DelayedAndTransactions(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ferrymq.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(`flush: sync
transactions: {first_check: 300ms, check_interval: 300ms, max_checks: 10}
`), 0o644))
	serve := func() (*process, string) {
		p := startProcess(t, bin, "serve", "--config", cfg, "--data", filepath.Join(dir, "data"), "--core", "127.0.0.1:0",
			"--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "")
		var addr string
		require.Eventually(t, func() bool {
			for _, l := range nonEmptyLines(p.out.String()) {
				if rest, ok := strings.CutPrefix(l, "core "); ok {
					addr = strings.TrimSpace(rest)
					return true
				}
			}
			return false
		}, 20*time.Second, 10*time.Millisecond, "serve prints its core address")
		return p, addr
	}
	dial := func(addr string) *client.Client {
		c, err := client.Dial(t.Context(), client.Options{Addr: addr})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	srv, addr := serve()
	c := dial(addr)
	due := time.Now().Add(3 * time.Second)
	p := c.NewProducer()
	var ids []core.MessageID
	for i := range 20 {
		res, err := p.Send(t.Context(), &core.Message{Topic: "jobs", ShardingKey: "k", Body: []byte{'a' + byte(i)}, DeliverAt: due})
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	_, err := c.CancelDelayed(t.Context(), ids[7])
	require.NoError(t, err)

	var checked atomic.Int32
	tp, err := c.NewTransactionProducer(t.Context(), "orders-svc", func(context.Context, *core.StoredMessage) client.TxnAction {
		checked.Add(1)
		return client.Unknown // the local transaction is still running
	})
	require.NoError(t, err)
	commitMe, err := tp.SendHalf(t.Context(), &core.Message{Topic: "orders", ShardingKey: "cart-1", Body: []byte("order placed")})
	require.NoError(t, err)
	_, err = tp.SendHalf(t.Context(), &core.Message{Topic: "orders", ShardingKey: "cart-2", Body: []byte("order failed")})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return checked.Load() >= 2 }, 10*time.Second, 10*time.Millisecond, "checked back before the crash")
	require.True(t, time.Now().Before(due), "too slow: the delays came due before the kill")

	require.NoError(t, srv.cmd.Process.Kill()) // SIGKILL
	<-srv.exited
	srv.exited <- nil
	_ = c.Close()
	time.Sleep(time.Until(due)) // down while the delays come due on the real clock: the scenario, not a wait

	_, addr = serve()
	c = dial(addr)
	tp, err = c.NewTransactionProducer(t.Context(), "orders-svc", func(_ context.Context, half *core.StoredMessage) client.TxnAction {
		if string(half.Body) == "order placed" {
			return client.Commit
		}
		return client.Rollback
	})
	require.NoError(t, err)
	defer tp.Close()

	read := func(topic string) []*core.StoredMessage {
		info, err := c.Topic(t.Context(), topic)
		if err != nil {
			return nil
		}
		var out []*core.StoredMessage
		for q := range info.Queues {
			res, err := c.Pull(t.Context(), topic, q, 0, 100, 0)
			require.NoError(t, err)
			out = append(out, res.Messages...)
		}
		return out
	}
	require.Eventually(t, func() bool { return len(read("jobs")) >= 19 }, 15*time.Second, 20*time.Millisecond)
	seen := map[string]int{}
	for _, m := range read("jobs") {
		seen[string(m.Body)]++
		require.False(t, m.StoredAt.Before(due), "delivered early")
	}
	require.Len(t, seen, 19)
	require.Zero(t, seen["h"], "the cancelled message was delivered")

	require.Eventually(t, func() bool {
		pending, err := c.PendingTransactions(t.Context())
		return err == nil && len(pending) == 0
	}, 15*time.Second, 20*time.Millisecond, "both transactions resolved by check-back")
	orders := read("orders")
	require.Len(t, orders, 1)
	require.Equal(t, "order placed", string(orders[0].Body))
	require.Equal(t, commitMe.ID.String(), orders[0].Properties["txn.half_id"])
}
