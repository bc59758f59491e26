package txn

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
)

const group = "pay-producers"

// requireCommitted checks that m is the committed form of testMessage(i),
// the half half.
func requireCommitted(t *testing.T, m *core.StoredMessage, i int, half core.MessageID) {
	t.Helper()
	want := testMessage(i)
	require.Equal(t, "orders", m.Topic)
	require.Equal(t, want.ShardingKey, m.ShardingKey)
	require.Equal(t, want.Tag, m.Tag)
	require.Equal(t, want.Keys, m.Keys)
	require.Equal(t, want.Body, m.Body)
	require.Equal(t, want.BornAt.UnixNano(), m.BornAt.UnixNano())
	require.True(t, m.DeliverAt.IsZero())
	require.Equal(t, map[string]string{"app.i": want.Properties["app.i"], PropHalfID: half.String()}, m.Properties)
}

func TestCommitMakesVisible(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, Options{})
	res := e.send(group, 1)
	require.Equal(t, "orders", res.Topic)
	require.Equal(t, -1, res.Queue)
	require.EqualValues(t, -1, res.QueueOffset)
	require.Empty(t, e.visible("orders"), "a half is invisible")
	st, err := e.s.State(res.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, st)
	p := e.pending()
	require.Equal(t, PendingInfo{
		ID: res.ID, Group: group, Topic: "orders", StoredAt: res.StoredAt,
		NextCheck: res.StoredAt.Add(firstCheck),
	}, p)

	out, err := e.s.End(ctx, res.ID, group, Commit, false)
	require.NoError(t, err)
	got := e.visible("orders")
	require.Len(t, got, 1)
	require.Equal(t, out.ID, got[0].ID)
	require.Equal(t, "orders", out.Topic)
	require.Equal(t, core.QueueFor("dev-1", 8), got[0].Queue, "placed by its own sharding key")
	requireCommitted(t, got[0], 1, res.ID)

	st, err = e.s.State(res.ID)
	require.NoError(t, err)
	require.Equal(t, StateCommitted, st)
	require.Empty(t, e.s.Pending())
	require.Equal(t, []string{OpCommit}, e.ops(res.ID))
}

func TestDeliverAtAndReservedPropertiesCarried(t *testing.T) {
	e := newEnv(t, Options{})
	m := testMessage(2)
	m.DeliverAt = e.clk.Now().Add(time.Hour)
	m.Properties[PropOp] = "commit" // reserved: would make the half look like an op record
	m.Properties["txn.other"] = "x"
	res, err := e.s.SendHalf(t.Context(), group, m)
	require.NoError(t, err)
	require.Len(t, e.s.Pending(), 1)
	_, err = e.s.End(t.Context(), res.ID, "", Commit, false)
	require.NoError(t, err)
	got := e.visible("orders")
	require.Len(t, got, 1)
	require.Equal(t, m.DeliverAt.UnixNano(), got[0].DeliverAt.UnixNano())
	require.Equal(t, map[string]string{"app.i": "2", PropHalfID: res.ID.String()}, got[0].Properties)
}

func TestRollbackDiscards(t *testing.T) {
	e := newEnv(t, Options{})
	p := newProbe()
	defer e.s.Register(group, p)()
	res := e.send(group, 1)
	out, err := e.s.End(t.Context(), res.ID, group, Rollback, false)
	require.NoError(t, err)
	require.Equal(t, core.SendResult{}, out)
	e.clk.Advance(time.Hour)
	e.barrier(group, p)
	p.expectNone(t)
	require.Empty(t, e.visible("orders"))
	st, err := e.s.State(res.ID)
	require.NoError(t, err)
	require.Equal(t, StateRolledBack, st)
}

func TestCheckBack(t *testing.T) {
	for _, tc := range []struct {
		action  Action
		visible int
		state   State
	}{
		{Commit, 1, StateCommitted},
		{Rollback, 0, StateRolledBack},
	} {
		t.Run(tc.action.String(), func(t *testing.T) {
			e := newEnv(t, Options{})
			p := newProbe()
			defer e.s.Register(group, p)()
			res := e.send(group, 1)
			require.Equal(t, res.StoredAt.Add(firstCheck), e.pending().NextCheck)
			e.clk.Advance(firstCheck)
			h := p.next(t)
			require.Equal(t, res.ID, h.ID)
			require.Equal(t, HalfTopic, h.Topic)
			require.Equal(t, "body-1", string(h.Body))
			require.Equal(t, "orders", h.Properties[PropTopic])
			e.waitChecks(1)

			_, err := e.s.End(t.Context(), h.ID, h.Properties[PropGroup], tc.action, true)
			require.NoError(t, err)
			require.Len(t, e.visible("orders"), tc.visible)
			st, err := e.s.State(res.ID)
			require.NoError(t, err)
			require.Equal(t, tc.state, st)
			require.Empty(t, e.s.Pending())
			require.Equal(t, []string{OpCheck, string(tc.action.String())}, e.ops(res.ID))
		})
	}
}

func TestCheckBackExhausted(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, Options{MaxChecks: 3})
	p := newProbe()
	defer e.s.Register(group, p)()
	res := e.send(group, 1)
	e.clk.Advance(firstCheck)
	for n := 1; n <= 3; n++ {
		h := p.next(t)
		require.Equal(t, res.ID, h.ID)
		out, err := e.s.End(ctx, h.ID, group, Unknown, true)
		require.NoError(t, err)
		require.Equal(t, core.SendResult{}, out)
		e.waitChecks(n)
		require.Equal(t, e.clk.Now().Add(checkInterval), e.pending().NextCheck)
		e.clk.Advance(checkInterval)
	}
	e.waitState(res.ID, StateDiscarded)
	p.expectNone(t)
	require.Empty(t, e.s.Pending())
	require.Empty(t, e.visible("orders"))
	require.Equal(t, []string{OpCheck, OpCheck, OpCheck, OpDiscard}, e.ops(res.ID))
	_, err := e.s.End(ctx, res.ID, group, Commit, true)
	require.ErrorIs(t, err, ErrResolved)
	require.ErrorContains(t, err, "discarded")
	require.Empty(t, e.visible("orders"))
}

func TestNoProducerChecksWait(t *testing.T) {
	e := newEnv(t, Options{MaxChecks: 1})
	res := e.send(group, 1)
	e.clk.Advance(firstCheck)
	require.Eventually(t, func() bool { return e.pending().Waiting }, waitFor, time.Millisecond)
	e.clk.Advance(time.Hour) // far past MaxChecks*CheckInterval: waiting checks do not count
	p := e.pending()
	require.Zero(t, p.Checks)
	require.True(t, p.Waiting)
	require.Empty(t, e.visible("orders"))

	pr := newProbe()
	defer e.s.Register(group, pr)()
	h := pr.next(t) // at once: the clock does not move
	require.Equal(t, res.ID, h.ID)
	e.waitChecks(1)
	_, err := e.s.End(t.Context(), h.ID, group, Commit, true)
	require.NoError(t, err)
	require.Len(t, e.visible("orders"), 1)
}

func TestGoneProducerNotCounted(t *testing.T) {
	e := newEnv(t, Options{MaxChecks: 1})
	gone := newProbe()
	gone.fail.Store(true)
	unregister := e.s.Register(group, gone)
	res := e.send(group, 1)
	e.clk.Advance(firstCheck)
	// Refused: tried again after PollInterval, not counted.
	require.Eventually(t, func() bool {
		return e.pending().NextCheck.Equal(e.clk.Now().Add(e.opts.PollInterval))
	}, waitFor, time.Millisecond)
	e.clk.Advance(time.Hour)
	require.Never(t, func() bool { return e.pending().Checks > 0 }, 20*time.Millisecond, time.Millisecond)

	pr := newProbe()
	defer e.s.Register(group, pr)()
	e.clk.Advance(time.Second)
	require.Equal(t, res.ID, pr.next(t).ID)
	e.waitChecks(1)
	unregister()
	unregister()
	_, err := e.s.End(t.Context(), res.ID, group, Rollback, true)
	require.NoError(t, err)
	require.Empty(t, e.visible("orders"))
}

func TestChecksRoundRobin(t *testing.T) {
	e := newEnv(t, Options{})
	p1, p2 := newProbe(), newProbe()
	defer e.s.Register(group, p1)()
	defer e.s.Register(group, p2)()
	other := newProbe()
	defer e.s.Register("other", other)()
	for i := range 4 {
		e.send(group, i)
	}
	e.clk.Advance(firstCheck)
	require.Eventually(t, func() bool { return len(p1.ch)+len(p2.ch) == 4 }, waitFor, time.Millisecond)
	require.Len(t, p1.ch, 2)
	require.Len(t, p2.ch, 2)
	other.expectNone(t)
}

func TestRestart(t *testing.T) {
	t.Run("after send: pending, check-back commits", func(t *testing.T) {
		e := newEnv(t, Options{})
		res := e.send(group, 1)
		e.restart()
		p := e.pending()
		require.Equal(t, res.ID, p.ID)
		require.Equal(t, res.StoredAt.Add(firstCheck), p.NextCheck)
		pr := newProbe()
		defer e.s.Register(group, pr)()
		e.clk.Advance(firstCheck)
		h := pr.next(t)
		require.Equal(t, res.ID, h.ID)
		_, err := e.s.End(t.Context(), h.ID, group, Commit, true)
		require.NoError(t, err)
		got := e.visible("orders")
		require.Len(t, got, 1)
		requireCommitted(t, got[0], 1, res.ID)
	})
	t.Run("after commit: committed once, no check", func(t *testing.T) {
		e := newEnv(t, Options{})
		res := e.send(group, 1)
		_, err := e.s.End(t.Context(), res.ID, group, Commit, false)
		require.NoError(t, err)
		e.restart()
		require.Empty(t, e.s.Pending())
		st, err := e.s.State(res.ID)
		require.NoError(t, err)
		require.Equal(t, StateCommitted, st)
		pr := newProbe()
		defer e.s.Register(group, pr)()
		e.clk.Advance(time.Hour)
		e.barrier(group, pr)
		pr.expectNone(t)
		require.Len(t, e.visible("orders"), 1)
		_, err = e.s.End(t.Context(), res.ID, group, Commit, true)
		require.ErrorIs(t, err, ErrResolved)
		require.Len(t, e.visible("orders"), 1)
	})
	t.Run("after rollback: nothing, no check", func(t *testing.T) {
		e := newEnv(t, Options{})
		res := e.send(group, 1)
		_, err := e.s.End(t.Context(), res.ID, group, Rollback, false)
		require.NoError(t, err)
		e.restart()
		require.Empty(t, e.s.Pending())
		st, err := e.s.State(res.ID)
		require.NoError(t, err)
		require.Equal(t, StateRolledBack, st)
		pr := newProbe()
		defer e.s.Register(group, pr)()
		e.clk.Advance(time.Hour)
		e.barrier(group, pr)
		pr.expectNone(t)
		require.Empty(t, e.visible("orders"))
	})
	t.Run("check counts survive", func(t *testing.T) {
		e := newEnv(t, Options{MaxChecks: 3})
		pr := newProbe()
		unregister := e.s.Register(group, pr)
		res := e.send(group, 1)
		e.clk.Advance(firstCheck)
		pr.next(t)
		e.waitChecks(1)
		e.clk.Advance(checkInterval)
		pr.next(t)
		e.waitChecks(2)
		unregister()

		e.restart()
		p := e.pending()
		require.Equal(t, 2, p.Checks)
		require.Equal(t, e.clk.Now().Add(checkInterval), p.NextCheck, "due a CheckInterval after the last check")
		defer e.s.Register(group, pr)()
		e.clk.Advance(checkInterval)
		require.Equal(t, res.ID, pr.next(t).ID)
		e.waitChecks(3)
		e.clk.Advance(checkInterval)
		e.waitState(res.ID, StateDiscarded)
		pr.expectNone(t)
		require.Empty(t, e.visible("orders"))
		require.Equal(t, []string{OpCheck, OpCheck, OpCheck, OpDiscard}, e.ops(res.ID))
	})
}

// TestTornCommit stores the committed message without its commit record, as
// a crash inside End's batch could: after a restart the half is pending
// again and a check-back commit delivers the message a second time — the
// documented duplicate, never a loss.
func TestTornCommit(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, Options{})
	res := e.send(group, 1)
	half, err := e.b.Get(ctx, res.ID)
	require.NoError(t, err)
	_, err = e.b.Produce(ctx, committedMessage(half)) // the commit record is lost
	require.NoError(t, err)
	e.restart()

	require.Equal(t, res.ID, e.pending().ID)
	pr := newProbe()
	defer e.s.Register(group, pr)()
	e.clk.Advance(firstCheck)
	h := pr.next(t)
	require.Equal(t, res.ID, h.ID)
	_, err = e.s.End(ctx, h.ID, group, Commit, true)
	require.NoError(t, err)
	got := e.visible("orders")
	require.Len(t, got, 2)
	for _, m := range got {
		requireCommitted(t, m, 1, res.ID)
	}
}

func TestEndErrors(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, Options{})
	res := e.send(group, 1)

	_, err := e.s.End(ctx, core.MessageID{}, group, Commit, false)
	require.ErrorIs(t, err, ErrNotFound)
	plain, err := e.b.Produce(ctx, &core.Message{Topic: "orders", Body: []byte("x")})
	require.NoError(t, err)
	_, err = e.s.End(ctx, plain.ID, group, Commit, false)
	require.ErrorIs(t, err, ErrNotFound, "an ordinary message is no half")
	_, err = e.s.End(ctx, res.ID, group, Action(0), false)
	require.ErrorIs(t, err, ErrInvalidAction)

	_, err = e.s.End(ctx, res.ID, "someone-else", Commit, false)
	require.ErrorIs(t, err, ErrGroupMismatch)
	_, err = e.s.End(ctx, res.ID, group, Unknown, false)
	require.NoError(t, err)
	require.Len(t, e.s.Pending(), 1, "unknown leaves the half pending")

	_, err = e.s.End(ctx, res.ID, group, Rollback, false)
	require.NoError(t, err)
	_, err = e.s.End(ctx, res.ID, group, Commit, false)
	require.ErrorIs(t, err, ErrResolved)
	require.ErrorContains(t, err, "rolled-back")
	_, err = e.s.End(ctx, res.ID, "someone-else", Commit, false)
	require.ErrorIs(t, err, ErrGroupMismatch)
	_, err = e.s.State(plain.ID)
	require.ErrorIs(t, err, ErrNotFound)

	// Resolved before the restart and below TxnGroup's offset: the outcome
	// comes from the broker.
	e.restart()
	require.Eventually(t, func() bool {
		off, err := e.b.CommittedOffset(ctx, TxnGroup, HalfTopic, 0)
		return err == nil && off == 2
	}, waitFor, time.Millisecond)
	e.restart()
	e.s.mu.Lock()
	require.Empty(t, e.s.recent.m, "recovery started past the rollback")
	e.s.mu.Unlock()
	_, err = e.s.End(ctx, res.ID, group, Commit, false)
	require.ErrorIs(t, err, ErrResolved)
	require.ErrorContains(t, err, "rolled-back")
	_, err = e.s.End(ctx, res.ID, "someone-else", Commit, false)
	require.ErrorIs(t, err, ErrGroupMismatch)
	st, err := e.s.State(res.ID)
	require.NoError(t, err)
	require.Equal(t, StateRolledBack, st)
	require.Len(t, e.visible("orders"), 1, "only the ordinary message")
}

func TestConcurrentEnds(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, Options{})
	res := e.send(group, 1)
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			a := Commit
			if i%2 == 1 {
				a = Rollback
			}
			_, errs[i] = e.s.End(ctx, res.ID, group, a, false)
		})
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
			continue
		}
		require.ErrorIs(t, err, ErrResolved)
	}
	require.Equal(t, 1, won)
	st, err := e.s.State(res.ID)
	require.NoError(t, err)
	want := map[State]int{StateCommitted: 1, StateRolledBack: 0}[st]
	require.Len(t, e.visible("orders"), want)
	require.Len(t, e.ops(res.ID), 1)
}

func TestMaxPending(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, Options{MaxPending: 2})
	a := e.send(group, 1)
	e.send(group, 2)
	_, err := e.s.SendHalf(ctx, group, testMessage(3))
	require.ErrorIs(t, err, ErrTooManyPending)
	_, err = e.s.End(ctx, a.ID, group, Commit, false)
	require.NoError(t, err)
	e.send(group, 3)
	require.Len(t, e.s.Pending(), 2)
}

func TestSendHalfRefuses(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, Options{})
	for _, tc := range []struct {
		name  string
		group string
		m     *core.Message
		want  error
	}{
		{"empty group", "", testMessage(1), ErrInvalidGroup},
		{"bad group", "a/b", testMessage(1), ErrInvalidGroup},
		{"long group", strings.Repeat("g", MaxGroupLen+1), testMessage(1), ErrInvalidGroup},
		{"nil message", group, nil, core.ErrInvalidMessage},
		{"bad topic", group, &core.Message{Topic: "a b"}, core.ErrInvalidTopic},
		{"system topic", group, &core.Message{Topic: HalfTopic}, core.ErrInvalidTopic},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.s.SendHalf(ctx, tc.group, tc.m)
			require.ErrorIs(t, err, tc.want)
		})
	}
	require.Empty(t, e.s.Pending())
	require.NoError(t, ValidateGroup(strings.Repeat("g", MaxGroupLen)))
}

func TestLifecycle(t *testing.T) {
	ctx := t.Context()
	b, err := store.Open(t.TempDir(), store.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()

	_, err = New(nil, Options{})
	require.ErrorIs(t, err, ErrBadOptions)
	_, err = New(b, Options{MaxChecks: -1, MaxPending: -2, FirstCheck: -time.Second, CheckInterval: -1, PollInterval: -1})
	require.ErrorIs(t, err, ErrBadOptions)
	for _, s := range []string{"max checks", "max pending", "first check", "check interval", "poll interval"} {
		require.ErrorContains(t, err, s)
	}

	s, err := New(b, Options{})
	require.NoError(t, err)
	_, err = s.SendHalf(ctx, group, testMessage(1))
	require.ErrorIs(t, err, ErrNotStarted)
	_, err = s.End(ctx, core.MessageID{}, group, Commit, false)
	require.ErrorIs(t, err, ErrNotStarted)
	require.NoError(t, s.Start(ctx))
	require.NoError(t, s.Start(ctx))
	info, err := b.Topic(ctx, HalfTopic)
	require.NoError(t, err)
	require.Equal(t, 1, info.Queues)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	_, err = s.SendHalf(ctx, group, testMessage(1))
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, s.Start(ctx), ErrClosed)

	// Closed before Start: nothing runs, Close still returns.
	s2, err := New(b, Options{})
	require.NoError(t, err)
	require.NoError(t, s2.Close())
}

// TestProgress checks TxnGroup's committed offset: held at the oldest
// pending half, at the end of HalfTopic once nothing is pending.
func TestProgress(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, Options{})
	committed := func() int64 {
		off, err := e.b.CommittedOffset(ctx, TxnGroup, HalfTopic, 0)
		if errors.Is(err, core.ErrNoCommittedOffset) {
			return 0
		}
		require.NoError(t, err)
		return off
	}
	a := e.send(group, 1)                              // offset 0
	b := e.send(group, 2)                              // offset 1
	_, err := e.s.End(ctx, b.ID, group, Commit, false) // op at 2
	require.NoError(t, err)
	require.Never(t, func() bool { return committed() > 0 }, 20*time.Millisecond, time.Millisecond)
	_, err = e.s.End(ctx, a.ID, group, Rollback, false) // op at 3
	require.NoError(t, err)
	require.Eventually(t, func() bool { return committed() == 4 }, waitFor, time.Millisecond)

	c := e.send(group, 3) // offset 4
	e.restart()
	require.Equal(t, c.ID, e.pending().ID)
	require.EqualValues(t, 4, committed())
}

func BenchmarkSendHalfCommit(b *testing.B) {
	st, err := store.Open(b.TempDir(), store.Options{})
	require.NoError(b, err)
	defer func() { require.NoError(b, st.Close()) }()
	s, err := New(st, Options{})
	require.NoError(b, err)
	defer func() { require.NoError(b, s.Close()) }()
	ctx := context.Background()
	require.NoError(b, s.Start(ctx))
	m := testMessage(1)
	b.ReportAllocs()
	for b.Loop() {
		res, err := s.SendHalf(ctx, group, m)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.End(ctx, res.ID, group, Commit, false); err != nil {
			b.Fatal(err)
		}
	}
}
