package pop

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// TestPopOfLargeMessagesStaysWithinMaxBytes: with a 3 MiB message in each
// of four queues and two in a fifth, every Pop (Max 32) hands out one of
// them — two would exceed DefaultMaxBytes, and a wire answer must fit its
// frame — so six Pops hand out the six, each once, and nothing is left.
// The first message of a Pop comes whatever its size (MaxBytes 1), small
// messages still come many at a time, and an orderly queue's failed
// message comes back first, alone.
func TestPopOfLargeMessagesStaysWithinMaxBytes(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, "", fastRetry, fastPop)
	e.createTopic(t, "big", 5)
	body := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 3<<20) }
	for i := range 4 {
		_, err := e.b.Produce(ctx, &core.Message{Topic: "big", Body: body(i)}) // round-robin: queues 0..3
		require.NoError(t, err)
	}
	for i := 4; i < 6; i++ {
		_, err := e.b.Produce(ctx, &core.Message{Topic: "big", ShardingKey: "k", Body: body(i)})
		require.NoError(t, err)
	}
	seen := map[byte]bool{}
	for range 6 {
		got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "big", Max: 32})
		require.NoError(t, err)
		require.Len(t, got, 1, "one 3 MiB message per Pop: two exceed 4 MiB")
		b := got[0].Message.Body
		require.Len(t, b, 3<<20)
		require.False(t, seen[b[0]], "handed out twice")
		seen[b[0]] = true
		require.NoError(t, e.s.Ack(ctx, got[0].Handle))
	}
	require.Len(t, seen, 6)
	got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "big", Max: 32})
	require.NoError(t, err)
	require.Empty(t, got)

	e.produce(t, "big", "small", 20)
	got, err = e.s.Pop(ctx, Request{Group: "g", Topic: "big", Max: 32, MaxBytes: 1})
	require.NoError(t, err)
	require.Len(t, got, 1, "MaxBytes 1: the first message only")
	require.NoError(t, e.s.Ack(ctx, got[0].Handle))
	got, err = e.s.Pop(ctx, Request{Group: "g", Topic: "big", Max: 32})
	require.NoError(t, err)
	require.Len(t, got, 19, "small messages come many at a time")

	// Orderly: two 3 MiB messages of one key, the first failed once.
	e.createTopic(t, "ord", 1)
	for i := range 2 {
		_, err := e.b.Produce(ctx, &core.Message{Topic: "ord", ShardingKey: "k", Body: body(i)})
		require.NoError(t, err)
	}
	first := pop1(t, e.s, Request{Group: "o", Topic: "ord", Max: 32, Orderly: true, Invisible: 20 * time.Millisecond})
	require.Equal(t, byte('a'), first.Message.Body[0])
	var again []Popped
	require.Eventually(t, func() bool { // once its invisible time passed: not acknowledged
		var err error
		again, err = e.s.Pop(ctx, Request{Group: "o", Topic: "ord", Max: 32, Orderly: true, Invisible: time.Minute})
		return err == nil && len(again) > 0
	}, waitFor, 10*time.Millisecond)
	require.Len(t, again, 1, "the redelivered message alone: the next would exceed the bytes")
	require.Equal(t, byte('a'), again[0].Message.Body[0], "the failed message again, first")
	require.NoError(t, e.s.Ack(ctx, again[0].Handle))
	second := pop1(t, e.s, Request{Group: "o", Topic: "ord", Max: 32, Orderly: true})
	require.Equal(t, byte('b'), second.Message.Body[0])
}
