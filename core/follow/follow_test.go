package follow

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Run hands batches to the step in order, commits what the step returns,
// wakes on arrivals, and resumes from the committed offset after a restart.
func TestRunFollowsAndCommits(t *testing.T) {
	st, err := store.Open(t.TempDir(), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	_, err = st.CreateTopic(t.Context(), core.TopicConfig{Name: "%Q%", Queues: 1})
	require.NoError(t, err)
	produce := func(body string) {
		_, err := st.Produce(t.Context(), &core.Message{Topic: "%Q%", Body: []byte(body)})
		require.NoError(t, err)
	}
	produce("a")
	produce("b")

	// run follows the queue until the step has seen n messages; the step
	// sends each body to seen.
	run := func(n int, seen chan<- string) {
		q := Queue{Broker: st, Topic: "%Q%", Group: "%G%", Batch: 1, Poll: time.Hour, Name: "test messages"}
		count := 0
		q.Run(t.Context(), func(_ context.Context, _ *time.Timer, msgs []*core.StoredMessage) (int64, bool) {
			seen <- string(msgs[0].Body)
			count++
			return msgs[0].QueueOffset + 1, count < n
		})
	}
	seen := make(chan string, 8)
	run(1, seen)
	require.Equal(t, "a", <-seen)
	off, err := st.CommittedOffset(t.Context(), "%G%", "%Q%", 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, off, "committed past what the step finished")

	done := make(chan struct{})
	go func() {
		defer close(done)
		run(2, seen)
	}()
	require.Equal(t, "b", <-seen, "resumes from the committed offset")
	produce("c") // Poll is an hour: only the arrival wakes it
	select {
	case got := <-seen:
		require.Equal(t, "c", got)
	case <-time.After(10 * time.Second):
		t.Fatal("an arrival did not wake the follower")
	}
	<-done
}

func TestPauseEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	require.False(t, Pause(ctx, timer, nil, time.Hour))
	wake := make(chan struct{})
	close(wake)
	require.True(t, Pause(t.Context(), timer, wake, time.Hour))
	require.True(t, Pause(t.Context(), timer, nil, time.Millisecond))
}
