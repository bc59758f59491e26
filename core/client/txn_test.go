package client_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/core/wire"
)

// Check timings of servertest: first check-back 200 ms after the half, then
// every 200 ms, 3 in all. quiet is how long a test watches for something
// that must not happen: five check intervals.
const (
	checkEvery = 200 * time.Millisecond
	quiet      = 5 * checkEvery
)

// txnTopic creates a one-queue topic, so that everything committed to it
// is read from queue 0.
func txnTopic(t testing.TB, c *client.Client, name string) string {
	t.Helper()
	_, err := c.CreateTopic(t.Context(), name, 1)
	require.NoError(t, err)
	return name
}

// readTopic returns the messages of a one-queue topic, read over the wire.
func readTopic(ctx context.Context, c *client.Client, topic string) ([]*core.StoredMessage, error) {
	res, err := c.Pull(ctx, topic, 0, 0, 100, 0)
	return res.Messages, err
}

// visible is readTopic on the test goroutine.
func visible(t testing.TB, c *client.Client, topic string) []*core.StoredMessage {
	t.Helper()
	msgs, err := readTopic(t.Context(), c, topic)
	require.NoError(t, err)
	return msgs
}

// pending is pendingHalf on the test goroutine.
func pending(t testing.TB, c *client.Client, id core.MessageID) (wire.TxnPending, bool) {
	t.Helper()
	p, ok, err := pendingHalf(t.Context(), c, id)
	require.NoError(t, err)
	return p, ok
}

// pendingHalf returns the server's pending entry for id, if any.
func pendingHalf(ctx context.Context, c *client.Client, id core.MessageID) (wire.TxnPending, bool, error) {
	list, err := c.PendingTransactions(ctx)
	for _, p := range list {
		if p.ID == id.String() {
			return p, true, nil
		}
	}
	return wire.TxnPending{}, false, err
}

// failed reports err from a condition goroutine (where FailNow is not
// allowed) and says whether there was one. Once the test is over its
// context is cancelled: the last poll of require.Never may outlive the
// assertion, and what it then reads does not count.
func failed(t testing.TB, err error) bool {
	if err == nil || t.Context().Err() != nil {
		return false
	}
	t.Errorf("condition: %v", err)
	return true
}

// checks records the check-backs a CheckFunc got and answers with answer.
type checks struct {
	answer func(half *core.StoredMessage) client.TxnAction

	mu  sync.Mutex
	got []*core.StoredMessage
}

func (r *checks) check(_ context.Context, half *core.StoredMessage) client.TxnAction {
	r.mu.Lock()
	r.got = append(r.got, half)
	r.mu.Unlock()
	return r.answer(half)
}

// of returns the check-backs received for id.
func (r *checks) of(id core.MessageID) []*core.StoredMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*core.StoredMessage
	for _, h := range r.got {
		if h.ID == id {
			out = append(out, h)
		}
	}
	return out
}

func (r *checks) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

func answer(a client.TxnAction) func(*core.StoredMessage) client.TxnAction {
	return func(*core.StoredMessage) client.TxnAction { return a }
}

func txnProducer(t testing.TB, c *client.Client, group string, check client.CheckFunc) *client.TransactionProducer {
	t.Helper()
	p, err := c.NewTransactionProducer(t.Context(), group, check)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestTransactionSendCommitAndRollback: Send runs the local transaction
// between half and end; the half is invisible while it runs, a commit makes
// the message visible once with the half's ID in txn.half_id, a rollback
// never makes it visible and leaves nothing pending.
func TestTransactionSendCommitAndRollback(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dial(t, env.Addr)
	ctx := t.Context()
	topic := txnTopic(t, c, "orders")
	rec := &checks{answer: answer(client.Unknown)}
	p := txnProducer(t, c, "pg", rec.check)
	require.Equal(t, "pg", p.Group())

	t.Run("commit", func(t *testing.T) {
		var half core.SendResult
		res, a, err := p.Send(ctx, &core.Message{Topic: topic, ShardingKey: "car-1", Tag: "paid",
			Properties: map[string]string{"k": "v"}, Body: []byte("order 1")},
			func(ctx context.Context, h core.SendResult) client.TxnAction {
				half = h
				require.Equal(t, topic, h.Topic)
				require.Equal(t, -1, h.Queue, "a half message is not placed yet")
				require.Equal(t, int64(-1), h.QueueOffset)
				require.Empty(t, visible(t, c, topic), "invisible before commit")
				got, ok := pending(t, c, h.ID)
				require.True(t, ok, "pending while the local transaction runs")
				require.Equal(t, "pg", got.Group)
				require.Equal(t, topic, got.Topic)
				return client.Commit
			})
		require.NoError(t, err)
		require.Equal(t, client.Commit, a)
		require.Equal(t, topic, res.Topic)
		require.Equal(t, 0, res.Queue)
		require.Equal(t, int64(0), res.QueueOffset)
		require.NotEqual(t, half.ID, res.ID, "the committed message is a new record")

		msgs := visible(t, c, topic)
		require.Len(t, msgs, 1)
		m := msgs[0]
		require.Equal(t, res.ID, m.ID)
		require.Equal(t, half.ID.String(), m.Properties[txn.PropHalfID])
		require.Equal(t, "order 1", string(m.Body))
		require.Equal(t, "car-1", m.ShardingKey)
		require.Equal(t, "paid", m.Tag)
		require.Equal(t, "v", m.Properties["k"])
		for k := range m.Properties {
			if k != txn.PropHalfID {
				require.NotContains(t, k, "txn.", "internal properties are dropped on commit")
			}
		}
		_, ok := pending(t, c, half.ID)
		require.False(t, ok)
	})

	t.Run("rollback", func(t *testing.T) {
		before := len(visible(t, c, topic))
		var half core.SendResult
		_, a, err := p.Send(ctx, &core.Message{Topic: topic, Body: []byte("order 2")},
			func(ctx context.Context, h core.SendResult) client.TxnAction {
				half = h
				return client.Rollback
			})
		require.NoError(t, err)
		require.Equal(t, client.Rollback, a)
		list, err := c.PendingTransactions(ctx)
		require.NoError(t, err)
		require.Empty(t, list)
		require.Never(t, func() bool {
			msgs, err := readTopic(ctx, c, topic)
			return failed(t, err) || len(msgs) != before
		}, quiet, 20*time.Millisecond, "a rolled-back message never becomes visible")
		require.Empty(t, rec.of(half.ID), "a resolved half is never checked back")
		_, err = p.Commit(ctx, half.ID)
		require.ErrorIs(t, err, txn.ErrResolved)
	})

	t.Run("unknown leaves it pending", func(t *testing.T) {
		res, a, err := p.Send(ctx, &core.Message{Topic: topic, Body: []byte("order 3")},
			func(context.Context, core.SendResult) client.TxnAction { return client.Unknown })
		require.NoError(t, err)
		require.Equal(t, client.Unknown, a)
		_, ok := pending(t, c, res.ID)
		require.True(t, ok)
		require.NoError(t, p.Rollback(ctx, res.ID))
	})
}

// TestTransactionCheckBack: a half left unresolved is checked back at the
// producer group's CheckFunc, which gets the half itself; its answer
// commits (the message appears exactly once) or rolls back (it never does).
func TestTransactionCheckBack(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dial(t, env.Addr)
	ctx := t.Context()
	topic := txnTopic(t, c, "payments")
	rec := &checks{answer: func(h *core.StoredMessage) client.TxnAction {
		if string(h.Body) == "commit me" {
			return client.Commit
		}
		return client.Rollback
	}}
	p := txnProducer(t, c, "pg", rec.check)

	commit, err := p.SendHalf(ctx, &core.Message{Topic: topic, ShardingKey: "k", Properties: map[string]string{"a": "b"},
		Body: []byte("commit me")})
	require.NoError(t, err)
	rollback, err := p.SendHalf(ctx, &core.Message{Topic: topic, Body: []byte("roll me back")})
	require.NoError(t, err)
	require.Empty(t, visible(t, c, topic))

	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		list, err := c.PendingTransactions(ctx)
		require.NoError(ct, err)
		require.Empty(ct, list)
	}, 5*time.Second, 10*time.Millisecond, "both halves resolved by their check-backs")

	for _, tc := range []struct {
		half core.SendResult
		body string
	}{{commit, "commit me"}, {rollback, "roll me back"}} {
		got := rec.of(tc.half.ID)
		require.Len(t, got, 1, "one check-back answered for good")
		h := got[0]
		require.Equal(t, txn.HalfTopic, h.Topic)
		require.Equal(t, topic, h.Properties[txn.PropTopic])
		require.Equal(t, "pg", h.Properties[txn.PropGroup])
		require.Equal(t, tc.body, string(h.Body))
		_, err := p.Commit(ctx, tc.half.ID)
		require.ErrorIs(t, err, txn.ErrResolved)
	}
	require.Equal(t, "b", rec.of(commit.ID)[0].Properties["a"])

	msgs := visible(t, c, topic)
	require.Len(t, msgs, 1)
	require.Equal(t, "commit me", string(msgs[0].Body))
	require.Equal(t, commit.ID.String(), msgs[0].Properties[txn.PropHalfID])
	require.Equal(t, "k", msgs[0].ShardingKey)
	require.Never(t, func() bool {
		msgs, err := readTopic(ctx, c, topic)
		return failed(t, err) || len(msgs) != 1
	}, quiet, 20*time.Millisecond, "committed exactly once, the rolled-back one never")
	require.Equal(t, 2, rec.count(), "no check-back after the answers")
}

// TestTransactionChecksExhausted: a producer that keeps answering Unknown
// gets MaxChecks (3) check-backs; then the half is discarded: never
// delivered, and a late commit is refused as resolved.
func TestTransactionChecksExhausted(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dial(t, env.Addr)
	ctx := t.Context()
	topic := txnTopic(t, c, "maybe")
	rec := &checks{answer: answer(client.Unknown)}
	p := txnProducer(t, c, "pg", rec.check)

	half, err := p.SendHalf(ctx, &core.Message{Topic: topic, Body: []byte("undecided")})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		_, ok, err := pendingHalf(ctx, c, half.ID)
		require.NoError(ct, err)
		require.False(ct, ok)
	}, 5*time.Second, 10*time.Millisecond, "discarded after its last check")
	require.Eventually(t, func() bool { return len(rec.of(half.ID)) == 3 }, 5*time.Second, 10*time.Millisecond)

	_, err = p.Commit(ctx, half.ID)
	require.ErrorIs(t, err, txn.ErrResolved)
	require.Empty(t, visible(t, c, topic))
	require.Never(t, func() bool {
		msgs, err := readTopic(ctx, c, topic)
		return failed(t, err) || len(msgs) != 0 || rec.count() != 3
	}, quiet, 20*time.Millisecond, "no check-back and no delivery after the discard")
}

// TestTransactionWaitsForAProducer: while no producer of its group is
// connected a half is not checked (its checks are not used up); the first
// producer of the group that registers gets the check-back and commits.
func TestTransactionWaitsForAProducer(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	ctx := t.Context()
	c := dial(t, env.Addr)
	topic := txnTopic(t, c, "later")
	first := &checks{answer: answer(client.Commit)}
	p, err := c.NewTransactionProducer(ctx, "pg", first.check)
	require.NoError(t, err)
	half, err := p.SendHalf(ctx, &core.Message{Topic: topic, Body: []byte("parked")})
	require.NoError(t, err)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "Close is idempotent")

	// The client stays connected, but no producer of pg is open on it.
	require.Never(t, func() bool {
		pend, ok, err := pendingHalf(ctx, c, half.ID)
		msgs, err2 := readTopic(ctx, c, topic)
		return failed(t, err) || failed(t, err2) || !ok || pend.Checks != 0 || len(msgs) != 0
	}, quiet, 20*time.Millisecond, "pending, unchecked and invisible while no producer of its group is open")
	require.Zero(t, first.count(), "a closed producer is not asked")

	second := &checks{answer: answer(client.Commit)}
	txnProducer(t, dial(t, env.Addr), "pg", second.check)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		msgs, err := readTopic(ctx, c, topic)
		require.NoError(ct, err)
		require.Len(ct, msgs, 1)
	}, 5*time.Second, 10*time.Millisecond, "committed by the new producer's check-back")
	got := second.of(half.ID)
	require.Len(t, got, 1)
	require.Equal(t, "parked", string(got[0].Body))
	require.Equal(t, half.ID.String(), visible(t, c, topic)[0].Properties[txn.PropHalfID])
	_, ok := pending(t, c, half.ID)
	require.False(t, ok)
}

// TestTransactionCheckBackAfterServerRestart: a half sent before the server
// went down is resolved after it comes back: the client reconnects, names
// its producer groups in the hello, and the recovered half's check-back
// reaches the producer, which commits it. This is also what a crash between
// half and commit looks like to the producer.
func TestTransactionCheckBackAfterServerRestart(t *testing.T) {
	dir := t.TempDir()
	// No check-back before the restart: the first one is a minute away.
	env := servertest.Start(t, servertest.Options{Dir: dir, FlushPolicy: "sync", Txn: txn.Options{FirstCheck: time.Minute}})
	addr := env.Addr
	c := dial(t, addr)
	ctx := t.Context()
	topic := txnTopic(t, c, "restart")
	var restarted atomic.Bool
	rec := &checks{answer: func(*core.StoredMessage) client.TxnAction {
		if !restarted.Load() {
			t.Errorf("check-back before the restart")
		}
		return client.Commit
	}}
	p := txnProducer(t, c, "pg", rec.check)
	half, err := p.SendHalf(ctx, &core.Message{Topic: topic, Body: []byte("survives")})
	require.NoError(t, err)

	env.Stop()
	restarted.Store(true)
	// Restarted with the default first check (200 ms): the recovered half is
	// due at once.
	env2 := servertest.Start(t, servertest.Options{Dir: dir, Addr: addr, FlushPolicy: "sync"})
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		res, err := env2.Store.Read(ctx, core.ReadRequest{Topic: topic, Queue: 0, Offset: 0, MaxCount: 10})
		require.NoError(ct, err)
		require.Len(ct, res.Messages, 1)
	}, 5*time.Second, 10*time.Millisecond, "committed through the check-back after the restart")
	require.Len(t, rec.of(half.ID), 1)
	require.Equal(t, "survives", string(rec.of(half.ID)[0].Body))
	msgs := visible(t, c, topic)
	require.Len(t, msgs, 1)
	require.Equal(t, half.ID.String(), msgs[0].Properties[txn.PropHalfID])
	_, err = p.Commit(ctx, half.ID)
	require.ErrorIs(t, err, txn.ErrResolved)
}

// TestTransactionErrors: the server's refusals arrive as the txn package's
// sentinels; the client refuses a second producer for a group and a bad
// group name.
func TestTransactionErrors(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dial(t, env.Addr)
	ctx := t.Context()
	topic := txnTopic(t, c, "errs")
	rec := &checks{answer: answer(client.Unknown)}
	p := txnProducer(t, c, "pg", rec.check)

	t.Run("unknown id", func(t *testing.T) {
		_, err := p.Commit(ctx, core.MessageID{})
		require.ErrorIs(t, err, txn.ErrNotFound)
		require.ErrorIs(t, p.Rollback(ctx, core.MessageID{}), txn.ErrNotFound)
		// The ID of a message that is no half message.
		plain, err := c.NewProducer().Send(ctx, &core.Message{Topic: topic, Body: []byte("plain")})
		require.NoError(t, err)
		_, err = p.Commit(ctx, plain.ID)
		require.ErrorIs(t, err, txn.ErrNotFound)
	})
	t.Run("commit twice", func(t *testing.T) {
		half, err := p.SendHalf(ctx, &core.Message{Topic: topic, Body: []byte("twice")})
		require.NoError(t, err)
		res, err := p.Commit(ctx, half.ID)
		require.NoError(t, err)
		require.False(t, res.ID.IsZero())
		_, err = p.Commit(ctx, half.ID)
		require.ErrorIs(t, err, txn.ErrResolved)
		require.ErrorIs(t, p.Rollback(ctx, half.ID), txn.ErrResolved)
	})
	t.Run("another group's half", func(t *testing.T) {
		other := txnProducer(t, c, "other", rec.check)
		half, err := p.SendHalf(ctx, &core.Message{Topic: topic, Body: []byte("mine")})
		require.NoError(t, err)
		_, err = other.Commit(ctx, half.ID)
		require.ErrorIs(t, err, txn.ErrGroupMismatch)
		require.NoError(t, p.Rollback(ctx, half.ID))
	})
	t.Run("producer exists", func(t *testing.T) {
		_, err := c.NewTransactionProducer(ctx, "pg", rec.check)
		require.ErrorIs(t, err, client.ErrProducerExists)
		// Another client may produce for the same group.
		txnProducer(t, dial(t, env.Addr), "pg", rec.check)
	})
	t.Run("invalid group", func(t *testing.T) {
		for _, g := range []string{"", "has space", "%HALF%", string(make([]byte, txn.MaxGroupLen+1))} {
			_, err := c.NewTransactionProducer(ctx, g, rec.check)
			require.ErrorIs(t, err, txn.ErrInvalidGroup, "group %q", g)
		}
		_, err := c.NewTransactionProducer(ctx, "nocheck", nil)
		require.Error(t, err)
	})
	t.Run("invalid topic", func(t *testing.T) {
		_, err := p.SendHalf(ctx, &core.Message{Topic: "bad topic", Body: []byte("x")})
		require.ErrorIs(t, err, core.ErrInvalidTopic)
	})
	t.Run("after close", func(t *testing.T) {
		c2, err := client.Dial(ctx, client.Options{Addr: env.Addr})
		require.NoError(t, err)
		require.NoError(t, c2.Close())
		_, err = c2.NewTransactionProducer(ctx, "late", rec.check)
		require.ErrorIs(t, err, client.ErrClosed)
	})
}
