package group

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
)

// newRecorder starts a recorder tracing topics over s; it is closed before
// s (t.Cleanup runs last-in first-out).
func newRecorder(t testing.TB, s *store.Store, topics ...string) *trace.Recorder {
	t.Helper()
	rec, err := trace.New(s, trace.Options{Topics: topics})
	require.NoError(t, err)
	rec.Start()
	t.Cleanup(func() { _ = rec.Close() })
	return rec
}

// hops returns the hops recorded for id; close the recorder first, so that
// everything is written.
func hops(t testing.TB, s *store.Store, id core.MessageID) []trace.Event {
	t.Helper()
	evs, err := trace.Lookup(t.Context(), s, id, 0)
	require.NoError(t, err)
	return evs
}

func TestTraceDeliveredAndCommittedPerGroup(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	rec := newRecorder(t, s, "orders")
	for _, name := range []string{"orders", "other"} {
		_, err := s.CreateTopic(ctx, core.TopicConfig{Name: name, Queues: 1})
		require.NoError(t, err)
	}
	traced, err := s.Produce(ctx, &core.Message{Topic: "orders", Body: []byte("o")})
	require.NoError(t, err)
	plain, err := s.Produce(ctx, &core.Message{Topic: "other", Body: []byte("p")})
	require.NoError(t, err)

	c := newCoord(t, s, Options{Trace: rec})
	off := newCoord(t, s, Options{}) // tracing off: records nothing
	for _, co := range []*Coordinator{c, off} {
		groups := []string{"ga", "gb"}
		if co == off {
			groups = []string{"gc", "gd"}
		}
		for _, g := range groups {
			hb(t, co, g, "m-"+g, Clustering, "orders", "other")
			for _, topic := range []string{"orders", "other"} {
				ref := QueueRef{topic, 0}
				res, err := co.Pull(ctx, PullRequest{Group: g, ClientID: "m-" + g, Queue: ref, Offset: -1})
				require.NoError(t, err)
				require.Len(t, res.Messages, 1)
				require.NoError(t, co.Commit(ctx, g, "m-"+g, ref, res.NextOffset))
			}
			require.NoError(t, co.Leave(ctx, g, "m-"+g))
		}
	}
	require.NoError(t, rec.Close())

	evs := hops(t, s, traced.ID)
	require.Len(t, evs, 4, "delivered and committed, once per group, by the traced coordinator only")
	var got []string
	for i, e := range evs {
		if i > 0 {
			require.False(t, e.At.Before(evs[i-1].At), "in time order")
		}
		require.Equal(t, e.Attrs["group"]+"/m-"+e.Attrs["group"], e.Actor)
		require.Equal(t, "orders", e.Attrs["topic"])
		require.Equal(t, "0", e.Attrs["queue"])
		require.Equal(t, "0", e.Attrs["offset"])
		got = append(got, e.Hop+" "+e.Attrs["group"])
		if e.Hop == trace.HopDelivered {
			require.Equal(t, "clustering", e.Attrs["mode"])
			require.Equal(t, "1", e.Attrs["attempt"])
		} else {
			require.Equal(t, "1", e.Attrs["committed"])
		}
	}
	require.Equal(t, []string{"delivered ga", "committed ga", "delivered gb", "committed gb"}, got)
	require.Empty(t, hops(t, s, plain.ID), "an untraced topic records nothing")
	for _, co := range []*Coordinator{c, off} {
		co.mu.Lock()
		for _, g := range co.groups {
			require.Empty(t, g.traced, "a commit forgets what it passed")
		}
		co.mu.Unlock()
	}
}

func TestTraceForgetsOnResetAndBroadcastLeave(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	rec := newRecorder(t, s, "orders")
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "orders", Queues: 1})
	require.NoError(t, err)
	produceN(t, s, "orders", 3)
	c := newCoord(t, s, Options{Trace: rec})
	remembered := func(group string) int {
		c.mu.Lock()
		defer c.mu.Unlock()
		n := 0
		if g := c.groups[group]; g != nil {
			for _, q := range g.traced {
				n += q.len()
			}
		}
		return n
	}
	ref := QueueRef{"orders", 0}

	hb(t, c, "clu", "A", Clustering, "orders")
	_, err = c.Pull(ctx, PullRequest{Group: "clu", ClientID: "A", Queue: ref, Offset: -1})
	require.NoError(t, err)
	require.Equal(t, 3, remembered("clu"))
	require.NoError(t, c.Commit(ctx, "clu", "A", ref, 1))
	require.Equal(t, 2, remembered("clu"), "a commit forgets only what it passed")
	_, err = c.ResetOffsets(ctx, "clu", "orders", ResetTarget{})
	require.NoError(t, err)
	require.Zero(t, remembered("clu"))

	hb(t, c, "bro", "A", Broadcast, "orders")
	hb(t, c, "bro", "B", Broadcast, "orders")
	for _, id := range []string{"A", "B"} {
		_, err = c.Pull(ctx, PullRequest{Group: "bro", ClientID: id, Queue: ref, Offset: -1})
		require.NoError(t, err)
	}
	require.Equal(t, 6, remembered("bro"), "each broadcast member has its own")
	require.NoError(t, c.Leave(ctx, "bro", "A"))
	require.Equal(t, 3, remembered("bro"))
	require.NoError(t, c.Commit(ctx, "bro", "B", ref, 3))
	require.Zero(t, remembered("bro"))
}

func TestTracedQueueIsBounded(t *testing.T) {
	q := newTracedQueue(4)
	for off := range int64(10) {
		q.add(tracedMsg{offset: off})
	}
	require.Equal(t, 4, q.len(), "the oldest are dropped")
	got := q.take(100)
	require.Equal(t, []int64{6, 7, 8, 9}, offsets(got))
	require.Zero(t, q.len())
	require.Nil(t, q.take(100))

	// A delivery at or below the newest offset replaces what follows it.
	for off := range int64(4) {
		q.add(tracedMsg{offset: off})
	}
	q.add(tracedMsg{offset: 2})
	require.Equal(t, 3, q.len())
	require.Equal(t, []int64{0, 1}, offsets(q.take(2)))
	require.Equal(t, []int64{2}, offsets(q.take(10)))

	// Whatever is added, memory stays within a small multiple of the limit.
	g := &groupState{mode: Clustering, name: "g"}
	ref := QueueRef{"t", 0}
	batch := make([]tracedMsg, 100)
	for i := range int64(1000) {
		for j := range batch {
			batch[j] = tracedMsg{offset: i*int64(len(batch)) + int64(j)}
		}
		g.rememberLocked("g", ref, batch)
	}
	big := g.traced[tracedKey{"g", ref}]
	require.Equal(t, maxTracedPerQueue, big.len())
	require.LessOrEqual(t, cap(big.msgs), 4*maxTracedPerQueue)
	done := g.committedLocked("g", ref, 1<<62)
	require.Len(t, done, maxTracedPerQueue)
	require.Equal(t, int64(100_000-maxTracedPerQueue), done[0].offset, "the newest are kept")
	require.Empty(t, g.traced)
}

func offsets(msgs []tracedMsg) []int64 {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		out[i] = m.offset
	}
	return out
}
