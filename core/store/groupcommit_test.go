package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// A producer alone, waiting for each ack before the next produce, is never
// kept waiting for company: with a group-commit delay of an hour, 50
// produces in a row are each acknowledged at once, each after its own
// fsync.
func TestGroupCommitNeverHoldsALoneProducer(t *testing.T) {
	s := openT(t, "", Options{FlushPolicy: FlushSync, GroupCommitDelay: time.Hour})
	before := s.Stats().Fsyncs
	for i := range 50 {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		_, err := s.Produce(ctx, msg("lone", "k", i))
		cancel()
		require.NoError(t, err, "produce %d", i)
	}
	require.Equal(t, int64(50), s.Stats().Fsyncs-before)
}

// Once produces overlap, the writer waits for more to join the batch: 31
// produces stay unacknowledged and unsynced (the delay is an hour), the
// 32nd (groupCommitEnough) makes the batch go, and all 32 share one fsync.
// Close during such a wait writes, fsyncs and acknowledges what waits.
func TestGroupCommitWaitsForOverlappingProduces(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{FlushPolicy: FlushSync, GroupCommitDelay: time.Hour})
	first, err := s.Produce(t.Context(), msg("g", "k", 0)) // creates the topic, outside the batch
	require.NoError(t, err)

	s.appendMu.Lock()
	s.overlapping = true // as after a cycle that served several producers
	s.appendMu.Unlock()
	before := s.Stats().Fsyncs
	done := make(chan error, groupCommitEnough)
	produce := func(i int) {
		s.ProduceAsync([]*core.Message{msg("g", "k", i)}, func(_ []core.SendResult, err error) { done <- err })
	}
	for i := 1; i < groupCommitEnough; i++ {
		produce(i)
	}
	// Were the writer not waiting, it would have synced within this bound.
	require.Never(t, func() bool { return s.Stats().Fsyncs != before || len(done) > 0 }, 50*time.Millisecond, time.Millisecond,
		"a batch smaller than groupCommitEnough was synced or acknowledged before its delay")
	require.Equal(t, before, s.Stats().Fsyncs, "a batch smaller than groupCommitEnough went before its delay")
	require.Empty(t, done, "acknowledged before the batch was synced")
	produce(groupCommitEnough)
	for range groupCommitEnough {
		require.NoError(t, <-done)
	}
	require.Equal(t, before+1, s.Stats().Fsyncs, "32 overlapping produces, one fsync")

	// Close while the writer waits for company.
	s.appendMu.Lock()
	s.overlapping = true
	s.appendMu.Unlock()
	for i := range 5 {
		produce(100 + i)
	}
	require.NoError(t, s.Close())
	for range 5 {
		require.NoError(t, <-done)
	}
	r := openT(t, dir, Options{FlushPolicy: FlushSync})
	got := readAll(t, r, "g", first.Queue)
	require.Len(t, got, 1+groupCommitEnough+5)
	require.Equal(t, []byte(fmt.Sprintf("body-%d", 104)), got[len(got)-1].Body)
}
