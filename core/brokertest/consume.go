package brokertest

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

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
