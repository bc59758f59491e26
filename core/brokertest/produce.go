package brokertest

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// testProduceSendResult: Produce answers with a SendResult that names where
// the message went, and Get returns the message exactly as it was sent.
func testProduceSendResult(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic, queues = "produce", 4
	createTopic(t, b, topic, queues)

	born := time.Unix(1_700_000_000, 123_456_789)
	binary := make([]byte, 256) // every byte value, so not valid UTF-8
	for i := range binary {
		binary[i] = byte(i)
	}
	msgs := []*core.Message{
		{
			Topic: topic, ShardingKey: "dev-1", Tag: "temp",
			Keys:       []string{"order-1", "order-2"},
			Properties: map[string]string{"mqtt.topic": "a/b/c", "mqtt.qos": "1", "empty": "", "unicode": "ünïcode ✓"},
			Body:       []byte("hello"),
			BornAt:     born,
			// In the past, so no engine holds it back for delayed delivery.
			DeliverAt:      born.Add(time.Minute),
			ReconsumeCount: 3,
		},
		{Topic: topic},                 // nothing but a topic: nil body
		{Topic: topic, Body: []byte{}}, // an empty body
		{Topic: topic, ShardingKey: "dev-2", Body: binary},
		{Topic: topic, ShardingKey: "dev-1", Body: bytes.Repeat([]byte("x"), 64<<10)},
	}
	for i := range 12 {
		msgs = append(msgs, &core.Message{Topic: topic, ShardingKey: "k" + strconv.Itoa(i%3), Body: []byte(strconv.Itoa(i))})
	}

	ids := map[core.MessageID]bool{}
	next := make([]int64, queues)      // a fresh topic: queue offsets are dense from 0
	offsets := make([][]int64, queues) // each queue's offsets, in produce order
	var sent []core.SendResult
	for i, m := range msgs {
		r, err := b.Produce(ctx, m)
		require.NoError(t, err, "message %d", i)
		require.False(t, r.ID.IsZero(), "message %d: zero ID", i)
		require.False(t, ids[r.ID], "message %d: ID %s issued twice", i, r.ID)
		ids[r.ID] = true
		require.Equal(t, topic, r.Topic)
		require.GreaterOrEqual(t, r.Queue, 0)
		require.Less(t, r.Queue, queues)
		if m.ShardingKey != "" {
			require.Equal(t, core.QueueFor(m.ShardingKey, queues), r.Queue, "message %d: queue of key %q", i, m.ShardingKey)
		}
		if f.SparseOffsets {
			if o := offsets[r.Queue]; len(o) > 0 {
				require.Greater(t, r.QueueOffset, o[len(o)-1], "message %d: queue offsets increase", i)
			}
		} else {
			require.Equal(t, next[r.Queue], r.QueueOffset, "message %d: queue offsets are dense and increasing", i)
		}
		next[r.Queue]++
		offsets[r.Queue] = append(offsets[r.Queue], r.QueueOffset)
		require.False(t, r.StoredAt.IsZero(), "message %d: StoredAt", i)
		if i > 0 && f.StoredAtSkew == 0 {
			require.False(t, r.StoredAt.Before(sent[i-1].StoredAt), "message %d: store times never decrease", i)
		}
		sent = append(sent, r)
	}

	for i, r := range sent {
		got, err := b.Get(ctx, r.ID)
		require.NoError(t, err, "message %d", i)
		requireSameMessage(t, msgs[i], got)
		requireMatchesResult(t, f, r, got)
		require.Positive(t, got.Size, "message %d: Size", i)
	}
	info := requireOffsets(t, f, b, topic, offsets)
	if !f.SparseOffsets {
		for q := range queues {
			require.Equal(t, core.QueueRange{Min: 0, Max: next[q]}, info.Ranges[q], "queue %d", q)
		}
	}
}

// testSharding: a sharding key always picks core.QueueFor(key, n); messages
// without one are spread round-robin over every queue.
func testSharding(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic, queues = "shard", 5
	createTopic(t, b, topic, queues)

	for i := range 40 {
		key := "device-" + strconv.Itoa(i%20)
		r := produce(t, b, &core.Message{Topic: topic, ShardingKey: key, Body: []byte(strconv.Itoa(i))})
		require.Equal(t, core.QueueFor(key, queues), r.Queue, "key %q", key)
	}
	used := map[int]int{}
	for i := range 2 * queues {
		r := produce(t, b, &core.Message{Topic: topic, Body: []byte("keyless-" + strconv.Itoa(i))})
		used[r.Queue]++
	}
	require.Len(t, used, queues, "%d messages without a key use every one of %d queues (round robin): %v", 2*queues, queues, used)

	// The batch paths place keys the same way.
	batch := make([]*core.Message, 10)
	for i := range batch {
		batch[i] = &core.Message{Topic: topic, ShardingKey: "batch-" + strconv.Itoa(i)}
	}
	res, err := b.ProduceBatch(ctx, batch)
	require.NoError(t, err)
	for i, r := range res {
		require.Equal(t, core.QueueFor(batch[i].ShardingKey, queues), r.Queue, "batch message %d", i)
	}

	total := 0
	for q := range queues {
		for _, m := range readQueue(t, f, b, topic, q) {
			if m.ShardingKey != "" {
				require.Equal(t, core.QueueFor(m.ShardingKey, queues), q, "key %q read from queue %d", m.ShardingKey, q)
			}
			total++
		}
	}
	require.Equal(t, 40+2*queues+len(batch), total)
}

// testPerKeyOrderAsync: pipelined ProduceAsync calls keep call order within
// each queue, so per-key order holds, and done is called exactly once per
// call.
func testPerKeyOrderAsync(t *testing.T, f Factory) {
	b := f.Open(t)
	const topic, queues, total, keys = "order", 4, 500, 5
	createTopic(t, b, topic, queues)

	// Calls of 1, 2 and 3 messages in turn, 500 messages in all.
	var calls [][]*core.Message
	for seq := 0; seq < total; {
		n := min(1+len(calls)%3, total-seq)
		var batch []*core.Message
		for range n {
			batch = append(batch, &core.Message{
				Topic:       topic,
				ShardingKey: "key-" + strconv.Itoa(seq%keys),
				Body:        []byte(strconv.Itoa(seq)),
			})
			seq++
		}
		calls = append(calls, batch)
	}

	var (
		mu       sync.Mutex
		results  = make([][]core.SendResult, len(calls))
		errs     []error
		doneRuns = make([]atomic.Int32, len(calls))
		finished atomic.Int32
	)
	for i, batch := range calls {
		b.ProduceAsync(batch, func(res []core.SendResult, err error) {
			doneRuns[i].Add(1)
			mu.Lock()
			results[i] = res
			if err != nil {
				errs = append(errs, fmt.Errorf("call %d: %w", i, err))
			}
			mu.Unlock()
			finished.Add(1)
		})
	}
	require.Eventually(t, func() bool { return int(finished.Load()) >= len(calls) }, wait, tick,
		"every ProduceAsync call gets its done")

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, errs)
	lastOffset := map[int]int64{}
	for i, batch := range calls {
		require.EqualValues(t, 1, doneRuns[i].Load(), "done of call %d runs exactly once", i)
		require.Len(t, results[i], len(batch), "call %d: one result per message", i)
		for j, r := range results[i] {
			m := batch[j]
			require.Equal(t, core.QueueFor(m.ShardingKey, queues), r.Queue)
			if last, ok := lastOffset[r.Queue]; ok {
				require.Greater(t, r.QueueOffset, last, "call %d message %d: appended in call order", i, j)
			}
			lastOffset[r.Queue] = r.QueueOffset
		}
	}

	requireStoredInKeyOrder(t, f, b, topic, queues, "call", results)
}

// testProduceBatch: results come back in message order; a batch holding an
// invalid message fails as a whole.
func testProduceBatch(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic, other, queues = "batch", "batch-2", 4
	createTopic(t, b, topic, queues)
	createTopic(t, b, other, 2)

	var msgs []*core.Message
	for i := range 20 {
		m := &core.Message{Topic: topic, Body: []byte(strconv.Itoa(i))}
		if i%4 != 3 {
			m.ShardingKey = "key-" + strconv.Itoa(i%3)
		}
		if i == 10 {
			m.Topic = other // one batch may span topics
		}
		msgs = append(msgs, m)
	}
	res, err := b.ProduceBatch(ctx, msgs)
	require.NoError(t, err)
	require.Len(t, res, len(msgs))
	next := map[string][]int64{topic: make([]int64, queues), other: make([]int64, 2)}
	last := map[string]map[int]int64{topic: {}, other: {}} // the last offset of each queue
	lastStored := map[string]time.Time{}
	ids := map[core.MessageID]bool{}
	for i, r := range res {
		require.Equal(t, msgs[i].Topic, r.Topic, "result %d", i)
		require.False(t, r.ID.IsZero())
		require.False(t, ids[r.ID], "result %d: ID issued twice", i)
		ids[r.ID] = true
		if f.SparseOffsets {
			if l, ok := last[r.Topic][r.Queue]; ok {
				require.Greater(t, r.QueueOffset, l, "result %d: stored in batch order", i)
			}
		} else {
			require.Equal(t, next[r.Topic][r.Queue], r.QueueOffset, "result %d: stored in batch order", i)
		}
		next[r.Topic][r.Queue]++
		last[r.Topic][r.Queue] = r.QueueOffset
		got, err := b.Get(ctx, r.ID)
		require.NoError(t, err)
		if f.StoredAtSkew == 0 && i > 0 {
			require.False(t, r.StoredAt.Before(res[i-1].StoredAt), "result %d: store times never decrease", i)
		}
		if prev, ok := lastStored[r.Topic]; ok {
			require.False(t, got.StoredAt.Before(prev), "result %d: store times never decrease in a topic", i)
		}
		lastStored[r.Topic] = got.StoredAt
		requireSameMessage(t, msgs[i], got)
		requireMatchesResult(t, f, r, got)
	}

	// An invalid message fails the batch: none of it is acknowledged. (The
	// contract lets an engine have stored some of it anyway — at least once
	// — so the suite does not look for what is stored.)
	bad := []*core.Message{
		{Topic: topic, Body: []byte("before")},
		{Topic: "bad/topic", Body: []byte("bad")},
		{Topic: topic, Body: []byte("after")},
	}
	res, err = b.ProduceBatch(ctx, bad)
	require.ErrorIs(t, err, core.ErrInvalidTopic)
	require.Empty(t, res, "a failed batch acknowledges nothing")

	res, err = awaitAsync(t, b, bad)
	require.ErrorIs(t, err, core.ErrInvalidTopic, "ProduceAsync of an invalid batch (done acknowledged %d messages)", len(res))
}

// testConcurrentProduce: producers in parallel get unique IDs, dense queue
// offsets and per-key order.
func testConcurrentProduce(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic, queues, workers, per = "conc", 4, 8, 50
	createTopic(t, b, topic, queues)

	results := make([][]core.SendResult, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				r, err := b.Produce(ctx, &core.Message{Topic: topic, ShardingKey: "w" + strconv.Itoa(w), Body: []byte(strconv.Itoa(i))})
				if err != nil {
					errs[w] = err
					return
				}
				results[w] = append(results[w], r)
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))

	ids := map[core.MessageID]bool{}
	for w, rs := range results {
		require.Len(t, rs, per)
		for i, r := range rs {
			require.False(t, ids[r.ID], "ID %s issued twice", r.ID)
			ids[r.ID] = true
			if i > 0 {
				require.Greater(t, r.QueueOffset, rs[i-1].QueueOffset, "worker %d: one key's messages in order", w)
			}
		}
	}
	requireStoredInKeyOrder(t, f, b, topic, queues, "worker", results)
}
