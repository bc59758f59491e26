package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store/vfs"
)

func TestMain(m *testing.M) {
	if runCrashChild() {
		return
	}
	goleak.VerifyTestMain(m)
}

// openT opens a store in a fresh temp dir (or dir, if given) and closes it at
// the end of the test.
func openT(t testing.TB, dir string, opts Options) *Store {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s, err := Open(dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func msg(topic, key string, i int) *core.Message {
	return &core.Message{
		Topic:       topic,
		ShardingKey: key,
		Tag:         fmt.Sprintf("tag%d", i%3),
		Keys:        []string{fmt.Sprintf("order-%d", i)},
		Properties:  map[string]string{"i": fmt.Sprint(i)},
		Body:        []byte(fmt.Sprintf("body-%d", i)),
	}
}

// readAll reads a whole queue from offset 0.
func readAll(t testing.TB, s *Store, topic string, q int) []*core.StoredMessage {
	t.Helper()
	var out []*core.StoredMessage
	off := int64(0)
	for {
		res, err := s.Read(context.Background(), core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 100})
		require.NoError(t, err)
		out = append(out, res.Messages...)
		if res.NextOffset == off {
			return out
		}
		off = res.NextOffset
	}
}

func TestProduceReadRoundTrip(t *testing.T) {
	ctx := t.Context()
	for _, policy := range []FlushPolicy{FlushAsync, FlushSync} {
		t.Run(string(policy), func(t *testing.T) {
			s := openT(t, "", Options{FlushPolicy: policy, DefaultQueues: 4})
			var sent []core.SendResult
			for i := 0; i < 100; i++ {
				r, err := s.Produce(ctx, msg("orders", fmt.Sprintf("dev-%d", i%7), i))
				require.NoError(t, err)
				sent = append(sent, r)
			}
			total := 0
			for q := 0; q < 4; q++ {
				msgs := readAll(t, s, "orders", q)
				for k, m := range msgs {
					require.Equal(t, int64(k), m.QueueOffset)
					require.Equal(t, q, m.Queue)
					require.Equal(t, core.QueueFor(m.ShardingKey, 4), q)
				}
				total += len(msgs)
			}
			require.Equal(t, 100, total)

			for i, r := range sent {
				m, err := s.Get(ctx, r.ID)
				require.NoError(t, err)
				require.Equal(t, fmt.Sprintf("body-%d", i), string(m.Body))
				require.Equal(t, fmt.Sprint(i), m.Properties["i"])
				require.Equal(t, r.QueueOffset, m.QueueOffset)
				require.Equal(t, r.ID, m.ID)
				// Born unset: the store stamps it, never after its store time.
				require.False(t, m.BornAt.IsZero())
				require.False(t, m.StoredAt.Before(m.BornAt), "stored %v before born %v", m.StoredAt, m.BornAt)
			}
		})
	}
}

func TestReopenKeepsEverything(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	s, err := Open(dir, Options{DefaultQueues: 2})
	require.NoError(t, err)
	for i := 0; i < 50; i++ {
		_, err := s.Produce(ctx, msg("a", "", i))
		require.NoError(t, err)
	}
	require.NoError(t, s.CommitOffset(ctx, "g1", "a", 1, 7))
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.Close(), nil)

	s = openT(t, dir, Options{DefaultQueues: 2})
	require.Len(t, readAll(t, s, "a", 0), 25)
	require.Len(t, readAll(t, s, "a", 1), 25)
	o, err := s.CommittedOffset(ctx, "g1", "a", 1)
	require.NoError(t, err)
	require.Equal(t, int64(7), o)
	_, err = s.CommittedOffset(ctx, "g1", "a", 0)
	require.ErrorIs(t, err, core.ErrNoCommittedOffset)

	// Appends continue where they left off, round-robin included.
	r, err := s.Produce(ctx, msg("a", "", 50))
	require.NoError(t, err)
	require.Equal(t, int64(25), r.QueueOffset)
}

func TestSegmentsRoll(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	opts := Options{SegmentBytes: 4096, MaxMessageBytes: 2048, DefaultQueues: 1}
	s := openT(t, dir, opts)
	body := make([]byte, 300)
	for i := 0; i < 100; i++ {
		_, err := s.Produce(ctx, &core.Message{Topic: "t", Body: body})
		require.NoError(t, err)
	}
	segs := s.cl.segmentList()
	require.Greater(t, len(segs), 5)
	for i := 1; i < len(segs); i++ {
		require.Equal(t, segs[i-1][1], segs[i][0], "segments abut")
		require.LessOrEqual(t, segs[i-1][1]-segs[i-1][0], int64(4096))
	}
	require.Len(t, readAll(t, s, "t", 0), 100)
	require.NoError(t, s.Close())
	s2 := openT(t, dir, opts)
	require.Len(t, readAll(t, s2, "t", 0), 100)
}

// TestOffsetAtUnconfirmedTail: the writer publishes consume-queue entries a
// moment before the readable end moves past their records. A time lookup in
// that window must not skip them — they are the newest messages — as a
// broadcast consumer starting "at the messages stored since its start" once
// did with the first two commands of a new topic.
func TestOffsetAtUnconfirmedTail(t *testing.T) {
	ctx := t.Context()
	now := time.Unix(1_700_000_000, 0)
	s := openT(t, t.TempDir(), Options{DefaultQueues: 1, Now: func() time.Time { return now }})
	var first int64 = -1
	for i := range 10 {
		now = now.Add(time.Second)
		r, err := s.Produce(ctx, msg("k", "", i))
		require.NoError(t, err)
		if first < 0 {
			first = r.CommitLogOffset
		}
	}
	end := s.confirmed.Load()
	s.confirmed.Store(first) // the window: entries dispatched, none readable yet
	defer s.confirmed.Store(end)
	off, err := s.OffsetAt(ctx, "k", 0, time.Unix(1_700_000_000, 0))
	require.NoError(t, err)
	require.Equal(t, int64(0), off, "nothing readable yet is before the time asked")
}

func TestFindByKeyAndOffsetAt(t *testing.T) {
	ctx := t.Context()
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	dir := t.TempDir()
	opts := Options{DefaultQueues: 1, Now: clock, IndexSlots: 16, IndexEntries: 64}
	s := openT(t, dir, opts)
	var ids []core.MessageID
	for i := 0; i < 200; i++ {
		now = now.Add(time.Second)
		m := msg("k", fmt.Sprintf("car-%d", i%5), i)
		r, err := s.Produce(ctx, m)
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	check := func(s *Store) {
		got, err := s.FindByKey(ctx, "k", "order-42", core.KeyQuery{})
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, ids[42], got[0].ID)

		got, err = s.FindByKey(ctx, "k", "car-3", core.KeyQuery{Max: 1000})
		require.NoError(t, err)
		require.Len(t, got, 40)
		for i := 1; i < len(got); i++ {
			require.Less(t, got[i-1].CommitLogOffset, got[i].CommitLogOffset, "oldest first")
		}
		begin := time.Unix(1_700_000_000+100, 0)
		got, err = s.FindByKey(ctx, "k", "car-3", core.KeyQuery{Begin: begin, Max: 1000})
		require.NoError(t, err)
		require.Len(t, got, 20)

		got, err = s.FindByKey(ctx, "k", "nope", core.KeyQuery{})
		require.NoError(t, err)
		require.Empty(t, got)

		off, err := s.OffsetAt(ctx, "k", 0, time.Unix(1_700_000_000+50, 0))
		require.NoError(t, err)
		require.Equal(t, int64(49), off)
		off, err = s.OffsetAt(ctx, "k", 0, time.Unix(1_800_000_000, 0))
		require.NoError(t, err)
		require.Equal(t, int64(200), off)
		off, err = s.OffsetAt(ctx, "k", 0, time.Unix(0, 0))
		require.NoError(t, err)
		require.Equal(t, int64(0), off)
	}
	check(s)
	require.NoError(t, s.Close())
	check(openT(t, dir, opts))
}

func TestBadInput(t *testing.T) {
	ctx := t.Context()
	s := openT(t, "", Options{MaxMessageBytes: 64 << 10, MaxPropertiesBytes: 1024})
	cases := []struct {
		name string
		m    *core.Message
		want error
	}{
		{"nil", nil, core.ErrInvalidMessage},
		{"empty topic", &core.Message{Topic: ""}, core.ErrInvalidTopic},
		{"slash in topic", &core.Message{Topic: "a/b"}, core.ErrInvalidTopic},
		{"long topic", &core.Message{Topic: string(make([]byte, 128))}, core.ErrInvalidTopic},
		{"too large", &core.Message{Topic: "t", Body: make([]byte, 64<<10)}, core.ErrMessageTooLarge},
		{"big properties", &core.Message{Topic: "t", Properties: map[string]string{"k": string(make([]byte, 2000))}}, core.ErrPropertiesTooLarge},
		{"empty property name", &core.Message{Topic: "t", Properties: map[string]string{"": "v"}}, core.ErrInvalidMessage},
		{"empty key", &core.Message{Topic: "t", Keys: []string{""}}, core.ErrInvalidMessage},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.Produce(ctx, c.m)
			require.ErrorIs(t, err, c.want)
		})
	}
	// An empty body is allowed: MQTT publishes may carry none.
	r, err := s.Produce(ctx, &core.Message{Topic: "t"})
	require.NoError(t, err)
	m, err := s.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Empty(t, m.Body)

	_, err = s.Read(ctx, core.ReadRequest{Topic: "missing"})
	require.ErrorIs(t, err, core.ErrTopicNotFound)
	_, err = s.Read(ctx, core.ReadRequest{Topic: "t", Queue: 99})
	require.ErrorIs(t, err, core.ErrQueueNotFound)
	res, err := s.Read(ctx, core.ReadRequest{Topic: "t", Queue: r.Queue, Offset: 1 << 40})
	require.NoError(t, err)
	require.True(t, res.Clamped)
	require.Empty(t, res.Messages)
	res, err = s.Read(ctx, core.ReadRequest{Topic: "t", Queue: r.Queue, Offset: -5})
	require.NoError(t, err)
	require.True(t, res.Clamped)
	require.Len(t, res.Messages, 1)

	// IDs that point nowhere are refused without reading garbage.
	bogus := []core.MessageID{
		core.NewCommitLogID(s.ID(), 1<<40, 100),
		core.NewCommitLogID(s.ID(), 0, 0x7FFFFFFF),
		core.NewCommitLogID(s.ID()^1, r.CommitLogOffset, m.Size),
		core.NewCommitLogID(s.ID(), r.CommitLogOffset+1, m.Size),
		{},
	}
	for _, id := range bogus {
		_, err := s.Get(ctx, id)
		require.Error(t, err, id.String())
		require.True(t, errors.Is(err, core.ErrMessageNotFound) || errors.Is(err, core.ErrCorrupt), err)
	}
}

func TestDisableAutoCreate(t *testing.T) {
	ctx := t.Context()
	s := openT(t, "", Options{DisableAutoCreate: true})
	_, err := s.Produce(ctx, &core.Message{Topic: "t"})
	require.ErrorIs(t, err, core.ErrTopicNotFound)
	info, err := s.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 3})
	require.NoError(t, err)
	require.Equal(t, 3, info.Queues)
	_, err = s.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 4})
	require.ErrorIs(t, err, core.ErrTopicExists)
	_, err = s.Produce(ctx, &core.Message{Topic: "t"})
	require.NoError(t, err)
	list, err := s.Topics(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
}

func TestLockedDir(t *testing.T) {
	dir := t.TempDir()
	openT(t, dir, Options{})
	_, err := Open(dir, Options{})
	require.ErrorIs(t, err, ErrLocked)
}

func TestBadOptions(t *testing.T) {
	_, err := Open(t.TempDir(), Options{FlushPolicy: "sometimes", SegmentBytes: 10, DefaultQueues: 5000})
	require.ErrorIs(t, err, ErrBadOptions)
	require.Contains(t, err.Error(), "flush policy")
	require.Contains(t, err.Error(), "segment bytes")
	require.Contains(t, err.Error(), "default queues")
}

func TestClosed(t *testing.T) {
	s, err := Open("/data", Options{FS: vfs.NewCrashFS()})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_, err = s.Produce(t.Context(), &core.Message{Topic: "t"})
	require.ErrorIs(t, err, core.ErrClosed)
	_, err = s.Read(t.Context(), core.ReadRequest{Topic: "t"})
	require.ErrorIs(t, err, core.ErrClosed)
}

func TestReadFiltersByTag(t *testing.T) {
	ctx := t.Context()
	s := openT(t, "", Options{DefaultQueues: 1})
	for i := 0; i < 30; i++ {
		_, err := s.Produce(ctx, &core.Message{Topic: "tg", Tag: fmt.Sprintf("t%d", i%3), Body: []byte(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	res, err := s.Read(ctx, core.ReadRequest{Topic: "tg", Tags: []string{"t1", "t2"}, MaxCount: 100})
	require.NoError(t, err)
	require.Len(t, res.Messages, 20)
	for _, m := range res.Messages {
		require.NotEqual(t, "t0", m.Tag)
	}
	require.Equal(t, int64(30), res.NextOffset, "filtered messages still advance the offset")
	res, err = s.Read(ctx, core.ReadRequest{Topic: "tg", Tags: []string{"none"}, MaxCount: 100})
	require.NoError(t, err)
	require.Empty(t, res.Messages)
	require.Equal(t, int64(30), res.NextOffset)
}

func TestProduceAsyncKeepsCallOrder(t *testing.T) {
	for _, policy := range []FlushPolicy{FlushAsync, FlushSync} {
		t.Run(string(policy), func(t *testing.T) {
			s := openT(t, "", Options{FlushPolicy: policy, DefaultQueues: 4})
			const n = 2000
			var wg sync.WaitGroup
			wg.Add(n)
			var mu sync.Mutex
			calls := map[int]int{}
			for i := 0; i < n; i++ {
				m := &core.Message{Topic: "a", ShardingKey: fmt.Sprintf("k%d", i%5), Body: []byte(strconv.Itoa(i))}
				s.ProduceAsync([]*core.Message{m}, func(res []core.SendResult, err error) {
					defer wg.Done()
					require.NoError(t, err)
					require.Len(t, res, 1)
					mu.Lock()
					calls[i]++
					mu.Unlock()
				})
			}
			wg.Wait()
			for i := 0; i < n; i++ {
				require.Equal(t, 1, calls[i], "done called exactly once")
			}
			for q := 0; q < 4; q++ {
				last := map[string]int{}
				for _, m := range readAll(t, s, "a", q) {
					v, _ := strconv.Atoi(string(m.Body))
					if p, ok := last[m.ShardingKey]; ok {
						require.Less(t, p, v, "per-key order is call order")
					}
					last[m.ShardingKey] = v
				}
			}
			require.NoError(t, s.Close())
			errc := make(chan error, 1)
			s.ProduceAsync([]*core.Message{{Topic: "a"}}, func(_ []core.SendResult, err error) { errc <- err })
			require.ErrorIs(t, <-errc, core.ErrClosed)
			s.ProduceAsync([]*core.Message{{Topic: "bad/topic"}}, func(_ []core.SendResult, err error) { errc <- err })
			require.Error(t, <-errc)
		})
	}
}

func TestArrivalsPerTopic(t *testing.T) {
	ctx := t.Context()
	s := openT(t, "", Options{})
	any, a := s.Arrivals(""), s.Arrivals("a")
	_, err := s.Produce(ctx, &core.Message{Topic: "b"})
	require.NoError(t, err)
	select {
	case <-any:
	default:
		t.Fatal("a produce to any topic wakes Arrivals(\"\")")
	}
	select {
	case <-a:
		t.Fatal("a produce to b must not wake waiters of a")
	default:
	}
	_, err = s.Produce(ctx, &core.Message{Topic: "a"})
	require.NoError(t, err)
	select {
	case <-a:
	default:
		t.Fatal("a produce to a wakes its waiters")
	}
}

// TestBatchOverManyChunksReadsBack: a batch far larger than a chunk is
// written as several chunks, in order, and reads back whole — across a
// restart too.
func TestBatchOverManyChunksReadsBack(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{FlushPolicy: FlushSync})
	var msgs []*core.Message
	total := 0
	for i := range 400 { // ~1.6 MB: several chunks
		body := bytes.Repeat([]byte{byte(i)}, 4000+i)
		total += len(body)
		msgs = append(msgs, &core.Message{Topic: "big", ShardingKey: "k", Body: body})
	}
	require.Greater(t, total, 4*chunkBytes)
	res, err := s.ProduceBatch(t.Context(), msgs)
	require.NoError(t, err)
	require.Len(t, res, len(msgs))
	check := func(s *Store) {
		t.Helper()
		got := readAll(t, s, "big", res[0].Queue)
		require.Len(t, got, len(msgs))
		for i, m := range got {
			require.Equal(t, msgs[i].Body, m.Body, "message %d", i)
			require.Equal(t, res[i].CommitLogOffset, m.CommitLogOffset)
		}
	}
	check(s)
	require.NoError(t, s.Close())
	check(openT(t, dir, Options{FlushPolicy: FlushSync}))
}

// Every fsync lands in one bucket of Stats.FsyncCounts, and the sum of the
// buckets is the number of fsyncs.
func TestFsyncTimesCounted(t *testing.T) {
	s := openT(t, t.TempDir(), Options{FlushPolicy: FlushSync, DefaultQueues: 1})
	for i := range 20 {
		_, err := s.Produce(t.Context(), msg("f", "", i))
		require.NoError(t, err)
	}
	st := s.Stats()
	require.Len(t, st.FsyncCounts, len(FsyncBuckets)+1)
	var n int64
	for _, c := range st.FsyncCounts {
		n += c
	}
	require.Positive(t, st.Fsyncs)
	require.Equal(t, st.Fsyncs, n)
	require.Positive(t, st.FsyncTime)
}
