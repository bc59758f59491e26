package brokertest

import (
	"errors"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// testResizeTopic: ResizeTopic grows and shrinks a topic in use. After
// each change produces go to the new count's queues, the queues a shrink
// retired stay readable, TopicInfo.Epochs tells where each epoch began —
// every message at or above an epoch's Begin in its queue was routed with
// that epoch's count, every one below with an earlier one — reads honour
// Until and report the epochs they cover, and a restart keeps it all.
func testResizeTopic(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic = "elastic"
	_, err := b.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 3})
	require.NoError(t, err)
	if f.NoResize {
		_, err := b.ResizeTopic(ctx, topic, 6)
		require.ErrorIs(t, err, errors.ErrUnsupported)
		info, err := b.Topic(ctx, topic)
		require.NoError(t, err)
		require.Equal(t, 3, info.Queues)
		return
	}

	sent := 0
	produce := func(n int) {
		t.Helper()
		for range n {
			key := "dev-" + strconv.Itoa(sent%23)
			_, err := b.Produce(ctx, &core.Message{Topic: topic, ShardingKey: key, Body: []byte(strconv.Itoa(sent))})
			require.NoError(t, err)
			sent++
		}
	}
	produce(40)
	before, err := b.Topic(ctx, topic)
	require.NoError(t, err)
	require.Len(t, before.Epochs, 1, "a topic never resized has one epoch")
	require.Equal(t, 3, before.Epochs[0].Queues)
	// Each queue's next offset: one past its last message. With dense
	// offsets that is the end of its range; with sparse ones (the queues
	// share a sequence) the range ends at the topic's last message.
	var next [3]int64
	for q := range 3 {
		res, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: before.Ranges[q].Min, MaxCount: 1000})
		require.NoError(t, err)
		require.NotEmpty(t, res.Messages, "queue %d", q)
		next[q] = res.Messages[len(res.Messages)-1].QueueOffset + 1
		if !f.SparseOffsets {
			require.Equal(t, before.Ranges[q].Max, next[q], "queue %d", q)
		}
	}

	grown, err := b.ResizeTopic(ctx, topic, 6)
	require.NoError(t, err)
	require.Equal(t, 6, grown.Queues)
	require.Len(t, grown.Ranges, 6)
	require.Len(t, grown.Epochs, 2)
	require.Equal(t, 6, grown.Epochs[1].Queues)
	require.GreaterOrEqual(t, len(grown.Epochs[1].Begin), 6, "Begin covers every queue of the epoch and the one before")
	for q := range 3 {
		require.Equal(t, next[q], grown.Epochs[1].Begin[q], "queue %d: the epoch begins where the queue ended", q)
	}
	produce(60)

	same, err := b.ResizeTopic(ctx, topic, 6)
	require.NoError(t, err, "the same count again")
	require.Len(t, same.Epochs, 2, "the same count changes nothing")
	_, err = b.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 6})
	require.NoError(t, err, "CreateTopic compares with the count in force")
	_, err = b.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 3})
	require.ErrorIs(t, err, core.ErrTopicExists)

	shrunk, err := b.ResizeTopic(ctx, topic, 2)
	require.NoError(t, err)
	require.Equal(t, 2, shrunk.Queues)
	require.Len(t, shrunk.Ranges, 6, "the retired queues still hold messages and stay readable")
	require.Len(t, shrunk.Epochs, 3)
	produce(50)

	for name, queues := range map[string]int{"%RETRY%g": 2, "bad name": 2, topic: 0} {
		_, err := b.ResizeTopic(ctx, name, queues)
		require.ErrorIs(t, err, core.ErrInvalidTopic, "%q to %d", name, queues)
	}
	_, err = b.ResizeTopic(ctx, topic, core.MaxQueues+1)
	require.ErrorIs(t, err, core.ErrInvalidTopic)
	_, err = b.ResizeTopic(ctx, "no-such-topic", 2)
	require.ErrorIs(t, err, core.ErrTopicNotFound)

	check := func(b core.Broker) {
		t.Helper()
		info, err := b.Topic(ctx, topic)
		require.NoError(t, err)
		require.Equal(t, 2, info.Queues)
		require.Len(t, info.Epochs, 3)
		require.Len(t, info.Ranges, 6)
		got := 0
		for q := range info.Ranges {
			for off := info.Ranges[q].Min; ; {
				res, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 64})
				require.NoError(t, err)
				require.Equal(t, 3, res.Epochs, "a read reports the epochs it covers")
				for _, m := range res.Messages {
					e := epochOf(info.Epochs, q, m.QueueOffset)
					require.Equal(t, core.QueueFor(m.ShardingKey, info.Epochs[e].Queues), q,
						"message %s at %d/%d is of epoch %d (%d queues)", m.Body, q, m.QueueOffset, e, info.Epochs[e].Queues)
					got++
				}
				if res.NextOffset == off {
					break
				}
				off = res.NextOffset
			}
		}
		require.Equal(t, sent, got, "every message is in one queue")

		// Until stops a read at an epoch's beginning.
		q0 := info.Epochs[2].Begin[0]
		res, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: 0, Offset: info.Ranges[0].Min, MaxCount: 1000, Until: q0})
		require.NoError(t, err)
		require.LessOrEqual(t, res.NextOffset, q0)
		for _, m := range res.Messages {
			require.Less(t, m.QueueOffset, q0)
		}
		all, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: 0, Offset: info.Ranges[0].Min, MaxCount: 1000})
		require.NoError(t, err)
		require.Greater(t, len(all.Messages), len(res.Messages), "queue 0 has messages of the last epoch")

		// A retired queue takes commits like any other.
		require.NoError(t, b.CommitOffset(ctx, "g", topic, 5, info.Ranges[5].Max))
		off, err := b.CommittedOffset(ctx, "g", topic, 5)
		require.NoError(t, err)
		require.Equal(t, info.Ranges[5].Max, off)
	}
	check(b)
	if f.Reopen != nil {
		b = f.Reopen(t, b)
		check(b)
		produce(10) // the count in force after the restart is the last one
		info, err := b.Topic(ctx, topic)
		require.NoError(t, err)
		require.Equal(t, 2, info.Queues)
		for q := 2; q < 6; q++ {
			n, err := b.Backlog(ctx, topic, q, info.Epochs[2].Begin[q])
			require.NoError(t, err)
			require.Zero(t, n, "retired queue %d took nothing after the restart", q)
		}
	}
}

// epochOf is the epoch a message at offset off of queue q was written in.
func epochOf(epochs []core.Epoch, q int, off int64) int {
	e := 0
	for i := 1; i < len(epochs); i++ {
		if q < len(epochs[i].Begin) && off >= epochs[i].Begin[q] {
			e = i
		}
	}
	return e
}
