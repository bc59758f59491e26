package retry_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
)

// A message a group fails is traced under its first ID through the retry,
// its redelivery and its dead-lettering.
func TestTraceRetryRedeliveryAndDeadLetter(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(t.TempDir(), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	rec, err := trace.New(st, trace.Options{Topics: []string{"orders"}})
	require.NoError(t, err)
	rec.Start()
	t.Cleanup(func() { _ = rec.Close() })
	rs, err := retry.New(st, retry.Options{Schedule: []time.Duration{10 * time.Millisecond}, MaxAttempts: 1, PollInterval: 10 * time.Millisecond, Trace: rec})
	require.NoError(t, err)
	rs.Start()
	t.Cleanup(func() { _ = rs.Close() })
	gc, err := group.New(st, group.Options{CheckInterval: 10 * time.Millisecond, Trace: rec})
	require.NoError(t, err)
	gc.Start()
	t.Cleanup(func() { _ = gc.Close() })
	for _, name := range []string{"orders", "other"} {
		_, err := st.CreateTopic(ctx, core.TopicConfig{Name: name, Queues: 1})
		require.NoError(t, err)
	}
	sent, err := st.Produce(ctx, &core.Message{Topic: "orders", Body: []byte("o")})
	require.NoError(t, err)
	plain, err := st.Produce(ctx, &core.Message{Topic: "other", Body: []byte("p")})
	require.NoError(t, err)

	hbReq := group.HeartbeatRequest{Group: "billing", ClientID: "c1", Subscriptions: []group.Subscription{{Topic: "orders"}}}
	_, err = gc.Heartbeat(ctx, hbReq)
	require.NoError(t, err)
	ref := group.QueueRef{Topic: "orders", Queue: 0}
	res, err := gc.Pull(ctx, group.PullRequest{Group: "billing", ClientID: "c1", Queue: ref, Offset: -1})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	out, err := rs.SendBack(ctx, "billing", res.Messages[0], "boom")
	require.NoError(t, err)
	require.Equal(t, retry.Scheduled, out)
	require.NoError(t, gc.Commit(ctx, "billing", "c1", ref, res.NextOffset))

	// The redelivered copy comes back on the retry topic, which the
	// coordinator assigns once it exists.
	rref := group.QueueRef{Topic: group.RetryTopic("billing"), Queue: 0}
	var again *core.StoredMessage
	require.Eventually(t, func() bool {
		if _, err := gc.Heartbeat(ctx, hbReq); err != nil {
			return false
		}
		res, err := gc.Pull(ctx, group.PullRequest{Group: "billing", ClientID: "c1", Queue: rref, Offset: -1, Wait: 50 * time.Millisecond})
		if err != nil || len(res.Messages) == 0 {
			return false
		}
		again = res.Messages[0]
		return true
	}, 10*time.Second, time.Millisecond)
	require.NotEqual(t, sent.ID, again.ID, "a copy")
	require.Equal(t, sent.ID, trace.IDOf(again))
	out, err = rs.SendBack(ctx, "billing", again, "boom again")
	require.NoError(t, err)
	require.Equal(t, retry.DeadLettered, out, "past MaxAttempts")

	// An untraced topic records nothing, whatever happens to it.
	pm, err := st.Get(ctx, plain.ID)
	require.NoError(t, err)
	_, err = rs.SendBack(ctx, "billing", pm, "nope")
	require.NoError(t, err)
	require.NoError(t, rs.DeadLetter(ctx, "billing", pm, "nope"))

	require.NoError(t, rec.Close()) // writes everything
	evs, err := trace.Lookup(ctx, st, sent.ID, 0)
	require.NoError(t, err)
	var got []string
	for _, e := range evs {
		got = append(got, e.Hop+" "+e.Attrs["attempt"])
	}
	require.Equal(t, []string{"delivered 1", "retry 1", "committed ", "delivered 2", "dead-letter 2"}, got)
	r := evs[1]
	require.Equal(t, "billing", r.Actor)
	require.Equal(t, "billing", r.Attrs["group"])
	require.Equal(t, "boom", r.Attrs["reason"])
	require.Equal(t, "scheduled", r.Attrs["outcome"])
	next, err := time.Parse(time.RFC3339Nano, r.Attrs["next_at"])
	require.NoError(t, err)
	require.False(t, evs[3].At.Before(next), "redelivered after the back-off")
	require.Equal(t, group.RetryTopic("billing"), evs[3].Attrs["topic"], "the copy, traced under the first ID")
	d := evs[4]
	require.Equal(t, "boom again", d.Attrs["reason"])
	require.Equal(t, retry.DLQTopic("billing"), d.Attrs["dlq"])

	none, err := trace.Lookup(ctx, st, plain.ID, 0)
	require.NoError(t, err)
	require.Empty(t, none)
}
