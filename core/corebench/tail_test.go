package corebench_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/corebench"
	"github.com/ferrymq/ferrymq/core/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunTailWithBacklog: against a real server, the tail group receives
// what the producers send at the rate asked for, with latencies measured
// from the store time; the backlog group replays the backlog topic from
// its first message, and the window closes when it has it all.
func TestRunTailWithBacklog(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	_, err := env.Store.CreateTopic(t.Context(), core.TopicConfig{Name: "old", Queues: 2})
	require.NoError(t, err)
	msgs := make([]*core.Message, 100)
	for i := range msgs {
		msgs[i] = &core.Message{Topic: "old", Body: make([]byte, 2000)}
	}
	for range 30 {
		_, err := env.Store.ProduceBatch(t.Context(), msgs)
		require.NoError(t, err)
	}
	res, err := corebench.RunTail(t.Context(), corebench.TailOptions{Addr: env.Addr, Topic: "new", Queues: 2, Rate: 1000, Size: 100,
		Producers: 2, Warmup: 300 * time.Millisecond, Duration: 20 * time.Second, BacklogTopic: "old"})
	require.NoError(t, err)
	require.NotNil(t, res.Backlog)
	require.True(t, res.Backlog.Done, "the whole backlog came before the window's end")
	require.Equal(t, int64(3000), res.Backlog.Total)
	require.LessOrEqual(t, res.Backlog.Messages, int64(3000))
	require.Equal(t, res.Backlog.Messages*2000, res.Backlog.Bytes)
	require.Positive(t, res.Backlog.MBPerSec)
	require.Less(t, res.Window, 20.0)

	res, err = corebench.RunTail(t.Context(), corebench.TailOptions{Addr: env.Addr, Topic: "new", Queues: 2, Rate: 1000, Size: 100,
		Producers: 2, Warmup: 300 * time.Millisecond, Duration: time.Second})
	require.NoError(t, err)
	require.Nil(t, res.Backlog)
	require.InDelta(t, 1.0, res.Window, 0.5)
	require.Greater(t, res.Received, int64(300), "about a thousand in the second")
	require.GreaterOrEqual(t, res.Sent, res.Received)
	require.Positive(t, res.P50us)
	require.GreaterOrEqual(t, res.P99us, res.P50us)
	require.GreaterOrEqual(t, res.MaxUs, res.P999us)

	_, err = corebench.RunTail(t.Context(), corebench.TailOptions{Addr: env.Addr, Topic: "new", BacklogTopic: "new"})
	require.ErrorContains(t, err, "must not be the tail topic")
	_, err = corebench.RunTail(t.Context(), corebench.TailOptions{Addr: env.Addr, Topic: "new", BacklogTopic: "missing", Warmup: time.Millisecond})
	require.ErrorIs(t, err, core.ErrTopicNotFound)
}

// TestRunReplay: against a real server, a replay receives the whole topic
// from its first message and says so; cut short by its context, it
// returns what it had, not an error; an empty or missing topic is refused.
func TestRunReplay(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	msgs := make([]*core.Message, 100)
	for i := range msgs {
		msgs[i] = &core.Message{Topic: "old", Body: make([]byte, 2000)}
	}
	for range 30 {
		_, err := env.Store.ProduceBatch(t.Context(), msgs)
		require.NoError(t, err)
	}
	var started strings.Builder
	res, err := corebench.RunReplay(t.Context(), corebench.ReplayOptions{Addr: env.Addr, Topic: "old", Consumers: 2, Started: &started})
	require.NoError(t, err)
	require.True(t, res.Done)
	require.Equal(t, int64(3000), res.Total)
	require.Equal(t, int64(3000), res.Messages)
	require.Equal(t, int64(3000*2000), res.Bytes)
	require.Positive(t, res.MBPerSec)
	require.Contains(t, started.String(), "first message")

	// Interrupted at its first message (the Started line cancels it): the
	// result so far, no error.
	ctx, cancel := context.WithCancel(t.Context())
	res, err = corebench.RunReplay(ctx, corebench.ReplayOptions{Addr: env.Addr, Topic: "old", Started: cancelWriter(cancel)})
	require.NoError(t, err)
	require.Positive(t, res.Messages)
	require.LessOrEqual(t, res.Messages, int64(3000))
	require.Equal(t, res.Messages*2000, res.Bytes)

	_, err = corebench.RunReplay(t.Context(), corebench.ReplayOptions{Addr: env.Addr, Topic: "missing"})
	require.ErrorIs(t, err, core.ErrTopicNotFound)
	_, err = env.Store.CreateTopic(t.Context(), core.TopicConfig{Name: "empty", Queues: 1})
	require.NoError(t, err)
	_, err = corebench.RunReplay(t.Context(), corebench.ReplayOptions{Addr: env.Addr, Topic: "empty"})
	require.ErrorContains(t, err, "is empty")
}

// cancelWriter cancels at its first write.
type cancelWriter context.CancelFunc

func (c cancelWriter) Write(p []byte) (int, error) { c(); return len(p), nil }
