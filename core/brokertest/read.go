package brokertest

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// testRead: Read's offsets, bounds, clamping, tag filter and errors.
func testRead(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic = "read"
	createTopic(t, b, topic, 1)
	var sent []core.SendResult
	for i := range 10 {
		// Bodies of equal length: records of equal size.
		sent = append(sent, produce(t, b, &core.Message{Topic: topic, Tag: "t" + strconv.Itoa(i%3), Body: fmt.Appendf(nil, "m-%02d", i)}))
	}
	full := core.QueueRange{Min: 0, Max: 10}
	read := func(req core.ReadRequest) core.ReadResult {
		t.Helper()
		req.Topic = topic
		res, err := b.Read(ctx, req)
		require.NoError(t, err)
		require.Equal(t, full, res.Range)
		for _, m := range res.Messages {
			require.Equal(t, topic, m.Topic)
			require.Equal(t, 0, m.Queue)
			require.Equal(t, sent[m.QueueOffset].ID, m.ID, "offset %d", m.QueueOffset)
			require.Equal(t, fmt.Sprintf("m-%02d", m.QueueOffset), string(m.Body))
			require.Equal(t, "t"+strconv.Itoa(int(m.QueueOffset%3)), m.Tag)
		}
		return res
	}
	offsets := func(res core.ReadResult) []int64 {
		var out []int64
		for _, m := range res.Messages {
			out = append(out, m.QueueOffset)
		}
		return out
	}

	res := read(core.ReadRequest{Offset: 0, MaxCount: 3})
	require.Equal(t, []int64{0, 1, 2}, offsets(res))
	require.Equal(t, int64(3), res.NextOffset)
	require.False(t, res.Clamped)
	requireSameStored(t, mustGet(t, b, sent[0].ID), res.Messages[0])

	res = read(core.ReadRequest{Offset: 3, MaxCount: 100})
	require.Equal(t, []int64{3, 4, 5, 6, 7, 8, 9}, offsets(res))
	require.Equal(t, int64(10), res.NextOffset)
	require.False(t, res.Clamped)

	res = read(core.ReadRequest{Offset: 10})
	require.Empty(t, res.Messages, "at the max: nothing yet")
	require.Equal(t, int64(10), res.NextOffset)
	require.False(t, res.Clamped, "the max itself is in range")

	res = read(core.ReadRequest{Offset: 15})
	require.Empty(t, res.Messages)
	require.Equal(t, int64(10), res.NextOffset, "above the max: moved down to it")
	require.True(t, res.Clamped)

	res = read(core.ReadRequest{Offset: -3, MaxCount: 2})
	require.Equal(t, []int64{0, 1}, offsets(res), "below the min: moved up to it")
	require.Equal(t, int64(2), res.NextOffset)
	require.True(t, res.Clamped)

	// MaxBytes bounds the stored size, but one message always comes.
	res = read(core.ReadRequest{Offset: 4, MaxBytes: 1})
	require.Equal(t, []int64{4}, offsets(res), "at least one message")
	require.Equal(t, int64(5), res.NextOffset)
	two := read(core.ReadRequest{Offset: 0, MaxCount: 2}).Messages
	sz := two[0].Size + two[1].Size
	res = read(core.ReadRequest{Offset: 0, MaxBytes: sz})
	require.Equal(t, []int64{0, 1}, offsets(res), "MaxBytes %d fits two records of %d and %d", sz, two[0].Size, two[1].Size)
	res = read(core.ReadRequest{Offset: 0, MaxBytes: sz - 1})
	require.Equal(t, []int64{0}, offsets(res), "MaxBytes %d", sz-1)

	// Tags: only matching messages, but NextOffset passes the others.
	res = read(core.ReadRequest{Offset: 0, MaxCount: 100, Tags: []string{"t1"}})
	require.Equal(t, []int64{1, 4, 7}, offsets(res))
	require.Equal(t, int64(10), res.NextOffset, "filtered-out messages advance NextOffset")
	res = read(core.ReadRequest{Offset: 0, MaxCount: 100, Tags: []string{"t0", "t2"}})
	require.Equal(t, []int64{0, 2, 3, 5, 6, 8, 9}, offsets(res))
	require.Equal(t, int64(10), res.NextOffset)
	res = read(core.ReadRequest{Offset: 2, MaxCount: 100, Tags: []string{"none"}})
	require.Empty(t, res.Messages)
	require.Equal(t, int64(10), res.NextOffset, "a read that matches nothing still moves on")

	// MaxCount 0 means 32.
	createTopic(t, b, "many", 1)
	var many []*core.Message
	for range 40 {
		many = append(many, &core.Message{Topic: "many"})
	}
	_, err := b.ProduceBatch(ctx, many)
	require.NoError(t, err)
	res, err = b.Read(ctx, core.ReadRequest{Topic: "many"})
	require.NoError(t, err)
	require.Len(t, res.Messages, 32, "MaxCount 0 means 32")
	require.Equal(t, int64(32), res.NextOffset)

	_, err = b.Read(ctx, core.ReadRequest{Topic: topic, Queue: 1})
	require.ErrorIs(t, err, core.ErrQueueNotFound)
	_, err = b.Read(ctx, core.ReadRequest{Topic: topic, Queue: -1})
	require.ErrorIs(t, err, core.ErrQueueNotFound)
	_, err = b.Read(ctx, core.ReadRequest{Topic: "missing"})
	require.ErrorIs(t, err, core.ErrTopicNotFound)
}

// testReadQueues: Read of one queue of a topic whose queues interleave, from
// every offset around its Range: the queue's messages at offsets ≥ the
// (clamped) offset, NextOffset past the last one returned or filtered out,
// or the clamped offset itself when there is none. This holds for dense and
// sparse offsets alike; with dense ones it is the exact numbers again.
func testReadQueues(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic, queues = "read-3", 3
	createTopic(t, b, topic, queues)
	keys := keysForQueues(queues)
	type sent struct {
		offset int64
		tag    string
	}
	want := make([][]sent, queues)
	offsets := make([][]int64, queues)
	for i, q := range []int{0, 1, 1, 2, 0, 0, 1, 2, 2, 2, 0, 1, 0, 2, 1, 1, 0, 2} {
		tag := "t" + strconv.Itoa(i%2)
		r := produce(t, b, &core.Message{Topic: topic, ShardingKey: keys[q], Tag: tag, Body: []byte(strconv.Itoa(i))})
		require.Equal(t, q, r.Queue)
		want[q] = append(want[q], sent{r.QueueOffset, tag})
		offsets[q] = append(offsets[q], r.QueueOffset)
	}
	info := requireOffsets(t, f, b, topic, offsets)

	for q := range queues {
		rg := info.Ranges[q]
		for o := rg.Min - 2; o <= rg.Max+2; o++ {
			from := min(max(o, rg.Min), rg.Max)
			var after []sent // the queue's messages at offsets ≥ from
			for _, m := range want[q] {
				if m.offset >= from {
					after = append(after, m)
				}
			}
			check := func(req core.ReadRequest, wantOffsets []int64, wantNext int64) {
				t.Helper()
				req.Topic, req.Queue, req.Offset = topic, q, o
				res, err := b.Read(ctx, req)
				require.NoError(t, err)
				what := fmt.Sprintf("queue %d of range %v, offset %d, tags %q", q, rg, o, req.Tags)
				require.Equal(t, rg, res.Range, what)
				require.Equal(t, o != from, res.Clamped, "%s: clamped", what)
				var got []int64
				for _, m := range res.Messages {
					require.Equal(t, q, m.Queue, what)
					got = append(got, m.QueueOffset)
					if len(req.Tags) > 0 {
						require.Contains(t, req.Tags, m.Tag, what)
					}
				}
				require.Equal(t, wantOffsets, got, what)
				require.Equal(t, wantNext, res.NextOffset, "%s: NextOffset", what)
			}

			// At most two, from the clamped offset on.
			var first []int64
			next := from // nothing found: the clamped offset
			for _, m := range after[:min(2, len(after))] {
				first = append(first, m.offset)
				next = m.offset + 1
			}
			check(core.ReadRequest{MaxCount: 2}, first, next)

			// A tag filter returns only matching messages, but NextOffset
			// passes the filtered ones.
			var tagged []int64
			next = from
			for _, m := range after {
				if m.tag == "t1" {
					tagged = append(tagged, m.offset)
				}
				next = m.offset + 1
			}
			check(core.ReadRequest{MaxCount: 100, Tags: []string{"t1"}}, tagged, next)
		}
	}
}
