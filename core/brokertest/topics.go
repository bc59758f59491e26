package brokertest

import (
	"bytes"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

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
