package pop

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
)

func TestTracePopAckAndExpiry(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(t.TempDir(), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	rec, err := trace.New(st, trace.Options{Topics: []string{"orders"}})
	require.NoError(t, err)
	rec.Start()
	t.Cleanup(func() { _ = rec.Close() })
	ropts := fastRetry
	ropts.Trace = rec
	r, err := retry.New(st, ropts)
	require.NoError(t, err)
	r.Start()
	t.Cleanup(func() { _ = r.Close() })
	popts := fastPop
	popts.Trace = rec
	s, err := New(st, r, popts)
	require.NoError(t, err)
	s.Start()
	t.Cleanup(func() { _ = s.Close() })
	for _, name := range []string{"orders", "other"} {
		_, err := st.CreateTopic(ctx, core.TopicConfig{Name: name, Queues: 1})
		require.NoError(t, err)
	}
	ids := map[string]core.MessageID{}
	for _, topic := range []string{"orders", "other"} {
		res, err := st.Produce(ctx, &core.Message{Topic: topic, Body: []byte(topic)})
		require.NoError(t, err)
		ids[topic] = res.ID
		ps, err := s.Pop(ctx, Request{Group: "g", Topic: topic, Invisible: time.Minute})
		require.NoError(t, err)
		require.Len(t, ps, 1)
		require.NoError(t, s.Ack(ctx, ps[0].Handle))
	}

	// One that expires comes back through the retry topic, traced under its
	// first ID.
	late, err := st.Produce(ctx, &core.Message{Topic: "orders", Body: []byte("late")})
	require.NoError(t, err)
	ps, err := s.Pop(ctx, Request{Group: "g", Topic: "orders", Invisible: 10 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, ps, 1)
	var again Popped
	require.Eventually(t, func() bool {
		ps, err := s.Pop(ctx, Request{Group: "g", Topic: "orders", Invisible: time.Minute})
		if err != nil || len(ps) == 0 {
			return false
		}
		again = ps[0]
		return true
	}, waitFor, time.Millisecond)
	require.Equal(t, 2, again.Attempt)
	require.NoError(t, s.Ack(ctx, again.Handle))
	require.NoError(t, rec.Close()) // writes everything

	lookup := func(id core.MessageID) []trace.Event {
		evs, err := trace.Lookup(ctx, st, id, 0)
		require.NoError(t, err)
		return evs
	}
	evs := lookup(ids["orders"])
	require.Len(t, evs, 2)
	d, a := evs[0], evs[1]
	require.Equal(t, trace.HopDelivered, d.Hop)
	require.Equal(t, "g", d.Actor)
	require.Equal(t, map[string]string{"group": "g", "mode": "pop", "attempt": "1", "topic": "orders", "queue": "0", "offset": "0",
		"invisible_until": d.Attrs["invisible_until"]}, d.Attrs)
	until, err := time.Parse(time.RFC3339Nano, d.Attrs["invisible_until"])
	require.NoError(t, err)
	require.True(t, until.After(d.At))
	require.Equal(t, trace.HopAcked, a.Hop)
	require.Equal(t, map[string]string{"group": "g", "topic": "orders", "queue": "0", "offset": "0"}, a.Attrs)

	require.Empty(t, lookup(ids["other"]), "an untraced topic records nothing")

	var got []string
	evs = lookup(late.ID)
	require.Len(t, evs, 4)
	require.Equal(t, ReasonExpired, evs[1].Attrs["reason"])
	for _, e := range evs {
		got = append(got, e.Hop+" "+e.Attrs["attempt"]+" "+e.Attrs["topic"])
	}
	rt := retry.RetryTopic("g")
	require.Equal(t, []string{"delivered 1 orders", "retry 1 ", "delivered 2 " + rt, "acked  " + rt}, got)
}
