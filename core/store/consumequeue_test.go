package store

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// TestConsumeQueueReadAcrossPending: a read that starts in the entries
// written to the file and goes on into those still pending returns both in
// one answer (a pull asked for 3 got 1 when the writer had flushed part of
// them: TestLargeAnswersBesideSmallOnes, 1 in ~30 under load), stops at a
// file's end, and never past max.
func TestConsumeQueueReadAcrossPending(t *testing.T) {
	cq, err := openConsumeQueue(vfs.Default, t.TempDir(), 16)
	require.NoError(t, err)
	defer cq.close()
	add := func(from, to int64) {
		for k := from; k < to; k++ {
			require.NoError(t, cq.add(k, cqEntry{offset: 1000 * k, size: 100, tagHash: k}))
		}
		cq.publish()
	}
	offsets := func(b []byte) (out []int64) {
		for i := 0; i < len(b)/cqEntryLen; i++ {
			out = append(out, getCQEntry(b[i*cqEntryLen:]).offset/1000)
		}
		return out
	}
	add(0, 10)
	require.NoError(t, cq.flush()) // 0–9 in the file
	add(10, 14)                    // 10–13 pending
	b, err := cq.read(8, 5, nil)
	require.NoError(t, err)
	require.Equal(t, []int64{8, 9, 10, 11, 12}, offsets(b))
	b, err = cq.read(8, 100, nil)
	require.NoError(t, err)
	require.Equal(t, []int64{8, 9, 10, 11, 12, 13}, offsets(b), "up to max")

	// Across a file's end (16 entries a file): the read stops there.
	add(14, 20)
	require.NoError(t, cq.flush()) // 0–15 in the first file, 16–19 in the second
	add(20, 22)
	b, err = cq.read(14, 8, nil)
	require.NoError(t, err)
	require.Equal(t, []int64{14, 15}, offsets(b), "the first file ends at 16")
	b, err = cq.read(16, 8, nil)
	require.NoError(t, err)
	require.Equal(t, []int64{16, 17, 18, 19, 20, 21}, offsets(b))
}
