package gate_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/gate"
	"github.com/ferrymq/ferrymq/core/store"
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Open(t.TempDir(), store.Options{IndexSlots: 64, IndexEntries: 1024, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func produce(t *testing.T, s *store.Store, topic string, keys int) {
	t.Helper()
	for k := range keys {
		_, err := s.Produce(t.Context(), &core.Message{Topic: topic, ShardingKey: "k" + strconv.Itoa(k), Body: []byte("x")})
		require.NoError(t, err)
	}
}

// TestUntil: on a real store, a queue of a grown topic is held at its
// epoch's first offset until the group committed its source up to where
// the source's epoch ended; a topic never resized is never held; a read
// that reports an epoch the gate has not seen says it is stale.
func TestUntil(t *testing.T) {
	ctx := t.Context()
	s := openStore(t)
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 2})
	require.NoError(t, err)
	produce(t, s, "t", 20)
	g := gate.New(s)

	until, err := g.Until(ctx, "grp", "t", 1, nil)
	require.NoError(t, err)
	require.Equal(t, int64(-1), until, "never resized: no limit")
	res, err := s.Read(ctx, core.ReadRequest{Topic: "t", Queue: 1})
	require.NoError(t, err)
	stale, err := g.Stale(ctx, "t", res.Epochs)
	require.NoError(t, err)
	require.False(t, stale)

	info, err := s.ResizeTopic(ctx, "t", 4)
	require.NoError(t, err)
	produce(t, s, "t", 20)
	res, err = s.Read(ctx, core.ReadRequest{Topic: "t", Queue: 3})
	require.NoError(t, err)
	stale, err = g.Stale(ctx, "t", res.Epochs)
	require.NoError(t, err)
	require.True(t, stale, "the gate learns of the resize from a read")

	// Queue 3's source is 1 (3 mod 2): held at 0 until the group is done
	// with queue 1 up to where epoch 1 began in it.
	until, err = g.Until(ctx, "grp", "t", 3, nil)
	require.NoError(t, err)
	require.Equal(t, int64(0), until)
	// Queue 1 itself: its old messages are free, its new ones wait for
	// its own old ones (its source is itself).
	until, err = g.Until(ctx, "grp", "t", 1, nil)
	require.NoError(t, err)
	require.Equal(t, info.Epochs[1].Begin[1], until)

	begin1 := info.Epochs[1].Begin[1]
	require.NoError(t, s.CommitOffset(ctx, "grp", "t", 1, begin1-1))
	until, err = g.Until(ctx, "grp", "t", 3, nil)
	require.NoError(t, err)
	require.Equal(t, int64(0), until, "one message short")
	require.NoError(t, s.CommitOffset(ctx, "grp", "t", 1, begin1))
	until, err = g.Until(ctx, "grp", "t", 3, nil)
	require.NoError(t, err)
	require.Equal(t, int64(-1), until, "the source is done")

	// Another group is held on its own offsets; start says where a group
	// that never committed begins.
	until, err = g.Until(ctx, "late", "t", 3, func(int) (int64, error) { return begin1, nil })
	require.NoError(t, err)
	require.Equal(t, int64(-1), until, "a group starting at the end of the old messages waits for nothing")

	// A reset moves offsets back: what was open is looked at again.
	require.NoError(t, s.CommitOffset(ctx, "grp", "t", 1, 0))
	until, err = g.Until(ctx, "grp", "t", 3, nil)
	require.NoError(t, err)
	require.Equal(t, int64(-1), until, "remembered open until forgotten")
	g.Forget("grp", "t")
	until, err = g.Until(ctx, "grp", "t", 3, nil)
	require.NoError(t, err)
	require.Equal(t, int64(0), until)
}

// refreshingReads is the real store with one thing added: its first read
// of queue 3 lets another reader refresh the gate's epochs first, as a
// second group member reading another queue does between this read's limit
// and its check. A wrapper because the interleaving must be exact.
type refreshingReads struct {
	*store.Store
	g    *gate.Gate
	once sync.Once
}

func (r *refreshingReads) Read(ctx context.Context, req core.ReadRequest) (core.ReadResult, error) {
	if req.Queue == 3 {
		r.once.Do(func() { _, _ = r.g.Stale(ctx, req.Topic, 2) })
	}
	return r.Store.Read(ctx, req)
}

// TestReadBehindARefreshByAnotherReader: a read made with a limit computed
// before the gate knew of a resize is read again behind the new barriers,
// even when another reader refreshed the gate's epochs in the meantime
// (the check compared the read with the epochs the gate knew at the end,
// and handed out a new epoch's messages before their keys' older ones).
func TestReadBehindARefreshByAnotherReader(t *testing.T) {
	ctx := t.Context()
	s := openStore(t)
	_, err := s.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 2})
	require.NoError(t, err)
	produce(t, s, "t", 20)
	r := &refreshingReads{Store: s}
	g := gate.New(r)
	r.g = g
	until, err := g.Until(ctx, "grp", "t", 1, nil) // the gate knows one epoch
	require.NoError(t, err)
	require.Equal(t, int64(-1), until)

	_, err = s.ResizeTopic(ctx, "t", 4)
	require.NoError(t, err)
	produce(t, s, "t", 20)
	res, held, err := g.Read(ctx, "grp", core.ReadRequest{Topic: "t", Queue: 3, MaxCount: 100}, nil)
	require.NoError(t, err)
	require.True(t, held, "queue 3 waits for queue 1's old messages; got %d messages", len(res.Messages))
	require.Empty(t, res.Messages)
}
