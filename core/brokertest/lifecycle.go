package brokertest

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// testRestart: everything acknowledged before a restart is there after it.
func testRestart(t *testing.T, f Factory) {
	if f.Reopen == nil {
		t.Skip("brokertest: capability Reopen (restart) not provided")
	}
	ctx := t.Context()
	b := f.Open(t)
	createTopic(t, b, "r3", 3)
	createTopic(t, b, "r-default", 0)

	var sent []core.SendResult
	for i := range 12 {
		sent = append(sent, produce(t, b, &core.Message{Topic: "r3", ShardingKey: "k" + strconv.Itoa(i%4), Keys: []string{"o-" + strconv.Itoa(i)},
			Tag: "t", Properties: map[string]string{"i": strconv.Itoa(i)}, Body: []byte(strconv.Itoa(i))}))
	}
	batch := []*core.Message{{Topic: "r-default", Body: []byte("b0")}, {Topic: "r-default", Body: nil}, {Topic: "r3", ShardingKey: "k1", Body: []byte("b2")}}
	res, err := b.ProduceBatch(ctx, batch)
	require.NoError(t, err)
	sent = append(sent, res...)
	sent = append(sent, produceAsync(t, b, []*core.Message{{Topic: "r-default", Body: []byte("async")}})...)

	before := map[core.MessageID]*core.StoredMessage{}
	for _, r := range sent {
		before[r.ID] = mustGet(t, b, r.ID)
	}
	topicsBefore, err := b.Topics(ctx)
	require.NoError(t, err)
	queuesBefore := map[string][][]core.MessageID{}
	for _, ti := range topicsBefore {
		for q := range ti.Queues {
			var ids []core.MessageID
			for _, m := range readQueue(t, f, b, ti.Name, q) {
				ids = append(ids, m.ID)
			}
			queuesBefore[ti.Name] = append(queuesBefore[ti.Name], ids)
		}
	}

	b = f.Reopen(t, b)

	topicsAfter, err := b.Topics(ctx)
	require.NoError(t, err)
	require.Len(t, topicsAfter, len(topicsBefore))
	for i, ti := range topicsAfter {
		was := topicsBefore[i]
		require.Equal(t, was.Name, ti.Name)
		require.Equal(t, was.Queues, ti.Queues, "topic %s keeps its queue count", ti.Name)
		require.Equal(t, was.Ranges, ti.Ranges, "topic %s keeps its messages", ti.Name)
		require.True(t, was.CreatedAt.Equal(ti.CreatedAt), "topic %s: created %v, after restart %v", ti.Name, was.CreatedAt, ti.CreatedAt)
		for q := range ti.Queues {
			var ids []core.MessageID
			for _, m := range readQueue(t, f, b, ti.Name, q) {
				requireSameStored(t, before[m.ID], m)
				ids = append(ids, m.ID)
			}
			require.Equal(t, queuesBefore[ti.Name][q], ids, "topic %s queue %d", ti.Name, q)
		}
	}
	for _, r := range sent {
		requireSameStored(t, before[r.ID], mustGet(t, b, r.ID))
	}
	found, err := b.FindByKey(ctx, "r3", "o-5", core.KeyQuery{})
	require.NoError(t, err)
	require.Len(t, found, 1)
	require.Equal(t, sent[5].ID, found[0].ID)

	// Appends go on where they stopped, with IDs never issued before.
	r := produce(t, b, &core.Message{Topic: "r3", ShardingKey: "k0"})
	info, err := b.Topic(ctx, "r3")
	require.NoError(t, err)
	if f.SparseOffsets {
		var was core.QueueRange
		for _, ti := range topicsBefore {
			if ti.Name == "r3" {
				was = ti.Ranges[r.Queue]
			}
		}
		require.GreaterOrEqual(t, r.QueueOffset, was.Max, "after the queue's range before the restart %v", was)
		require.Less(t, r.QueueOffset, info.Ranges[r.Queue].Max)
	} else {
		require.Equal(t, int64(len(queuesBefore["r3"][r.Queue])), r.QueueOffset)
		require.Equal(t, r.QueueOffset+1, info.Ranges[r.Queue].Max)
	}
	n, err := b.Backlog(ctx, "r3", r.Queue, info.Ranges[r.Queue].Min)
	require.NoError(t, err)
	require.Equal(t, int64(len(queuesBefore["r3"][r.Queue])+1), n, "Backlog of the queue from its min")
	n, err = b.Backlog(ctx, "r3", r.Queue, r.QueueOffset)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "Backlog from the new message")
	requireMatchesResult(t, f, r, mustGet(t, b, r.ID))
	require.NotContains(t, before, r.ID, "an ID is unique for the life of the engine")
}

// testClose: after Close every method fails with ErrClosed, and what was
// acknowledged before is kept.
func testClose(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	createTopic(t, b, "c", 1)
	r := produce(t, b, &core.Message{Topic: "c", ShardingKey: "k", Body: []byte("kept")})
	require.NoError(t, b.CommitOffset(ctx, "g", "c", 0, 1))

	require.NoError(t, b.Close())
	require.NotPanics(t, func() { _ = b.Close() }, "a second Close")

	closed := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, core.ErrClosed, "%s after Close", what)
	}
	m := &core.Message{Topic: "c", Body: []byte("late")}
	_, err := b.Produce(ctx, m)
	closed("Produce", err)
	_, err = b.ProduceBatch(ctx, []*core.Message{m})
	closed("ProduceBatch", err)
	_, err = awaitAsync(t, b, []*core.Message{m})
	closed("ProduceAsync", err)
	_, err = b.CreateTopic(ctx, core.TopicConfig{Name: "c2", Queues: 1})
	closed("CreateTopic", err)
	_, err = b.Topic(ctx, "c")
	closed("Topic", err)
	_, err = b.Topics(ctx)
	closed("Topics", err)
	_, err = b.Read(ctx, core.ReadRequest{Topic: "c"})
	closed("Read", err)
	_, err = b.Get(ctx, r.ID)
	closed("Get", err)
	_, err = b.FindByKey(ctx, "c", "k", core.KeyQuery{})
	closed("FindByKey", err)
	_, err = b.OffsetAt(ctx, "c", 0, time.Now())
	closed("OffsetAt", err)
	_, err = b.Backlog(ctx, "c", 0, 0)
	closed("Backlog", err)
	closed("CommitOffset", b.CommitOffset(ctx, "g", "c", 0, 1))
	_, err = b.CommittedOffset(ctx, "g", "c", 0)
	closed("CommittedOffset", err)
	if !f.NoDeleteTopic {
		closed("DeleteTopic", b.DeleteTopic(ctx, "c"))
	}

	if f.Reopen == nil {
		return
	}
	b = f.Reopen(t, b) // b is closed already: Reopen only reopens
	got := mustGet(t, b, r.ID)
	require.Equal(t, "kept", string(got.Body), "acknowledged before Close, readable after")
	o, err := b.CommittedOffset(ctx, "g", "c", 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), o)
}
