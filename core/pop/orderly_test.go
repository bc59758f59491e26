package pop

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/retry"
)

// TestOrderlyKeepsQueueOrderThroughFailures has three poppers consume three
// keys' messages in orderly mode, failing (not acking) the first delivery of
// every fourth message (seq 1, 5, 9, 13) and everything after it in its batch, as an orderly
// consumer must. Whenever a batch is handed out, each of its queues' first
// message must be the queue's oldest not yet acknowledged: nothing later is
// ever handed out while an earlier message is in flight.
func TestOrderlyKeepsQueueOrderThroughFailures(t *testing.T) {
	const perKey, poppers = 15, 3
	keys := []string{"k0", "k1", "k2"}
	e := newEnv(t, "", fastRetry, fastPop)
	e.createTopic(t, "ord", 3)
	for _, k := range keys {
		e.produce(t, "ord", k, perKey)
	}

	var mu sync.Mutex           // guards the fields below; held across Ack and its bookkeeping
	acked := map[int]int64{}    // queue → acknowledged prefix
	order := map[string][]int{} // key → seqs in ack order
	failedOnce := map[core.MessageID]bool{}
	var violations []string
	done := 0

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	for range poppers {
		wg.Go(func() {
			for ctx.Err() == nil {
				got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "ord", Orderly: true, Max: 4, Invisible: 100 * time.Millisecond, Wait: 50 * time.Millisecond})
				if err != nil {
					return
				}
				byQueue := map[int][]Popped{}
				mu.Lock()
				for _, p := range got {
					q := p.Message.Queue
					if len(byQueue[q]) == 0 && p.Message.QueueOffset != acked[q] {
						violations = append(violations, fmt.Sprintf("queue %d: handed out %d while %d not acked", q, p.Message.QueueOffset, acked[q]))
					}
					if n := len(byQueue[q]); n > 0 && p.Message.QueueOffset != byQueue[q][n-1].Message.QueueOffset+1 {
						violations = append(violations, fmt.Sprintf("queue %d: batch not contiguous", q))
					}
					byQueue[q] = append(byQueue[q], p)
				}
				mu.Unlock()
				for _, batch := range byQueue {
					for _, p := range batch {
						seq, _ := strconv.Atoi(p.Message.Properties["seq"])
						mu.Lock()
						if seq%4 == 1 && !failedOnce[p.Message.ID] {
							failedOnce[p.Message.ID] = true
							mu.Unlock()
							break // fail it and leave the rest of the queue's batch
						}
						err := e.s.Ack(ctx, p.Handle)
						if err == nil {
							acked[p.Message.Queue] = p.Message.QueueOffset + 1
							order[p.Message.ShardingKey] = append(order[p.Message.ShardingKey], seq)
							done++
							if failedOnce[p.Message.ID] && p.Attempt < 2 {
								violations = append(violations, "a failed message came back with attempt 1")
							}
						}
						mu.Unlock()
						if err != nil {
							if !errors.Is(err, ErrHandleExpired) {
								mu.Lock()
								violations = append(violations, err.Error())
								mu.Unlock()
							}
							break // too slow: it comes back, so must everything after it
						}
					}
				}
			}
		})
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return done == perKey*len(keys) || len(violations) > 0
	}, 20*time.Second, 5*time.Millisecond)
	cancel()
	wg.Wait()
	require.Empty(t, violations)
	want := make([]int, perKey)
	for i := range want {
		want[i] = i
	}
	for _, k := range keys {
		require.Equal(t, want, order[k], "key %s consumed in order", k)
	}
	require.Len(t, failedOnce, len(keys)*((perKey+2)/4))
	info, err := e.b.Topic(t.Context(), "ord")
	require.NoError(t, err)
	for q, r := range info.Ranges {
		if r.Max > 0 { // keys may share a queue
			require.Equal(t, r.Max, e.committed(t, "g", "ord", q))
		}
	}
	_, err = e.b.Topic(t.Context(), retry.RetryTopic("g"))
	require.ErrorIs(t, err, core.ErrTopicNotFound, "orderly failures are redelivered in place")
}

// TestOrderlyDeadLettersAndMovesOn: a message never acknowledged is handed
// out 1+MaxAttempts times in place, then dead-lettered, and the queue goes on.
func TestOrderlyDeadLettersAndMovesOn(t *testing.T) {
	ctx := t.Context()
	ropts := fastRetry
	ropts.MaxAttempts = 2
	e := newEnv(t, "", ropts, fastPop)
	e.createTopic(t, "ord", 1)
	sent := e.produce(t, "ord", "dev", 2)

	req := Request{Group: "g", Topic: "ord", Orderly: true, Max: 1, Invisible: 20 * time.Millisecond, Wait: waitFor}
	for attempt := 1; attempt <= 3; attempt++ {
		p := pop1(t, e.s, req)
		require.Equal(t, sent[0].ID, p.Message.ID, "attempt %d", attempt)
		require.Equal(t, attempt, p.Attempt)
		require.Equal(t, attempt-1, p.Message.ReconsumeCount)
		// A second orderly popper finds the queue locked.
		got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "ord", Orderly: true, Invisible: time.Minute})
		require.NoError(t, err)
		require.Empty(t, got)
	}
	p := pop1(t, e.s, req)
	require.Equal(t, sent[1].ID, p.Message.ID)
	require.Equal(t, 1, p.Attempt)
	require.NoError(t, e.s.Ack(ctx, p.Handle))

	dead, err := e.b.Read(ctx, core.ReadRequest{Topic: retry.DLQTopic("g"), Queue: 0})
	require.NoError(t, err)
	require.Len(t, dead.Messages, 1)
	require.Equal(t, sent[0].ID.String(), dead.Messages[0].Properties[retry.PropOriginID])
	require.Equal(t, 2, dead.Messages[0].ReconsumeCount)
	require.Equal(t, int64(2), e.committed(t, "g", "ord", 0))
}

// TestOrderlyAndPlainPopsShareNoQueue: a plain pop does not hand out a queue
// an orderly popper holds, nor the other way round.
func TestOrderlyAndPlainPopsShareNoQueue(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, "", fastRetry, fastPop)
	e.createTopic(t, "ord", 1)
	e.produce(t, "ord", "", 4)
	o := pop1(t, e.s, Request{Group: "g", Topic: "ord", Orderly: true, Max: 1, Invisible: time.Minute})
	got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "ord", Invisible: time.Minute})
	require.NoError(t, err)
	require.Empty(t, got)
	require.NoError(t, e.s.Ack(ctx, o.Handle))
	p := pop1(t, e.s, Request{Group: "g", Topic: "ord", Max: 1, Invisible: time.Minute})
	require.Equal(t, int64(1), p.Message.QueueOffset)
	got, err = e.s.Pop(ctx, Request{Group: "g", Topic: "ord", Orderly: true, Invisible: time.Minute})
	require.NoError(t, err)
	require.Empty(t, got)
}
