package store

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestRetentionByAge(t *testing.T) {
	ctx := t.Context()
	clock := &testClock{now: time.Unix(1_700_000_000, 0)}
	dir := t.TempDir()
	opts := Options{DefaultQueues: 2, SegmentBytes: 4096, MaxMessageBytes: 2048, Now: clock.Now,
		Retention: time.Hour, RetentionInterval: time.Hour, ConsumeQueueFileEntries: 16, IndexSlots: 16, IndexEntries: 32}
	s := openT(t, dir, opts)
	body := make([]byte, 200)
	var old, recent []core.SendResult
	for i := 0; i < 60; i++ {
		r, err := s.Produce(ctx, &core.Message{Topic: "r", ShardingKey: "k", Keys: []string{"x"}, Body: body})
		require.NoError(t, err)
		old = append(old, r)
	}
	clock.Add(2 * time.Hour)
	for i := 0; i < 30; i++ {
		r, err := s.Produce(ctx, &core.Message{Topic: "r", ShardingKey: "k", Keys: []string{"x"}, Body: body})
		require.NoError(t, err)
		recent = append(recent, r)
	}
	segsBefore := len(s.cl.segmentList())
	n, err := s.RunRetention()
	require.NoError(t, err)
	require.Positive(t, n)
	require.Len(t, s.cl.segmentList(), segsBefore-n)

	logMin, _ := s.cl.bounds()
	q := recent[0].Queue
	info, err := s.Topic(ctx, "r")
	require.NoError(t, err)
	rng := info.Ranges[q]
	require.Positive(t, rng.Min, "the queue's minimum moved up")
	// Everything from the new minimum on is readable; nothing older is served.
	msgs := readAll(t, s, "r", q)
	require.Equal(t, int(rng.Max-rng.Min), len(msgs))
	require.Equal(t, rng.Min, msgs[0].QueueOffset)
	for _, r := range recent {
		_, err := s.Get(ctx, r.ID)
		require.NoError(t, err)
	}
	_, err = s.Get(ctx, old[0].ID)
	require.ErrorIs(t, err, core.ErrMessageNotFound)
	require.GreaterOrEqual(t, old[len(old)-1].CommitLogOffset+1, logMin-4096, "only whole old segments went")
	res, err := s.Read(ctx, core.ReadRequest{Topic: "r", Queue: q, Offset: 0})
	require.NoError(t, err)
	require.True(t, res.Clamped)
	require.Equal(t, rng.Min, res.Messages[0].QueueOffset)

	// Consume-queue and index files that only pointed at deleted segments are gone.
	cqFiles, err := os.ReadDir(queueDir(dir, "r", q))
	require.NoError(t, err)
	require.Less(t, len(cqFiles), 90/16+1)
	found, err := s.FindByKey(ctx, "r", "x", core.KeyQuery{Max: 1000})
	require.NoError(t, err)
	for _, m := range found {
		require.GreaterOrEqual(t, m.CommitLogOffset, logMin)
	}
	require.GreaterOrEqual(t, len(found), len(recent))

	// The state survives a reopen.
	require.NoError(t, s.Close())
	s2 := openT(t, dir, opts)
	info2, err := s2.Topic(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, rng, info2.Ranges[q])
}

func TestRetentionByDiskCeiling(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	opts := Options{DefaultQueues: 1, SegmentBytes: 4096, MaxMessageBytes: 2048, MaxDiskBytes: 3 * 4096,
		RetentionInterval: time.Hour, IndexSlots: 16, IndexEntries: 32}
	s := openT(t, dir, opts)
	body := make([]byte, 300)
	for i := 0; i < 100; i++ {
		_, err := s.Produce(ctx, &core.Message{Topic: "d", Body: body})
		require.NoError(t, err)
	}
	_, err := s.RunRetention()
	require.NoError(t, err)
	require.LessOrEqual(t, s.cl.diskBytes(), int64(3*4096))
	names, err := os.ReadDir(filepath.Join(dir, dirCommitLog))
	require.NoError(t, err)
	require.LessOrEqual(t, len(names), 3)
	msgs := readAll(t, s, "d", 0)
	require.NotEmpty(t, msgs)
	require.Equal(t, int64(99), msgs[len(msgs)-1].QueueOffset, "the newest messages stay")
}

// TestRetentionRemovesRetiredQueues: the queues a shrink retired stay
// readable while they hold messages, and leave TopicInfo.Ranges once
// retention deleted what they held; a group's gate then waits for nothing
// there.
func TestRetentionRemovesRetiredQueues(t *testing.T) {
	ctx := t.Context()
	clock := &testClock{now: time.Unix(1_700_000_000, 0)}
	opts := Options{DefaultQueues: 4, SegmentBytes: 4096, MaxMessageBytes: 2048, Now: clock.Now,
		Retention: time.Hour, RetentionInterval: time.Hour, ConsumeQueueFileEntries: 16, IndexSlots: 16, IndexEntries: 32}
	s := openT(t, t.TempDir(), opts)
	body := make([]byte, 200)
	for i := range 60 {
		_, err := s.Produce(ctx, &core.Message{Topic: "r", ShardingKey: "k" + strconv.Itoa(i), Body: body})
		require.NoError(t, err)
	}
	info, err := s.ResizeTopic(ctx, "r", 2)
	require.NoError(t, err)
	require.Len(t, info.Ranges, 4, "the retired queues hold messages")
	clock.Add(2 * time.Hour)
	for i := range 40 {
		_, err := s.Produce(ctx, &core.Message{Topic: "r", ShardingKey: "k" + strconv.Itoa(i), Body: body})
		require.NoError(t, err)
	}
	// The segment that held the last messages of the old epoch took new
	// ones too: it goes once those are old as well.
	clock.Add(2 * time.Hour)
	for i := range 20 {
		_, err := s.Produce(ctx, &core.Message{Topic: "r", ShardingKey: "k" + strconv.Itoa(i), Body: body})
		require.NoError(t, err)
	}
	n, err := s.RunRetention()
	require.NoError(t, err)
	require.Positive(t, n)
	info, err = s.Topic(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, 2, info.Queues)
	require.Len(t, info.Ranges, 2, "retention emptied the retired queues: they are gone for readers")
	_, err = s.Read(ctx, core.ReadRequest{Topic: "r", Queue: 3})
	require.NoError(t, err, "a reader that still asks for a retired queue gets nothing, not an error")
	grown, err := s.ResizeTopic(ctx, "r", 4)
	require.NoError(t, err)
	require.Len(t, grown.Ranges, 4)
	require.GreaterOrEqual(t, grown.Ranges[3].Min, info.Epochs[1].Begin[3], "a queue taken up again goes on from its offsets")
}
