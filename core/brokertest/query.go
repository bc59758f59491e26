package brokertest

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

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
