package group

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t testing.TB) *store.Store {
	t.Helper()
	s, err := store.Open(t.TempDir(), store.Options{IndexSlots: 64, IndexEntries: 1024})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newCoord(t testing.TB, b core.Broker, opts Options) *Coordinator {
	t.Helper()
	c, err := New(b, opts)
	require.NoError(t, err)
	c.Start()
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func hb(t testing.TB, c *Coordinator, group, id string, mode Mode, topics ...string) Assignment {
	t.Helper()
	var subs []Subscription
	for _, tp := range topics {
		subs = append(subs, Subscription{Topic: tp})
	}
	a, err := c.Heartbeat(t.Context(), HeartbeatRequest{Group: group, ClientID: id, Mode: mode, Subscriptions: subs})
	require.NoError(t, err)
	return a
}

func TestAllocateAveragely(t *testing.T) {
	for n := 0; n <= 17; n++ {
		for m := 1; m <= 6; m++ {
			seen := make([]int, n)
			sizes := []int{}
			for i := 0; i < m; i++ {
				lo, hi := allocate(n, m, i)
				sizes = append(sizes, hi-lo)
				for q := lo; q < hi; q++ {
					seen[q]++
				}
			}
			for q, k := range seen {
				require.Equal(t, 1, k, "n=%d m=%d queue %d", n, m, q)
			}
			sort.Ints(sizes)
			require.LessOrEqual(t, sizes[len(sizes)-1]-sizes[0], 1, "n=%d m=%d", n, m)
		}
	}
	// RocketMQ's example: 8 queues over 3 consumers → 3, 3, 2.
	lo, hi := allocate(8, 3, 0)
	require.Equal(t, [2]int{0, 3}, [2]int{lo, hi})
	lo, hi = allocate(8, 3, 2)
	require.Equal(t, [2]int{6, 8}, [2]int{lo, hi})
}

func produceN(t testing.TB, b core.Broker, topic string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		_, err := b.Produce(t.Context(), &core.Message{Topic: topic, ShardingKey: fmt.Sprintf("k%d", i), Body: []byte(fmt.Sprint(i))})
		require.NoError(t, err)
	}
}

func TestLeasesMoveOnlyWhenReleasedOrExpired(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "orders", Queues: 8})
	require.NoError(t, err)
	produceN(t, s, "orders", 80)
	c := newCoord(t, s, Options{HeartbeatTimeout: 400 * time.Millisecond, ReleaseGrace: time.Hour, CheckInterval: 20 * time.Millisecond})

	a := hb(t, c, "g", "A", Clustering, "orders")
	require.Len(t, a.Queues, 8, "the only member takes every queue (the retry topic does not exist yet)")
	q7 := QueueRef{"orders", 7}
	res, err := c.Pull(ctx, PullRequest{Group: "g", ClientID: "A", Queue: q7, Offset: -1})
	require.NoError(t, err)
	require.True(t, res.Reset)
	require.NotEmpty(t, res.Messages)
	require.NoError(t, c.Commit(ctx, "g", "A", q7, res.NextOffset))

	// B joins: the queues are split; q7 goes to B but A still holds its lease.
	b := hb(t, c, "g", "B", Clustering, "orders")
	a = hb(t, c, "g", "A", Clustering, "orders")
	require.Len(t, a.Queues, 4)
	require.Len(t, b.Queues, 4)
	require.Contains(t, b.Queues, q7)
	require.Greater(t, b.Version, uint64(1))
	_, err = c.Pull(ctx, PullRequest{Group: "g", ClientID: "B", Queue: q7, Offset: -1})
	require.ErrorIs(t, err, ErrQueueBusy, "the lease moves only after the holder lets go")
	_, err = c.Pull(ctx, PullRequest{Group: "g", ClientID: "A", Queue: q7, Offset: res.NextOffset})
	require.ErrorIs(t, err, ErrNotAssigned, "the old holder may not pull more")
	require.NoError(t, c.Commit(ctx, "g", "A", q7, res.NextOffset), "but may commit what it finished")
	require.NoError(t, c.Release(ctx, "g", "A", q7))
	res2, err := c.Pull(ctx, PullRequest{Group: "g", ClientID: "B", Queue: q7, Offset: -1})
	require.NoError(t, err)
	require.Equal(t, res.NextOffset, res2.Offset, "B starts at A's commit")
	err = c.Commit(ctx, "g", "A", q7, 0)
	require.ErrorIs(t, err, ErrNotAssigned, "a former holder cannot move offsets")

	// A goes silent: its lease on q0 expires, then it is dropped and B takes all.
	q0 := QueueRef{"orders", 0}
	_, err = c.Pull(ctx, PullRequest{Group: "g", ClientID: "A", Queue: q0, Offset: -1})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		b = hb(t, c, "g", "B", Clustering, "orders")
		return len(b.Queues) == 8
	}, 5*time.Second, 20*time.Millisecond)
	_, err = c.Pull(ctx, PullRequest{Group: "g", ClientID: "B", Queue: q0, Offset: -1})
	require.NoError(t, err)
	err = c.Commit(ctx, "g", "A", q0, 1)
	require.ErrorIs(t, err, ErrUnknownMember)

	log := c.LeaseLog()
	require.NoError(t, CheckLeaseLog(log))
	kinds := map[LeaseKind]int{}
	for _, e := range log {
		kinds[e.Kind]++
	}
	require.Positive(t, kinds[LeaseAcquired])
	require.Positive(t, kinds[LeaseReleased])
	require.Positive(t, kinds[LeaseExpired])
}

func TestCheckLeaseLogCatchesOverlap(t *testing.T) {
	q := QueueRef{"t", 0}
	now := time.Now()
	bad := []LeaseEvent{
		{Time: now, Group: "g", Queue: q, Client: "A", Kind: LeaseAcquired},
		{Time: now, Group: "g", Queue: q, Client: "B", Kind: LeaseAcquired},
	}
	require.Error(t, CheckLeaseLog(bad))
	good := []LeaseEvent{bad[0], {Time: now, Group: "g", Queue: q, Client: "A", Kind: LeaseExpired}, bad[1]}
	require.NoError(t, CheckLeaseLog(good))
}

func TestRevokedLeaseExpiresAfterGrace(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 2})
	require.NoError(t, err)
	c := newCoord(t, s, Options{HeartbeatTimeout: time.Hour, ReleaseGrace: 100 * time.Millisecond, CheckInterval: 10 * time.Millisecond})
	hb(t, c, "g", "A", Clustering, "t")
	q1 := QueueRef{"t", 1}
	_, err = c.Pull(ctx, PullRequest{Group: "g", ClientID: "A", Queue: q1, Offset: -1})
	require.NoError(t, err)
	b := hb(t, c, "g", "B", Clustering, "t")
	require.Contains(t, b.Queues, q1)
	// A keeps heartbeating but never releases: after the grace the lease goes.
	require.Eventually(t, func() bool {
		hb(t, c, "g", "A", Clustering, "t")
		_, err := c.Pull(ctx, PullRequest{Group: "g", ClientID: "B", Queue: q1, Offset: -1})
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, CheckLeaseLog(c.LeaseLog()))
}

func TestBroadcastEveryMemberEveryQueue(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "cfg", Queues: 3})
	require.NoError(t, err)
	produceN(t, s, "cfg", 9)
	c := newCoord(t, s, Options{})
	a := hb(t, c, "cache", "A", Broadcast, "cfg")
	b := hb(t, c, "cache", "B", Broadcast, "cfg")
	require.Len(t, a.Queues, 3)
	require.Len(t, b.Queues, 3)
	for _, id := range []string{"A", "B"} {
		total := 0
		for q := 0; q < 3; q++ {
			res, err := c.Pull(ctx, PullRequest{Group: "cache", ClientID: id, Queue: QueueRef{"cfg", q}, Offset: -1})
			require.NoError(t, err)
			total += len(res.Messages)
			if id == "A" {
				require.NoError(t, c.Commit(ctx, "cache", id, QueueRef{"cfg", q}, res.NextOffset))
			}
		}
		require.Equal(t, 9, total, id)
	}
	lagA, err := c.Lag(ctx, "cache", "A")
	require.NoError(t, err)
	lagB, err := c.Lag(ctx, "cache", "B")
	require.NoError(t, err)
	for i := range lagA {
		require.Zero(t, lagA[i].Lag, "A committed everything")
		require.Equal(t, int64(-1), lagB[i].Committed, "B's progress is its own")
	}
	_, err = c.Heartbeat(ctx, HeartbeatRequest{Group: "cache", ClientID: "C", Mode: Clustering, Subscriptions: []Subscription{{Topic: "cfg"}}})
	require.ErrorIs(t, err, ErrModeMismatch)
}

func TestResetOffsetsToTime(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "r", Queues: 2})
	require.NoError(t, err)
	produceN(t, s, "r", 20)
	mid := time.Now()
	require.Eventually(t, func() bool { return time.Now().After(mid) }, time.Second, time.Millisecond)
	produceN(t, s, "r", 10)
	c := newCoord(t, s, Options{})
	hb(t, c, "g", "A", Clustering, "r")
	// Consume everything and commit.
	offsets := map[int]int64{}
	for q := 0; q < 2; q++ {
		ref := QueueRef{"r", q}
		off := int64(-1)
		for {
			res, err := c.Pull(ctx, PullRequest{Group: "g", ClientID: "A", Queue: ref, Offset: off, Max: 100})
			require.NoError(t, err)
			if len(res.Messages) == 0 {
				break
			}
			off = res.NextOffset
		}
		require.NoError(t, c.Commit(ctx, "g", "A", ref, off))
		offsets[q] = off
	}
	got, err := c.ResetOffsets(ctx, "g", "r", ResetTarget{Time: mid})
	require.NoError(t, err)
	replayed := 0
	for q := 0; q < 2; q++ {
		res, err := c.Pull(ctx, PullRequest{Group: "g", ClientID: "A", Queue: QueueRef{"r", q}, Offset: offsets[q], Max: 100})
		require.NoError(t, err)
		require.True(t, res.Reset, "the holder is told to drop its position")
		require.Equal(t, got[q], res.Offset)
		for _, m := range res.Messages {
			require.False(t, m.StoredAt.Before(mid))
		}
		replayed += len(res.Messages)
	}
	require.Equal(t, 10, replayed, "exactly the messages stored at or after the time")

	got, err = c.ResetOffsets(ctx, "g", "r", ResetTarget{Latest: true})
	require.NoError(t, err)
	lag, err := c.Lag(ctx, "g", "")
	require.NoError(t, err)
	for _, l := range lag {
		if l.Queue.Topic == "r" {
			require.Zero(t, l.Lag)
			require.Equal(t, got[l.Queue.Queue], l.Committed)
		}
	}
}

func TestLongPollWakesOnArrival(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "lp", Queues: 1})
	require.NoError(t, err)
	c := newCoord(t, s, Options{})
	hb(t, c, "g", "A", Clustering, "lp")
	done := make(chan PullResult, 1)
	go func() {
		res, _ := c.Pull(ctx, PullRequest{Group: "g", ClientID: "A", Queue: QueueRef{"lp", 0}, Offset: 0, Wait: time.Minute})
		done <- res
	}()
	start := time.Now()
	// The pull is waiting (nothing to read); a produce must wake it at once.
	_, err = s.Produce(ctx, &core.Message{Topic: "lp", Body: []byte("x")})
	require.NoError(t, err)
	select {
	case res := <-done:
		require.Len(t, res.Messages, 1)
		require.Less(t, time.Since(start), time.Minute)
	case <-time.After(30 * time.Second):
		t.Fatal("long poll did not wake")
	}
	// With nothing arriving it returns at its deadline, empty.
	res, err := c.Pull(ctx, PullRequest{Group: "g", ClientID: "A", Queue: QueueRef{"lp", 0}, Offset: 1, Wait: 20 * time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, res.Messages)
}

func TestBadRequests(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 2})
	require.NoError(t, err)
	c := newCoord(t, s, Options{})
	for _, req := range []HeartbeatRequest{
		{Group: "", ClientID: "a"},
		{Group: "g/x", ClientID: "a"},
		{Group: "g", ClientID: ""},
		{Group: "g", ClientID: "a", Mode: "sideways"},
		{Group: "g", ClientID: "a", Subscriptions: []Subscription{{Topic: "bad topic"}}},
		{Group: "g", ClientID: "a", Subscriptions: []Subscription{{Topic: "t"}, {Topic: "t"}}},
	} {
		_, err := c.Heartbeat(ctx, req)
		require.Error(t, err, "%+v", req)
	}
	_, err = c.Pull(ctx, PullRequest{Group: "g", ClientID: "nobody", Queue: QueueRef{"t", 0}})
	require.ErrorIs(t, err, ErrUnknownMember)
	hb(t, c, "g", "a", Clustering, "t")
	_, err = c.Pull(ctx, PullRequest{Group: "g", ClientID: "a", Queue: QueueRef{"other", 0}})
	require.ErrorIs(t, err, ErrNotSubscribed)
	_, err = c.Pull(ctx, PullRequest{Group: "g", ClientID: "a", Queue: QueueRef{"t", 99}})
	require.ErrorIs(t, err, ErrNotAssigned)
	// A changed subscription rebalances rather than failing.
	_, err = s.CreateTopic(ctx, core.TopicConfig{Name: "u", Queues: 3})
	require.NoError(t, err)
	a := hb(t, c, "g", "a", Clustering, "t", "u")
	require.Len(t, a.Queues, 5)
	a = hb(t, c, "g", "a", Clustering, "u")
	require.Len(t, a.Queues, 3)
	// Offsets out of range are clamped and reported, never a panic.
	produceN(t, s, "u", 3)
	var q QueueRef
	for _, ref := range a.Queues {
		info, _ := s.Topic(ctx, "u")
		if info.Ranges[ref.Queue].Max > 0 {
			q = ref
		}
	}
	res, err := c.Pull(ctx, PullRequest{Group: "g", ClientID: "a", Queue: q, Offset: 1 << 50})
	require.NoError(t, err)
	require.True(t, res.Reset)
	require.Empty(t, res.Messages)
	_, err = c.ResetOffsets(ctx, "g", "missing", ResetTarget{})
	require.ErrorIs(t, err, core.ErrTopicNotFound)
	_, err = c.Lag(ctx, "nogroup", "")
	require.ErrorIs(t, err, ErrUnknownMember)
	require.ErrorIs(t, c.Leave(ctx, "g", "zzz"), ErrUnknownMember)
	require.NoError(t, c.Leave(ctx, "g", "a"))
}

// A group that starts from a timestamp begins each queue at the first
// message stored at or after it: earlier messages are skipped, later ones
// (also those stored before the member joined) are delivered. Without a
// time the request is refused.
func TestStartFromTimestamp(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "cmd", Queues: 2})
	require.NoError(t, err)
	produceN(t, s, "cmd", 6)         // before the start: skipped
	time.Sleep(2 * time.Millisecond) // store times are the wall clock's: the start must fall between the two batches
	since := time.Now()
	time.Sleep(2 * time.Millisecond)
	for i := range 4 { // after it, before the member joins: delivered
		_, err := s.Produce(ctx, &core.Message{Topic: "cmd", ShardingKey: fmt.Sprintf("k%d", i), Body: []byte(fmt.Sprintf("new-%d", i))})
		require.NoError(t, err)
	}
	c := newCoord(t, s, Options{})
	_, err = c.Heartbeat(ctx, HeartbeatRequest{Group: "g", ClientID: "a", Mode: Broadcast, From: FromTimestamp,
		Subscriptions: []Subscription{{Topic: "cmd"}}})
	require.ErrorIs(t, err, ErrInvalidGroup, "timestamp without a time")
	a, err := c.Heartbeat(ctx, HeartbeatRequest{Group: "g", ClientID: "a", Mode: Broadcast, From: FromTimestamp, FromTime: since,
		Subscriptions: []Subscription{{Topic: "cmd"}}})
	require.NoError(t, err)
	var got []string
	for _, ref := range a.Queues {
		res, err := c.Pull(ctx, PullRequest{Group: "g", ClientID: "a", Queue: ref, Offset: -1})
		require.NoError(t, err)
		for _, m := range res.Messages {
			got = append(got, string(m.Body))
		}
	}
	require.ElementsMatch(t, []string{"new-0", "new-1", "new-2", "new-3"}, got)
}

// Each broadcast member starts from its own time: a member that joins
// later, with a later start, does not move the start of one that joined
// earlier and has not pulled yet (the gateways' downlinks over one core
// are such members, each from its own start).
func TestStartFromTimestampIsEachMembers(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "cmd", Queues: 1})
	require.NoError(t, err)
	// Store times are the wall clock's: each start falls between batches.
	time.Sleep(2 * time.Millisecond)
	sinceA := time.Now()
	time.Sleep(2 * time.Millisecond)
	produceN(t, s, "cmd", 3) // after A's start, before B's
	time.Sleep(2 * time.Millisecond)
	sinceB := time.Now()
	time.Sleep(2 * time.Millisecond)
	produceN(t, s, "cmd", 2) // after both
	c := newCoord(t, s, Options{})
	join := func(id string, since time.Time) {
		_, err := c.Heartbeat(ctx, HeartbeatRequest{Group: "downlink", ClientID: id, Mode: Broadcast, From: FromTimestamp, FromTime: since,
			Subscriptions: []Subscription{{Topic: "cmd"}}})
		require.NoError(t, err)
	}
	join("A", sinceA)
	join("B", sinceB)
	for id, want := range map[string]int{"A": 5, "B": 2} {
		res, err := c.Pull(ctx, PullRequest{Group: "downlink", ClientID: id, Queue: QueueRef{"cmd", 0}, Offset: -1})
		require.NoError(t, err)
		require.Len(t, res.Messages, want, "%s starts at its own time", id)
	}
}
