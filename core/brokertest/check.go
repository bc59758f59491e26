package brokertest

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

func mustGet(t testing.TB, b core.Broker, id core.MessageID) *core.StoredMessage {
	t.Helper()
	m, err := b.Get(t.Context(), id)
	require.NoError(t, err, "get %s", id)
	require.Equal(t, id, m.ID)
	return m
}

// readQueue reads a whole queue from its min offset on, checking that every
// message is where it says it is, within the queue's Range, that offsets
// are dense (increasing, with f.SparseOffsets), and that Backlog from the
// min counts what was read.
func readQueue(t testing.TB, f Factory, b core.Broker, topic string, q int) []*core.StoredMessage {
	t.Helper()
	var out []*core.StoredMessage
	var rg core.QueueRange
	off := int64(0)
	for {
		res, err := b.Read(t.Context(), core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 100})
		require.NoError(t, err, "read %s/%d@%d", topic, q, off)
		rg = res.Range
		for _, m := range res.Messages {
			require.Equal(t, topic, m.Topic)
			require.Equal(t, q, m.Queue)
			require.True(t, rg.Min <= m.QueueOffset && m.QueueOffset < rg.Max, "%s/%d: offset %d outside the range %v", topic, q, m.QueueOffset, rg)
			if len(out) > 0 {
				if f.SparseOffsets {
					require.Greater(t, m.QueueOffset, out[len(out)-1].QueueOffset, "%s/%d: queue offsets increase", topic, q)
				} else {
					require.Equal(t, out[len(out)-1].QueueOffset+1, m.QueueOffset, "%s/%d: queue offsets are dense", topic, q)
				}
			}
			out = append(out, m)
		}
		if res.NextOffset >= res.Range.Max {
			break
		}
		if f.SparseOffsets && len(res.Messages) == 0 {
			// The rest of the range holds other queues' messages only.
			require.Equal(t, max(off, rg.Min), res.NextOffset, "%s/%d: a read that found nothing stays at the (clamped) offset", topic, q)
			break
		}
		require.Greater(t, res.NextOffset, off, "%s/%d: Read below the max makes progress", topic, q)
		off = res.NextOffset
	}
	n, err := b.Backlog(t.Context(), topic, q, rg.Min)
	require.NoError(t, err, "Backlog %s/%d@%d", topic, q, rg.Min)
	require.Equal(t, int64(len(out)), n, "%s/%d: Backlog from the min counts the queue's messages", topic, q)
	return out
}

// requireOffsets checks that each queue q of topic holds messages at exactly
// the offsets want[q] (increasing), all within the queue's Range, and that
// Backlog from every offset around the Range counts those at or after it.
// It returns the topic as Topic describes it.
func requireOffsets(t testing.TB, f Factory, b core.Broker, topic string, want [][]int64) core.TopicInfo {
	t.Helper()
	ctx := t.Context()
	info, err := b.Topic(ctx, topic)
	require.NoError(t, err)
	require.Len(t, info.Ranges, len(want), "topic %s", topic)
	empty := true
	for _, offs := range want {
		empty = empty && len(offs) == 0
	}
	for q, offs := range want {
		rg := info.Ranges[q]
		require.LessOrEqual(t, rg.Min, rg.Max, "%s/%d: range %v", topic, q, rg)
		if !f.SparseOffsets {
			require.Equal(t, int64(len(offs)), rg.Max-rg.Min, "%s/%d: range %v holds dense offsets %v", topic, q, rg, offs)
		}
		if empty {
			require.Equal(t, rg.Min, rg.Max, "%s/%d: an empty topic's range %v", topic, q, rg)
		}
		var got []int64
		for _, m := range readQueue(t, f, b, topic, q) {
			got = append(got, m.QueueOffset)
		}
		require.Equal(t, len(offs), len(got), "%s/%d: offsets %v, read %v", topic, q, offs, got)
		if len(offs) > 0 {
			require.Equal(t, offs, got, "%s/%d: the messages are where their SendResults said", topic, q)
		}
		for o := rg.Min - 1; o <= rg.Max+1; o++ {
			n, err := b.Backlog(ctx, topic, q, o)
			require.NoError(t, err, "Backlog %s/%d@%d", topic, q, o)
			var at int64 // messages at offsets ≥ o
			for _, x := range offs {
				if x >= o {
					at++
				}
			}
			require.Equal(t, at, n, "%s/%d: Backlog from %d, range %v, offsets %v", topic, q, o, rg, offs)
		}
	}
	return info
}

// requireSameMessage checks that got carries what want was sent with. A
// zero BornAt means "now", so any non-zero time is accepted for it; nil and
// empty are the same for keys, properties and the body.
func requireSameMessage(t testing.TB, want *core.Message, got *core.StoredMessage) {
	t.Helper()
	require.Equal(t, want.Topic, got.Topic, "Topic")
	require.Equal(t, want.ShardingKey, got.ShardingKey, "ShardingKey")
	require.Equal(t, want.Tag, got.Tag, "Tag")
	require.Equal(t, len(want.Keys), len(got.Keys), "Keys: %q, got %q", want.Keys, got.Keys)
	if len(want.Keys) > 0 {
		require.Equal(t, want.Keys, got.Keys, "Keys")
	}
	require.Equal(t, len(want.Properties), len(got.Properties), "Properties: %q, got %q", want.Properties, got.Properties)
	if len(want.Properties) > 0 {
		require.Equal(t, want.Properties, got.Properties, "Properties")
	}
	require.True(t, bytes.Equal(want.Body, got.Body), "Body: %d bytes sent, %d bytes stored", len(want.Body), len(got.Body))
	if want.BornAt.IsZero() {
		require.False(t, got.BornAt.IsZero(), "BornAt: zero means now")
	} else {
		require.True(t, want.BornAt.Equal(got.BornAt), "BornAt: %v, got %v", want.BornAt, got.BornAt)
	}
	require.Equal(t, want.DeliverAt.IsZero(), got.DeliverAt.IsZero(), "DeliverAt: %v, got %v", want.DeliverAt, got.DeliverAt)
	require.True(t, want.DeliverAt.Equal(got.DeliverAt), "DeliverAt: %v, got %v", want.DeliverAt, got.DeliverAt)
	require.Equal(t, want.ReconsumeCount, got.ReconsumeCount, "ReconsumeCount")
}

// requireMatchesResult checks that a stored message is where its SendResult
// said.
func requireMatchesResult(t testing.TB, f Factory, r core.SendResult, got *core.StoredMessage) {
	t.Helper()
	require.Equal(t, r.ID, got.ID, "ID")
	require.Equal(t, r.Topic, got.Topic, "Topic")
	require.Equal(t, r.Queue, got.Queue, "Queue")
	require.Equal(t, r.QueueOffset, got.QueueOffset, "QueueOffset")
	require.Equal(t, r.CommitLogOffset, got.CommitLogOffset, "CommitLogOffset")
	if f.StoredAtSkew > 0 {
		d := r.StoredAt.Sub(got.StoredAt).Abs()
		require.LessOrEqual(t, d, f.StoredAtSkew, "StoredAt: result %v, stored %v", r.StoredAt, got.StoredAt)
	} else {
		require.True(t, r.StoredAt.Equal(got.StoredAt), "StoredAt: result %v, stored %v", r.StoredAt, got.StoredAt)
	}
}

// requireSameStored checks that two reads of one stored message agree.
func requireSameStored(t testing.TB, want, got *core.StoredMessage) {
	t.Helper()
	require.NotNil(t, want)
	require.NotNil(t, got)
	requireSameMessage(t, &want.Message, got)
	require.True(t, want.BornAt.Equal(got.BornAt), "BornAt: %v, got %v", want.BornAt, got.BornAt)
	require.Equal(t, want.ID, got.ID, "ID")
	require.Equal(t, want.Queue, got.Queue, "Queue")
	require.Equal(t, want.QueueOffset, got.QueueOffset, "QueueOffset")
	require.Equal(t, want.CommitLogOffset, got.CommitLogOffset, "CommitLogOffset")
	require.Equal(t, want.Size, got.Size, "Size")
	require.True(t, want.StoredAt.Equal(got.StoredAt), "StoredAt: %v, got %v", want.StoredAt, got.StoredAt)
}

// requireStoredInKeyOrder reads every queue of topic and checks that each
// sharding key's messages come in the order of their bodies (decimal
// sequence numbers, increasing per key), that the topic holds exactly the
// messages of results, and that each is stored where its SendResult says.
// results[i] are the results of one producer (a call, a worker: who names
// it in failures).
func requireStoredInKeyOrder(t testing.TB, f Factory, b core.Broker, topic string, queues int, who string, results [][]core.SendResult) {
	t.Helper()
	stored := map[queueOffset]core.MessageID{}
	for q := range queues {
		last := map[string]int{}
		for _, m := range readQueue(t, f, b, topic, q) { // readQueue checks offsets are dense (increasing if sparse)
			seq, err := strconv.Atoi(string(m.Body))
			require.NoError(t, err)
			if p, ok := last[m.ShardingKey]; ok {
				require.Less(t, p, seq, "key %s: message %d read after %d", m.ShardingKey, seq, p)
			}
			last[m.ShardingKey] = seq
			stored[queueOffset{q, m.QueueOffset}] = m.ID
		}
	}
	total := 0
	for _, res := range results {
		total += len(res)
	}
	require.Len(t, stored, total, "the topic holds the messages produced")
	for i, res := range results {
		for j, r := range res {
			require.Equal(t, r.ID, stored[queueOffset{r.Queue, r.QueueOffset}], "%s %d message %d: stored where its SendResult says", who, i, j)
		}
	}
}

// queueOffset names a message by queue and offset.
type queueOffset struct {
	queue  int
	offset int64
}
