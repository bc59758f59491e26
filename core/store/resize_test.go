package store

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// TestResizeAfterPowerLoss: messages appended but not yet durable
// (FlushAsync, no flush before the power goes) are lost, while the resize
// after them was written to topics.meta. Recovery must not leave the new
// epoch beginning past what the queues kept, or the next messages of the
// new count would count as the old epoch's and pass the barrier: each
// Begin comes down to its queue's recovered end, and the first produce of
// the new count is the epoch's first message.
func TestResizeAfterPowerLoss(t *testing.T) {
	ctx := t.Context()
	fsys := vfs.NewCrashFS()
	opts := Options{FS: fsys, FlushPolicy: FlushAsync, FlushInterval: time.Hour, CheckpointInterval: time.Hour,
		DefaultQueues: 4, IndexSlots: 64, IndexEntries: 4096}
	s, err := Open("/data", opts)
	require.NoError(t, err)
	_, err = s.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 4})
	require.NoError(t, err)
	for i := range 40 {
		_, err := s.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k" + strconv.Itoa(i), Body: []byte("x")})
		require.NoError(t, err) // acknowledged in the page cache: lost with the power
	}
	info, err := s.ResizeTopic(ctx, "t", 8)
	require.NoError(t, err)
	require.Equal(t, int64(40), sum(info.Epochs[1].Begin), "the epoch begins after the 40")
	crashed := fsys.CrashClone()
	require.NoError(t, s.Close())

	opts.FS = crashed
	s2, err := Open("/data", opts)
	require.NoError(t, err)
	defer s2.Close()
	info, err = s2.Topic(ctx, "t")
	require.NoError(t, err)
	require.Equal(t, 8, info.Queues, "the resize was durable")
	require.Len(t, info.Epochs, 2)
	for q, r := range info.Ranges {
		require.Equal(t, r.Max, info.Epochs[1].Begin[q], "queue %d: the epoch begins where the queue ends after the crash", q)
	}
	res, err := s2.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k3", Body: []byte("y")})
	require.NoError(t, err)
	require.Equal(t, core.QueueFor("k3", 8), res.Queue)
	require.Equal(t, info.Epochs[1].Begin[res.Queue], res.QueueOffset, "the first message of the new count is the epoch's first")

	require.NoError(t, s2.Close())
	s3, err := Open("/data", opts)
	require.NoError(t, err, "the lowered begins were written back")
	defer s3.Close()
	again, err := s3.Topic(ctx, "t")
	require.NoError(t, err)
	require.Equal(t, info.Epochs[1].Begin, again.Epochs[1].Begin)
}

// TestBadEpochsRefused: topics.meta epochs that break the layout's rules
// are refused at Open with ErrBadMetadata, not taken for a layout.
func TestBadEpochsRefused(t *testing.T) {
	for name, tm := range map[string]topicMeta{
		"count beyond the queues on disk": {Name: "t", Queues: 4, Epochs: []epochMeta{{Queues: 4}, {Queues: 8, Begin: make([]int64, 8)}}},
		"first epoch with a begin":        {Name: "t", Queues: 4, Epochs: []epochMeta{{Queues: 4, Begin: make([]int64, 4)}, {Queues: 2, Begin: make([]int64, 4)}}},
		"begin shorter than the queues":   {Name: "t", Queues: 8, Epochs: []epochMeta{{Queues: 4}, {Queues: 8, Begin: make([]int64, 4)}}},
		"begin going back":                {Name: "t", Queues: 8, Epochs: []epochMeta{{Queues: 4}, {Queues: 8, Begin: []int64{5, 5, 5, 5, 0, 0, 0, 0}}, {Queues: 2, Begin: []int64{4, 5, 5, 5, 0, 0, 0, 0}}}},
		"no queues":                       {Name: "t", Queues: 4, Epochs: []epochMeta{{Queues: 4}, {Queues: 0, Begin: make([]int64, 4)}}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := layoutOf(tm)
			require.ErrorIs(t, err, ErrBadMetadata)
		})
	}
	lay, err := layoutOf(topicMeta{Name: "t", Queues: 8, Epochs: []epochMeta{{Queues: 4}, {Queues: 8, Begin: []int64{5, 5, 5, 5, 0, 0, 0, 0}}, {Queues: 2, Begin: []int64{6, 5, 7, 5, 1, 0, 0, 3}}}})
	require.NoError(t, err)
	require.Equal(t, 2, lay.queues)
}

func sum(v []int64) int64 {
	var n int64
	for _, x := range v {
		n += x
	}
	return n
}
