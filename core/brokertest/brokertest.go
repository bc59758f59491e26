// Package brokertest is the conformance suite of core.Broker, shared by every
// engine as net/http/httptest is shared by HTTP tests: an engine's own test
// calls Run with a Factory that opens it, and every case below runs against
// that engine as a subtest.
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, brokertest.Factory{
//			Open:   func(t *testing.T) core.Broker { … },
//			Reopen: func(t *testing.T, b core.Broker) core.Broker { … },
//		})
//	}
//
// The cases assert the contract written in the doc comments of core.Broker,
// core.Message, core.ReadRequest and the core errors, never an engine's
// internals: no file names, no ID layout, no exact record sizes. Where the
// contract leaves a choice open (the exact size of a stored record, whether a
// failed batch left some messages stored) the suite accepts either.
//
// Each case opens a fresh engine of its own, waits with require.Eventually
// where it must wait, and never sleeps; the whole suite runs in a few seconds
// against the embedded engine. Cases run one after another, so a Factory need
// not support engines open side by side, except that the Get case opens a
// second engine to obtain an ID that is foreign to the first.
package brokertest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// Factory opens the engine under test.
type Factory struct {
	// Open opens a fresh, empty engine for one subtest (a t.TempDir, a
	// server on port 0 — the factory's business) and registers its cleanup
	// with t.Cleanup. Required.
	Open func(t *testing.T) core.Broker
	// Reopen closes b (which the test may already have closed) and opens the
	// same engine again on the same data, as a restart does, returning the
	// new Broker; its cleanup is registered with t.Cleanup too. Optional:
	// when nil, the cases and checks that need a restart are skipped.
	Reopen func(t *testing.T, b core.Broker) core.Broker

	// Capabilities an engine may lack. Cases that need one are skipped with
	// a t.Skip that names it, or, where the contract says what an engine
	// without it does, check that instead. The zero value claims every
	// capability, so an engine that forgets to declare a lack fails rather
	// than skips. The embedded engine has them all.

	// NoDeleteTopic: the engine does not implement DeleteTopic.
	NoDeleteTopic bool
	// NoAutoCreate: the engine does not create topics on produce (both
	// engines' DisableAutoCreate option): Produce, ProduceBatch and
	// ProduceAsync to a topic that does not exist fail with
	// core.ErrTopicNotFound and create nothing. The AutoCreate case checks
	// that refusal instead of auto-creation; either way it fails, never
	// skips, when the engine does not do what the flag says.
	NoAutoCreate bool
	// SparseOffsets: queue offsets increase but are not dense: a topic's
	// queues share one sequence (the JetStream engine's stream sequence),
	// so other queues' messages take the offsets in between and a queue's
	// Range may span more offsets than it has messages. Cases that check
	// exact offsets and Ranges of many-queue topics then check what holds
	// for both: offsets strictly increasing per queue, Min ≤ offset < Max
	// for every stored message, Backlog counting exactly, Min == Max for an
	// empty queue (not 0 for a recreated topic). One-queue topics are dense
	// either way and keep their exact checks. The embedded engine's offsets
	// are dense: it leaves this false, and is held to the exact numbers.
	SparseOffsets bool
	// StoredAtSkew: SendResult.StoredAt is the producer's estimate of the
	// store time, within this much of the stored message's StoredAt (the
	// JetStream engine's acknowledgement carries no time: the stream stamps
	// the message, the producer notes when the acknowledgement came), and
	// store times never decrease per topic rather than across topics (each
	// stream stamps its own). Zero: they are equal, and monotonic across
	// topics, as the embedded engine's are.
	StoredAtSkew time.Duration
}

// Run runs every case of the suite against engines opened by f, each case as
// a subtest of t with a fresh engine.
func Run(t *testing.T, f Factory) {
	t.Helper()
	require.NotNil(t, f.Open, "brokertest: Factory.Open is required")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, f) })
	}
}

// cases is the suite, in the order it runs.
var cases = []struct {
	name string
	run  func(t *testing.T, f Factory)
}{
	{"ProduceSendResult", testProduceSendResult},
	{"Sharding", testSharding},
	{"PerKeyOrderAsync", testPerKeyOrderAsync},
	{"ProduceBatch", testProduceBatch},
	{"ConcurrentProduce", testConcurrentProduce},
	{"Topics", testTopics},
	{"AutoCreate", testAutoCreate},
	{"Read", testRead},
	{"ReadQueues", testReadQueues},
	{"FindByKey", testFindByKey},
	{"OffsetAt", testOffsetAt},
	{"Backlog", testBacklog},
	{"CommittedOffsets", testCommittedOffsets},
	{"Arrivals", testArrivals},
	{"GetUnknownID", testGetUnknownID},
	{"Restart", testRestart},
	{"DeleteTopic", testDeleteTopic},
	{"Close", testClose},
}

// wait bounds every wait of the suite: long enough for a loaded CI machine,
// short enough that a broken engine fails instead of hanging.
const (
	wait = 10 * time.Second
	tick = time.Millisecond
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

	n := 0
	stored := map[queueOffset]core.MessageID{}
	for q := range queues {
		last := map[string]int{}
		for _, m := range readQueue(t, f, b, topic, q) {
			seq, err := strconv.Atoi(string(m.Body))
			require.NoError(t, err)
			if p, ok := last[m.ShardingKey]; ok {
				require.Less(t, p, seq, "key %s: message %d read after %d", m.ShardingKey, seq, p)
			}
			last[m.ShardingKey] = seq
			stored[queueOffset{q, m.QueueOffset}] = m.ID
			n++
		}
	}
	require.Equal(t, total, n)
	for i, res := range results {
		for j, r := range res {
			require.Equal(t, r.ID, stored[queueOffset{r.Queue, r.QueueOffset}], "call %d message %d: stored where its SendResult says", i, j)
		}
	}
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

	errc := make(chan error, 1)
	b.ProduceAsync(bad, func(res []core.SendResult, err error) {
		if err == nil {
			err = fmt.Errorf("done acknowledged %d messages of an invalid batch", len(res))
		}
		select { // never block an engine goroutine, even if done runs twice
		case errc <- err:
		default:
		}
	})
	select {
	case err := <-errc:
		require.ErrorIs(t, err, core.ErrInvalidTopic, "ProduceAsync of an invalid batch")
	case <-time.After(wait):
		require.Fail(t, "ProduceAsync of an invalid batch never called done")
	}
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
	n := 0
	stored := map[queueOffset]core.MessageID{}
	for q := range queues {
		last := map[string]int{}
		for _, m := range readQueue(t, f, b, topic, q) { // readQueue checks offsets are dense (increasing if sparse)
			i, err := strconv.Atoi(string(m.Body))
			require.NoError(t, err)
			if p, ok := last[m.ShardingKey]; ok {
				require.Less(t, p, i, "key %s", m.ShardingKey)
			}
			last[m.ShardingKey] = i
			stored[queueOffset{q, m.QueueOffset}] = m.ID
			n++
		}
	}
	require.Equal(t, workers*per, n)
	for w, rs := range results {
		for i, r := range rs {
			require.Equal(t, r.ID, stored[queueOffset{r.Queue, r.QueueOffset}], "worker %d message %d: stored where its SendResult says", w, i)
		}
	}
}

// testTopics: CreateTopic, Topic and Topics.
func testTopics(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)

	info, err := b.CreateTopic(ctx, core.TopicConfig{Name: "t3", Queues: 3})
	require.NoError(t, err)
	require.Equal(t, "t3", info.Name)
	require.Equal(t, 3, info.Queues)
	require.Equal(t, make([]core.QueueRange, 3), info.Ranges, "a new topic's queues are empty")
	require.False(t, info.CreatedAt.IsZero(), "CreatedAt")

	again, err := b.CreateTopic(ctx, core.TopicConfig{Name: "t3", Queues: 3})
	require.NoError(t, err, "the same configuration again returns the existing topic")
	require.Equal(t, 3, again.Queues)
	require.True(t, info.CreatedAt.Equal(again.CreatedAt), "the existing topic: created %v, then %v", info.CreatedAt, again.CreatedAt)
	_, err = b.CreateTopic(ctx, core.TopicConfig{Name: "t3", Queues: 5})
	require.ErrorIs(t, err, core.ErrTopicExists)

	for _, name := range []string{"", "a/b", "a b", "+", "#", "ü", string(bytes.Repeat([]byte("x"), core.MaxTopicLen+1))} {
		_, err := b.CreateTopic(ctx, core.TopicConfig{Name: name, Queues: 1})
		require.ErrorIs(t, err, core.ErrInvalidTopic, "name %q", name)
		var te *core.TopicError
		require.ErrorAs(t, err, &te, "name %q", name)
		_, err = b.Produce(ctx, &core.Message{Topic: name})
		require.ErrorIs(t, err, core.ErrInvalidTopic, "produce to %q", name)
	}
	long, err := b.CreateTopic(ctx, core.TopicConfig{Name: string(bytes.Repeat([]byte("x"), core.MaxTopicLen)), Queues: 1})
	require.NoError(t, err, "a name of MaxTopicLen characters is valid")
	require.Equal(t, 1, long.Queues)

	_, err = b.Topic(ctx, "missing")
	require.ErrorIs(t, err, core.ErrTopicNotFound)
	got, err := b.Topic(ctx, "t3")
	require.NoError(t, err)
	require.Equal(t, "t3", got.Name)
	require.Equal(t, 3, got.Queues)

	def, err := b.CreateTopic(ctx, core.TopicConfig{Name: "default-queues"})
	require.NoError(t, err)
	require.Positive(t, def.Queues, "Queues 0 means the engine's default")
	require.Len(t, def.Ranges, def.Queues)

	// Ranges follow what is produced.
	count := make([]int64, 3)
	offsets := make([][]int64, 3)
	for i := range 30 {
		r := produce(t, b, &core.Message{Topic: "t3", ShardingKey: "k" + strconv.Itoa(i%7)})
		count[r.Queue]++
		offsets[r.Queue] = append(offsets[r.Queue], r.QueueOffset)
	}
	got = requireOffsets(t, f, b, "t3", offsets)
	if !f.SparseOffsets {
		for q := range 3 {
			require.Equal(t, core.QueueRange{Min: 0, Max: count[q]}, got.Ranges[q], "queue %d", q)
		}
	}

	for _, name := range []string{"b-topic", "A-topic", "a_topic", "a.topic", "0topic"} {
		createTopic(t, b, name, 2)
	}
	list, err := b.Topics(ctx)
	require.NoError(t, err)
	var names []string
	for _, ti := range list {
		names = append(names, ti.Name)
		require.Len(t, ti.Ranges, ti.Queues, "topic %s", ti.Name)
		if ti.Name == "t3" {
			require.Equal(t, got.Ranges, ti.Ranges)
		}
	}
	require.True(t, slices.IsSorted(names), "Topics sorted by name: %q", names)
	for _, name := range []string{"t3", "default-queues", "b-topic", "A-topic", "a_topic", "a.topic", "0topic", long.Name} {
		require.Contains(t, names, name)
	}
}

// testAutoCreate: a produce to a topic that does not exist creates it with
// default settings, by each of Produce, ProduceBatch and ProduceAsync (the
// gateway produces with ProduceAsync only); with f.NoAutoCreate, each is
// refused with ErrTopicNotFound instead.
func testAutoCreate(t *testing.T, f Factory) {
	if f.NoAutoCreate {
		testNoAutoCreate(t, f)
		return
	}
	ctx := t.Context()
	b := f.Open(t)
	def, err := b.CreateTopic(ctx, core.TopicConfig{Name: "explicit-default"})
	require.NoError(t, err)
	for _, p := range autoCreateProduces {
		topic := "auto-" + p.name
		r, err := p.produce(t, b, &core.Message{Topic: topic, Body: []byte(p.name)})
		require.NoError(t, err, "%s to a topic that does not exist creates it (the Factory does not set NoAutoCreate)", p.name)
		info, err := b.Topic(ctx, topic)
		require.NoError(t, err, "%s: the auto-created topic", p.name)
		require.Equal(t, def.Queues, info.Queues, "%s: an auto-created topic has the default queue count", p.name)
		require.Less(t, r.Queue, info.Queues, p.name)
		if !f.SparseOffsets {
			require.Equal(t, int64(1), info.Ranges[r.Queue].Max, p.name)
		}
		offsets := make([][]int64, info.Queues)
		offsets[r.Queue] = []int64{r.QueueOffset}
		requireOffsets(t, f, b, topic, offsets)
		require.Equal(t, p.name, string(mustGet(t, b, r.ID).Body))
	}
}

// testNoAutoCreate is testAutoCreate for an engine that does not
// auto-create: every produce path refuses, nothing is created, and the
// topic takes messages once it is created explicitly.
func testNoAutoCreate(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	for _, p := range autoCreateProduces {
		topic := "auto-" + p.name
		_, err := p.produce(t, b, &core.Message{Topic: topic, Body: []byte(p.name)})
		require.ErrorIs(t, err, core.ErrTopicNotFound, "%s to a topic that does not exist is refused (the Factory sets NoAutoCreate)", p.name)
		_, err = b.Topic(ctx, topic)
		require.ErrorIs(t, err, core.ErrTopicNotFound, "%s: a refused produce creates no topic", p.name)
	}
	list, err := b.Topics(ctx)
	require.NoError(t, err)
	require.Empty(t, list, "a refused produce creates no topic")

	for _, p := range autoCreateProduces {
		topic := "auto-" + p.name
		createTopic(t, b, topic, 0)
		r, err := p.produce(t, b, &core.Message{Topic: topic, Body: []byte(p.name)})
		require.NoError(t, err, "%s to the topic once it is created", p.name)
		require.Equal(t, p.name, string(mustGet(t, b, r.ID).Body))
	}
}

// autoCreateProduces are the three ways to produce one message, each
// returning its result or error rather than failing the test, so the
// AutoCreate case can expect either.
var autoCreateProduces = []struct {
	name    string
	produce func(t testing.TB, b core.Broker, m *core.Message) (core.SendResult, error)
}{
	{"Produce", func(t testing.TB, b core.Broker, m *core.Message) (core.SendResult, error) {
		return b.Produce(t.Context(), m)
	}},
	{"ProduceBatch", func(t testing.TB, b core.Broker, m *core.Message) (core.SendResult, error) {
		t.Helper()
		res, err := b.ProduceBatch(t.Context(), []*core.Message{m})
		if err != nil {
			return core.SendResult{}, err
		}
		require.Len(t, res, 1, "ProduceBatch: one result per message")
		return res[0], nil
	}},
	{"ProduceAsync", func(t testing.TB, b core.Broker, m *core.Message) (core.SendResult, error) {
		t.Helper()
		res, err := awaitAsync(t, b, []*core.Message{m})
		if err != nil {
			return core.SendResult{}, err
		}
		require.Len(t, res, 1, "ProduceAsync: one result per message")
		return res[0], nil
	}},
}

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

// testFindByKey: lookup by sharding key and by index key, within a topic,
// oldest first, bounded by time and count.
func testFindByKey(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic, other = "fk", "fk-other"
	createTopic(t, b, topic, 2)
	createTopic(t, b, other, 2)

	var car []*core.StoredMessage // car-1's messages in produce order
	for i := range 6 {
		m := &core.Message{Topic: topic, ShardingKey: "car-1", Keys: []string{"order-" + strconv.Itoa(i)}, Body: []byte(strconv.Itoa(i))}
		if i == 2 {
			m.Keys = append(m.Keys, "car-1") // the sharding key again: found once
		}
		car = append(car, mustGet(t, b, produce(t, b, m).ID))
		produce(t, b, &core.Message{Topic: topic, ShardingKey: "car-2"}) // noise
	}
	shared := produce(t, b, &core.Message{Topic: topic, Keys: []string{"shared"}, Body: []byte("mine")})
	produce(t, b, &core.Message{Topic: other, ShardingKey: "car-1", Keys: []string{"shared", "order-1"}, Body: []byte("theirs")})

	find := func(key string, q core.KeyQuery) []*core.StoredMessage {
		t.Helper()
		got, err := b.FindByKey(ctx, topic, key, q)
		require.NoError(t, err)
		for i, m := range got {
			require.Equal(t, topic, m.Topic, "a key of another topic is not returned")
			if i > 0 {
				require.False(t, m.StoredAt.Before(got[i-1].StoredAt), "oldest first")
			}
		}
		return got
	}
	ids := func(ms []*core.StoredMessage) []core.MessageID {
		var out []core.MessageID
		for _, m := range ms {
			out = append(out, m.ID)
		}
		return out
	}

	got := find("car-1", core.KeyQuery{})
	require.Equal(t, ids(car), ids(got), "by sharding key, oldest first, each once")
	requireSameStored(t, car[3], got[3])
	got = find("order-1", core.KeyQuery{})
	require.Equal(t, ids(car[1:2]), ids(got), "by index key")
	got = find("shared", core.KeyQuery{})
	require.Equal(t, []core.MessageID{shared.ID}, ids(got))
	require.Empty(t, find("nobody", core.KeyQuery{}))
	got = find("car-1", core.KeyQuery{Max: 2})
	require.Equal(t, ids(car[:2]), ids(got), "Max 2: the two oldest")

	// Time bounds. Messages on a bound may be in or out; those strictly
	// inside must be found, those strictly outside must not.
	begin, end := car[2].StoredAt, car[4].StoredAt
	require.True(t, car[0].StoredAt.Before(begin) && end.Before(car[5].StoredAt),
		"store times of sequential produces must advance for this check: %v", []time.Time{car[0].StoredAt, begin, end, car[5].StoredAt})
	checkWindow := func(q core.KeyQuery) {
		t.Helper()
		found := map[core.MessageID]bool{}
		for _, m := range find("car-1", q) {
			found[m.ID] = true
		}
		for i, m := range car {
			before := !q.Begin.IsZero() && m.StoredAt.Before(q.Begin)
			after := !q.End.IsZero() && m.StoredAt.After(q.End)
			onBound := m.StoredAt.Equal(q.Begin) || m.StoredAt.Equal(q.End)
			switch {
			case before || after:
				require.False(t, found[m.ID], "message %d stored at %v is outside [%v, %v]", i, m.StoredAt, q.Begin, q.End)
			case !onBound:
				require.True(t, found[m.ID], "message %d stored at %v is inside [%v, %v]", i, m.StoredAt, q.Begin, q.End)
			}
		}
	}
	checkWindow(core.KeyQuery{Begin: begin})
	checkWindow(core.KeyQuery{End: end})
	checkWindow(core.KeyQuery{Begin: begin, End: end})

	// Max 0 means 32.
	var batch []*core.Message
	for range 40 {
		batch = append(batch, &core.Message{Topic: topic, Keys: []string{"many"}})
	}
	_, err := b.ProduceBatch(ctx, batch)
	require.NoError(t, err)
	require.Len(t, find("many", core.KeyQuery{}), 32, "Max 0 means 32")
	require.Len(t, find("many", core.KeyQuery{Max: 100}), 40)

	_, err = b.FindByKey(ctx, "missing", "car-1", core.KeyQuery{})
	require.ErrorIs(t, err, core.ErrTopicNotFound)
}

// testOffsetAt: the first offset stored at or after a time.
func testOffsetAt(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic = "oa"
	createTopic(t, b, topic, 2)

	empty, err := b.OffsetAt(ctx, topic, 1, time.Now())
	require.NoError(t, err)
	require.Equal(t, int64(0), empty, "an empty queue: its max")

	q := core.QueueFor("k", 2)
	noise := keysForQueues(2)[1-q] // the other queue: with sparse offsets its messages take offsets between q's
	for i := range 10 {
		produce(t, b, &core.Message{Topic: topic, ShardingKey: "k", Body: []byte(strconv.Itoa(i))})
		if i%3 == 1 {
			produce(t, b, &core.Message{Topic: topic, ShardingKey: noise})
		}
	}
	msgs := readQueue(t, f, b, topic, q)
	require.Len(t, msgs, 10)
	info, err := b.Topic(ctx, topic)
	require.NoError(t, err)
	end := int64(len(msgs)) // the max offset
	if f.SparseOffsets {
		end = info.Ranges[q].Max
	}
	// want is the offset of the first message stored at or after at.
	want := func(at time.Time) int64 {
		for _, m := range msgs {
			if !m.StoredAt.Before(at) {
				return m.QueueOffset
			}
		}
		return end
	}
	for _, k := range []int{0, 3, 9} {
		for _, at := range []time.Time{msgs[k].StoredAt, msgs[k].StoredAt.Add(time.Nanosecond), msgs[k].StoredAt.Add(-time.Nanosecond)} {
			got, err := b.OffsetAt(ctx, topic, q, at)
			require.NoError(t, err)
			require.Equal(t, want(at), got, "at %v (message %d stored at %v)", at, k, msgs[k].StoredAt)
		}
	}
	got, err := b.OffsetAt(ctx, topic, q, msgs[9].StoredAt.Add(time.Hour))
	require.NoError(t, err)
	if f.SparseOffsets {
		require.Equal(t, end, got, "after everything: the max offset")
	} else {
		require.Equal(t, int64(10), got, "after everything: the max offset")
	}
	got, err = b.OffsetAt(ctx, topic, q, msgs[0].StoredAt.Add(-time.Hour))
	require.NoError(t, err)
	if f.SparseOffsets {
		require.Equal(t, msgs[0].QueueOffset, got, "before everything: the first message's offset")
	} else {
		require.Equal(t, int64(0), got, "before everything: the min offset")
	}
	got, err = b.OffsetAt(ctx, topic, 1-q, msgs[9].StoredAt.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, info.Ranges[1-q].Max, got, "the other queue, after everything: its max offset")

	_, err = b.OffsetAt(ctx, topic, 2, time.Now())
	require.ErrorIs(t, err, core.ErrQueueNotFound)
	_, err = b.OffsetAt(ctx, "missing", 0, time.Now())
	require.ErrorIs(t, err, core.ErrTopicNotFound)
}

// testBacklog: Backlog counts one queue's messages at offsets ≥ from, from
// anywhere around the queue's Range, and follows new messages and restarts.
func testBacklog(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic, queues = "bl", 4
	createTopic(t, b, topic, queues)
	keys := keysForQueues(queues)

	backlog := func(b core.Broker, q int, from int64) int64 {
		t.Helper()
		n, err := b.Backlog(ctx, topic, q, from)
		require.NoError(t, err, "Backlog(%s, %d, %d)", topic, q, from)
		return n
	}
	for q := range queues {
		require.Zero(t, backlog(b, q, 0), "queue %d of a new topic", q)
		require.Zero(t, backlog(b, q, -1), "queue %d of a new topic, from -1", q)
	}

	// Queues 0, 1 and 2 get 1, 5 and 9 messages, interleaved, some by
	// batch; queue 3 gets none.
	offsets := make([][]int64, queues)
	var batch []*core.Message
	for i := range 15 {
		q := []int{1, 2, 2, 0, 2, 1, 2}[i%7]
		if i >= 7 {
			q = []int{2, 1, 2, 2, 1, 2, 1, 2}[i-7]
		}
		m := &core.Message{Topic: topic, ShardingKey: keys[q], Body: []byte(strconv.Itoa(i))}
		if i%7 >= 3 && i%7 <= 5 {
			batch = append(batch, m)
			continue
		}
		for _, r := range append(flushBatch(t, b, &batch), produce(t, b, m)) {
			offsets[r.Queue] = append(offsets[r.Queue], r.QueueOffset)
		}
	}
	for _, r := range flushBatch(t, b, &batch) {
		offsets[r.Queue] = append(offsets[r.Queue], r.QueueOffset)
	}
	require.Equal(t, []int{1, 5, 9, 0}, []int{len(offsets[0]), len(offsets[1]), len(offsets[2]), len(offsets[3])})
	info := requireOffsets(t, f, b, topic, offsets) // Backlog from every offset around each Range

	check := func(b core.Broker) {
		t.Helper()
		total, want := int64(0), int64(0)
		for q, offs := range offsets {
			rg := info.Ranges[q]
			n := int64(len(offs))
			require.Equal(t, n, backlog(b, q, 0), "queue %d from 0", q)
			require.Equal(t, n, backlog(b, q, rg.Min), "queue %d from its min %d", q, rg.Min)
			require.Equal(t, n, backlog(b, q, -100), "queue %d from below its min", q)
			for i, o := range offs {
				require.Equal(t, n-int64(i), backlog(b, q, o), "queue %d from its message at %d", q, o)
				require.Equal(t, n-int64(i)-1, backlog(b, q, o+1), "queue %d after its message at %d", q, o)
			}
			require.Zero(t, backlog(b, q, rg.Max), "queue %d from its max", q)
			require.Zero(t, backlog(b, q, rg.Max+1000), "queue %d beyond its max", q)
			total += backlog(b, q, rg.Min)
			want += n
		}
		require.Equal(t, want, total, "the queues' backlogs add up to the topic's messages")
	}
	check(b)

	// New messages count at once.
	r := produce(t, b, &core.Message{Topic: topic, ShardingKey: keys[0], Body: []byte("new")})
	require.Greater(t, r.QueueOffset, offsets[0][0])
	require.Equal(t, int64(2), backlog(b, 0, 0))
	require.Equal(t, int64(1), backlog(b, 0, offsets[0][0]+1), "a consumer past the old message lags by the new one")
	require.Equal(t, int64(1), backlog(b, 0, r.QueueOffset))
	require.Zero(t, backlog(b, 0, r.QueueOffset+1))
	offsets[0] = append(offsets[0], r.QueueOffset)
	info = requireOffsets(t, f, b, topic, offsets)
	check(b)

	_, err := b.Backlog(ctx, "missing", 0, 0)
	require.ErrorIs(t, err, core.ErrTopicNotFound)
	for _, q := range []int{queues, -1, 100} {
		_, err = b.Backlog(ctx, topic, q, 0)
		require.ErrorIs(t, err, core.ErrQueueNotFound, "queue %d", q)
	}

	if f.Reopen == nil {
		t.Log("brokertest: no Reopen: Backlog not checked across a restart")
		return
	}
	before := info
	b = f.Reopen(t, b)
	info = requireOffsets(t, f, b, topic, offsets)
	require.Equal(t, before.Ranges, info.Ranges, "a restart keeps the Ranges")
	check(b)
}

// flushBatch produces *batch with ProduceBatch, if it holds anything, and
// empties it.
func flushBatch(t testing.TB, b core.Broker, batch *[]*core.Message) []core.SendResult {
	t.Helper()
	if len(*batch) == 0 {
		return nil
	}
	res, err := b.ProduceBatch(t.Context(), *batch)
	require.NoError(t, err)
	require.Len(t, res, len(*batch))
	*batch = nil
	return res
}

// testCommittedOffsets: CommitOffset and CommittedOffset, per group, topic
// and queue, across a restart.
func testCommittedOffsets(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	createTopic(t, b, "t1", 2)
	createTopic(t, b, "t2", 2)

	_, err := b.CommittedOffset(ctx, "g1", "t1", 0)
	require.ErrorIs(t, err, core.ErrNoCommittedOffset)

	require.NoError(t, b.CommitOffset(ctx, "g1", "t1", 0, 5))
	require.NoError(t, b.CommitOffset(ctx, "g1", "t1", 0, 7)) // the last commit counts
	require.NoError(t, b.CommitOffset(ctx, "g1", "t1", 1, 0)) // 0 is an offset, not "none"
	require.NoError(t, b.CommitOffset(ctx, "g2", "t1", 0, 3))
	require.NoError(t, b.CommitOffset(ctx, "g1", "t2", 1, 11))
	want := map[[3]string]int64{
		{"g1", "t1", "0"}: 7,
		{"g1", "t1", "1"}: 0,
		{"g2", "t1", "0"}: 3,
		{"g1", "t2", "1"}: 11,
	}
	none := [][3]string{{"g2", "t1", "1"}, {"g1", "t2", "0"}, {"g2", "t2", "1"}, {"g3", "t1", "0"}}
	check := func(b core.Broker) {
		t.Helper()
		for k, v := range want {
			q, _ := strconv.Atoi(k[2])
			got, err := b.CommittedOffset(ctx, k[0], k[1], q)
			require.NoError(t, err, "%v", k)
			require.Equal(t, v, got, "%v", k)
		}
		for _, k := range none {
			q, _ := strconv.Atoi(k[2])
			_, err := b.CommittedOffset(ctx, k[0], k[1], q)
			require.ErrorIs(t, err, core.ErrNoCommittedOffset, "%v", k)
		}
	}
	check(b)
	if f.Reopen == nil {
		t.Log("brokertest: no Reopen: committed offsets not checked across a restart")
		return
	}
	b = f.Reopen(t, b)
	check(b) // "Committed offsets persist."
}

// testArrivals: a channel taken before a produce is closed once the message
// is readable; for its topic and for "".
func testArrivals(t *testing.T, f Factory) {
	b := f.Open(t)
	createTopic(t, b, "ar", 1)
	createTopic(t, b, "other", 1)

	closed := func(ch <-chan struct{}) func() bool {
		return func() bool {
			select {
			case <-ch:
				return true
			default:
				return false
			}
		}
	}
	for round := range 3 { // channels are re-armed after each arrival
		mine, anyTopic := b.Arrivals("ar"), b.Arrivals("")
		r := produce(t, b, &core.Message{Topic: "ar", Body: []byte(strconv.Itoa(round))})
		require.Eventually(t, closed(mine), wait, tick, "round %d: Arrivals(topic) closes", round)
		require.Eventually(t, closed(anyTopic), wait, tick, "round %d: Arrivals(\"\") closes", round)
		res, err := b.Read(t.Context(), core.ReadRequest{Topic: "ar", Offset: r.QueueOffset})
		require.NoError(t, err)
		require.NotEmpty(t, res.Messages, "round %d: readable once announced", round)
		require.Equal(t, r.ID, res.Messages[0].ID)
	}

	// A produce to another topic wakes "" waiters.
	anyTopic := b.Arrivals("")
	produce(t, b, &core.Message{Topic: "other"})
	require.Eventually(t, closed(anyTopic), wait, tick, "Arrivals(\"\") closes for any topic")

	// Waiting on a topic before it exists.
	later := b.Arrivals("later")
	createTopic(t, b, "later", 1)
	produce(t, b, &core.Message{Topic: "later"})
	require.Eventually(t, closed(later), wait, tick, "Arrivals of a topic created after the call")
}

// testGetUnknownID: Get of an ID that names nothing here is
// ErrMessageNotFound.
func testGetUnknownID(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	// The topics are created explicitly: this case is about Get, and must
	// hold for an engine that does not auto-create (Factory.NoAutoCreate).
	createTopic(t, b, "get", 0)
	r := produce(t, b, &core.Message{Topic: "get", Body: []byte("here")})

	foreignBroker := f.Open(t)
	createTopic(t, foreignBroker, "get-foreign", 0)
	foreign := produce(t, foreignBroker, &core.Message{Topic: "get-foreign", Body: []byte("there")})

	tail := r.ID // a real ID with its location bytes ruined
	for i := 4; i < len(tail); i++ {
		tail[i] = 0xFF
	}
	var unknownKind core.MessageID
	for i := range unknownKind {
		unknownKind[i] = 0x5A
	}
	unknownKind[0] = 0xFF
	for _, c := range []struct {
		name string
		id   core.MessageID
	}{
		{"zero", core.MessageID{}},
		{"unknown kind", unknownKind},
		{"another engine's", foreign.ID},
		{"location ruined", tail},
	} {
		_, err := b.Get(ctx, c.id)
		require.ErrorIs(t, err, core.ErrMessageNotFound, "%s ID %s", c.name, c.id)
	}
	got := mustGet(t, b, r.ID)
	require.Equal(t, "here", string(got.Body), "the real one still resolves")
}

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

// testDeleteTopic: a deleted topic is gone at once, and one created later
// under its name starts empty.
func testDeleteTopic(t *testing.T, f Factory) {
	if f.NoDeleteTopic {
		t.Skip("brokertest: capability DeleteTopic not provided (NoDeleteTopic)")
	}
	ctx := t.Context()
	b := f.Open(t)
	createTopic(t, b, "orders", 2)
	createTopic(t, b, "keep", 2)
	createTopic(t, b, "gone", 1)

	var old []core.SendResult
	for _, body := range []string{"a", "b", "c"} {
		old = append(old, produce(t, b, &core.Message{Topic: "orders", ShardingKey: "car-1", Keys: []string{"o-" + body}, Body: []byte(body)}))
	}
	kept := produce(t, b, &core.Message{Topic: "keep", ShardingKey: "car-1", Body: []byte("keep")})
	goneMsg := produce(t, b, &core.Message{Topic: "gone", Body: []byte("gone")})
	require.NoError(t, b.CommitOffset(ctx, "g", "orders", old[0].Queue, 2))
	require.NoError(t, b.CommitOffset(ctx, "g", "keep", kept.Queue, 1))

	require.NoError(t, b.DeleteTopic(ctx, "orders"))
	require.NoError(t, b.DeleteTopic(ctx, "gone"))

	// Gone at once, everywhere.
	for _, name := range []string{"orders", "gone"} {
		_, err := b.Topic(ctx, name)
		require.ErrorIs(t, err, core.ErrTopicNotFound, "Topic(%s)", name)
		_, err = b.Read(ctx, core.ReadRequest{Topic: name})
		require.ErrorIs(t, err, core.ErrTopicNotFound, "Read(%s)", name)
		_, err = b.FindByKey(ctx, name, "car-1", core.KeyQuery{})
		require.ErrorIs(t, err, core.ErrTopicNotFound, "FindByKey(%s)", name)
		_, err = b.Backlog(ctx, name, 0, 0)
		require.ErrorIs(t, err, core.ErrTopicNotFound, "Backlog(%s)", name)
		require.ErrorIs(t, b.DeleteTopic(ctx, name), core.ErrTopicNotFound, "deleting %s again", name)
	}
	for _, r := range append(old, goneMsg) {
		_, err := b.Get(ctx, r.ID)
		require.ErrorIs(t, err, core.ErrMessageNotFound, "Get of a deleted topic's message")
	}
	_, err := b.CommittedOffset(ctx, "g", "orders", old[0].Queue)
	require.ErrorIs(t, err, core.ErrNoCommittedOffset, "committed offsets go with the topic")
	list, err := b.Topics(ctx)
	require.NoError(t, err)
	for _, ti := range list {
		require.NotContains(t, []string{"orders", "gone"}, ti.Name, "Topics lists a deleted topic")
	}

	require.ErrorIs(t, b.DeleteTopic(ctx, "never"), core.ErrTopicNotFound)
	require.ErrorIs(t, b.DeleteTopic(ctx, "%DLQ%g"), core.ErrInvalidTopic, "system topics cannot be deleted")
	require.ErrorIs(t, b.DeleteTopic(ctx, "bad/name"), core.ErrInvalidTopic)

	// A new incarnation, with another queue count, starts empty.
	info, err := b.CreateTopic(ctx, core.TopicConfig{Name: "orders", Queues: 4})
	require.NoError(t, err)
	if f.SparseOffsets {
		require.Len(t, info.Ranges, 4)
		for q, rg := range info.Ranges {
			require.Equal(t, rg.Min, rg.Max, "queue %d: a recreated topic starts empty", q)
		}
	} else {
		require.Equal(t, make([]core.QueueRange, 4), info.Ranges, "a recreated topic starts empty")
	}
	for q := range 4 {
		for _, from := range []int64{0, info.Ranges[q].Min} {
			n, err := b.Backlog(ctx, "orders", q, from)
			require.NoError(t, err)
			require.Zero(t, n, "queue %d from %d: a recreated topic starts empty", q, from)
		}
	}
	fresh := produce(t, b, &core.Message{Topic: "orders", ShardingKey: "car-1", Keys: []string{"o-a"}, Body: []byte("new")})
	if f.SparseOffsets {
		require.GreaterOrEqual(t, fresh.QueueOffset, info.Ranges[fresh.Queue].Max, "after the recreated topic's empty range")
	} else {
		require.Equal(t, int64(0), fresh.QueueOffset)
	}
	freshOffsets := make([][]int64, 4)
	freshOffsets[fresh.Queue] = []int64{fresh.QueueOffset}

	check := func(b core.Broker) {
		t.Helper()
		info, err := b.Topic(ctx, "orders")
		require.NoError(t, err)
		require.Equal(t, 4, info.Queues)
		var bodies []string
		for q := range info.Queues {
			for _, m := range readQueue(t, f, b, "orders", q) {
				bodies = append(bodies, string(m.Body))
			}
		}
		require.Equal(t, []string{"new"}, bodies, "only the new incarnation's messages")
		requireOffsets(t, f, b, "orders", freshOffsets)
		requireMatchesResult(t, f, fresh, mustGet(t, b, fresh.ID))
		for _, key := range []string{"car-1", "o-a"} {
			found, err := b.FindByKey(ctx, "orders", key, core.KeyQuery{})
			require.NoError(t, err)
			require.Len(t, found, 1, "key %s: the old incarnation is not found", key)
			require.Equal(t, fresh.ID, found[0].ID)
		}
		for _, r := range append(old, goneMsg) {
			_, err := b.Get(ctx, r.ID)
			require.ErrorIs(t, err, core.ErrMessageNotFound)
		}
		require.Equal(t, "new", string(mustGet(t, b, fresh.ID).Body))
		_, err = b.CommittedOffset(ctx, "g", "orders", old[0].Queue)
		require.ErrorIs(t, err, core.ErrNoCommittedOffset)

		// The other topics are untouched.
		require.Equal(t, "keep", string(mustGet(t, b, kept.ID).Body))
		found, err := b.FindByKey(ctx, "keep", "car-1", core.KeyQuery{})
		require.NoError(t, err)
		require.Len(t, found, 1)
		o, err := b.CommittedOffset(ctx, "g", "keep", kept.Queue)
		require.NoError(t, err)
		require.Equal(t, int64(1), o)
		_, err = b.Topic(ctx, "gone")
		require.ErrorIs(t, err, core.ErrTopicNotFound)
	}
	check(b)
	if f.Reopen == nil {
		t.Log("brokertest: no Reopen: deletion not checked across a restart")
		return
	}
	check(f.Reopen(t, b))
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
	errc := make(chan error, 1)
	b.ProduceAsync([]*core.Message{m}, func(_ []core.SendResult, err error) {
		select {
		case errc <- err:
		default:
		}
	})
	select {
	case err := <-errc:
		closed("ProduceAsync", err)
	case <-time.After(wait):
		require.Fail(t, "ProduceAsync after Close never called done")
	}
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

// createTopic creates a topic with n queues (0: the default).
func createTopic(t testing.TB, b core.Broker, name string, n int) core.TopicInfo {
	t.Helper()
	info, err := b.CreateTopic(t.Context(), core.TopicConfig{Name: name, Queues: n})
	require.NoError(t, err, "create topic %s", name)
	if n > 0 {
		require.Equal(t, n, info.Queues)
	}
	return info
}

func produce(t testing.TB, b core.Broker, m *core.Message) core.SendResult {
	t.Helper()
	r, err := b.Produce(t.Context(), m)
	require.NoError(t, err, "produce to %s", m.Topic)
	return r
}

// produceAsync produces msgs with ProduceAsync and waits for done.
func produceAsync(t testing.TB, b core.Broker, msgs []*core.Message) []core.SendResult {
	t.Helper()
	res, err := awaitAsync(t, b, msgs)
	require.NoError(t, err, "ProduceAsync")
	require.Len(t, res, len(msgs), "ProduceAsync: one result per message")
	return res
}

// awaitAsync produces msgs with ProduceAsync and returns what done was
// called with, failing the test only if done is never called.
func awaitAsync(t testing.TB, b core.Broker, msgs []*core.Message) ([]core.SendResult, error) {
	t.Helper()
	type answer struct {
		res []core.SendResult
		err error
	}
	done := make(chan answer, 1)
	b.ProduceAsync(msgs, func(res []core.SendResult, err error) {
		select { // never block an engine goroutine, even if done runs twice
		case done <- answer{res, err}:
		default:
		}
	})
	select {
	case a := <-done:
		return a.res, a.err
	case <-time.After(wait):
		require.FailNow(t, "ProduceAsync never called done")
		return nil, nil
	}
}

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

// queueOffset names a message by queue and offset.
type queueOffset struct {
	queue  int
	offset int64
}

// keysForQueues returns n sharding keys, the q-th of which core.QueueFor
// puts in queue q of n.
func keysForQueues(n int) []string {
	keys := make([]string, n)
	found := 0
	for i := 0; found < n; i++ {
		k := "key-" + strconv.Itoa(i)
		if q := core.QueueFor(k, n); keys[q] == "" {
			keys[q] = k
			found++
		}
	}
	return keys
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
