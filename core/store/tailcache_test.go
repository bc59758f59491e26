package store

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// checkTailCache compares every byte the tail cache holds below the
// confirmed end with the segment files in dir, and returns how many it
// compared.
func checkTailCache(t testing.TB, s *Store, dir string) int64 {
	t.Helper()
	n, err := tailCacheDiff(s, dir)
	require.NoError(t, err)
	return n
}

// tailCacheDiff is checkTailCache for any goroutine. Bytes the writer
// evicts while it looks are skipped.
func tailCacheDiff(s *Store, dir string) (int64, error) {
	c := s.cl.cache
	if c == nil {
		return 0, errors.New("no tail cache")
	}
	limit := s.confirmed.Load()
	start := c.start.Load()
	var checked int64
	for _, sg := range s.cl.segmentList() {
		lo, hi := max(sg[0], start), min(sg[1], limit)
		if lo >= hi {
			continue
		}
		mem := make([]byte, hi-lo)
		if !c.readAt(mem, lo) {
			continue // evicted meanwhile
		}
		disk, err := os.ReadFile(filepath.Join(dir, dirCommitLog, segmentName(sg[0])))
		if err != nil {
			return checked, err
		}
		if int64(len(disk)) < hi-sg[0] {
			return checked, fmt.Errorf("segment %s: %d bytes, the log says %d", segmentName(sg[0]), len(disk), hi-sg[0])
		}
		disk = disk[lo-sg[0] : hi-sg[0]]
		if !bytes.Equal(mem, disk) {
			i := 0
			for mem[i] == disk[i] {
				i++
			}
			return checked, fmt.Errorf("tail cache differs from disk in segment %s at log offset %d", segmentName(sg[0]), lo+int64(i))
		}
		checked += hi - lo
	}
	return checked, nil
}

// body is message i's body: its number, then filler of a length that
// varies with i (records of many sizes, some across the cache's blocks and
// its ring's end).
func tailBody(p, i int) []byte {
	b := fmt.Appendf(nil, "p%d-m%d-", p, i)
	n := (i*7919 + p*104729) % 3000
	for j := range n {
		b = append(b, byte('a'+(i+j)%26))
	}
	return b
}

// TestTailCacheMatchesDiskUnderConcurrentAppends: producers append
// records of many sizes over many segment rolls while a checker compares
// the tail cache with the files, and readers read the newest messages;
// afterwards every message reads back right, from the cache or from
// behind it.
func TestTailCacheMatchesDiskUnderConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{SegmentBytes: 64 << 10, MaxMessageBytes: 16 << 10, TailCacheBytes: 256 << 10, DefaultQueues: 2})
	ctx := t.Context()
	const producers, perProducer = 4, 300
	var ids sync.Map // body → ID
	var done atomic.Bool
	var checked atomic.Int64
	var checker sync.WaitGroup
	checker.Go(func() {
		for !done.Load() {
			n, err := tailCacheDiff(s, dir)
			if !assertNoError(t, err) {
				return
			}
			checked.Add(n)
			info, err := s.Topic(ctx, "tc")
			if err != nil {
				continue // not created yet
			}
			for q := range 2 {
				res, err := s.Read(ctx, core.ReadRequest{Topic: "tc", Queue: q, Offset: max(info.Ranges[q].Max-8, 0), MaxCount: 8})
				if !assertNoError(t, err) {
					return
				}
				for _, m := range res.Messages {
					if id, ok := ids.Load(string(m.Body)); ok && id != m.ID {
						t.Errorf("message %q read with ID %s, produced as %s", m.Body, m.ID, id)
					}
				}
			}
		}
	})
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range perProducer {
				b := tailBody(p, i)
				r, err := s.Produce(ctx, &core.Message{Topic: "tc", Body: b})
				if !assertNoError(t, err) {
					return
				}
				ids.Store(string(b), r.ID)
			}
		})
	}
	wg.Wait()
	done.Store(true)
	checker.Wait()
	require.Greater(t, len(s.cl.segmentList()), 20, "the log rolled many times")
	require.Positive(t, checked.Load())
	require.Positive(t, checkTailCache(t, s, dir))

	got := map[string]core.MessageID{}
	for _, m := range countAll(t, s, "tc") {
		got[string(m.Body)] = m.ID
	}
	require.Len(t, got, producers*perProducer)
	ids.Range(func(k, v any) bool {
		require.Equal(t, v, got[k.(string)], "message %q", k)
		m, err := s.Get(ctx, v.(core.MessageID))
		require.NoError(t, err)
		require.Equal(t, k, string(m.Body))
		return true
	})
	st := s.Stats()
	require.Equal(t, int64(256<<10), st.TailCacheBytes)
	require.Positive(t, st.TailCacheHits, "the newest messages came from the cache")
	require.Positive(t, st.ColdReads, "the oldest from behind it")
}

// assertNoError is require.NoError for goroutines other than the test's.
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

// TestTailCacheForgetsSegmentsRetentionDeletes: a message whose segment
// retention deleted is not found, though its bytes were in the cache.
func TestTailCacheForgetsSegmentsRetentionDeletes(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{SegmentBytes: 64 << 10, MaxMessageBytes: 16 << 10, TailCacheBytes: 1 << 20, DefaultQueues: 1,
		MaxDiskBytes: 200 << 10, RetentionInterval: time.Hour})
	ctx := t.Context()
	var first core.SendResult
	for i := range 200 {
		r, err := s.Produce(ctx, &core.Message{Topic: "rt", Body: bytes.Repeat([]byte{byte(i)}, 2000)})
		require.NoError(t, err)
		if i == 0 {
			first = r
		}
	}
	require.Equal(t, int64(0), s.cl.cache.start.Load(), "everything is cached")
	n, err := s.RunRetention()
	require.NoError(t, err)
	require.Positive(t, n)
	logMin, _ := s.cl.bounds()
	require.Equal(t, logMin, s.cl.cache.start.Load(), "the cache starts where the log does")
	_, err = s.Get(ctx, first.ID)
	require.ErrorIs(t, err, core.ErrMessageNotFound)
	res, err := s.Read(ctx, core.ReadRequest{Topic: "rt", Offset: 0, MaxCount: 1})
	require.NoError(t, err)
	require.True(t, res.Clamped)
	require.Len(t, res.Messages, 1)
	require.GreaterOrEqual(t, res.Messages[0].CommitLogOffset, logMin)
	require.Positive(t, checkTailCache(t, s, dir))
}

// TestTailCacheAfterTornTailRecovery: after a crash that tore the last
// record, the cache holds what recovery kept, and the records written in
// its place, not the torn bytes.
func TestTailCacheAfterTornTailRecovery(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentBytes: 64 << 10, MaxMessageBytes: 16 << 10, TailCacheBytes: 128 << 10, DefaultQueues: 1}
	s, err := Open(dir, opts)
	require.NoError(t, err)
	ctx := t.Context()
	for i := range 100 {
		_, err := s.Produce(ctx, &core.Message{Topic: "tt", Body: tailBody(0, i)})
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())
	seg := lastSegmentPath(t, dir)
	fi, err := os.Stat(seg)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(seg, fi.Size()-10)) // the last record loses its end
	markUnclean(t, dir)

	s = openT(t, dir, opts)
	require.Positive(t, checkTailCache(t, s, dir))
	for i := 100; i < 150; i++ {
		_, err := s.Produce(ctx, &core.Message{Topic: "tt", Body: tailBody(0, i)})
		require.NoError(t, err)
	}
	require.Positive(t, checkTailCache(t, s, dir))
	var bodies []string
	for _, m := range countAll(t, s, "tt") {
		bodies = append(bodies, string(m.Body))
	}
	require.Len(t, bodies, 149, "the torn record is gone, the rest and the new ones are there")
	for i, b := range bodies {
		n := i
		if i >= 99 {
			n = i + 1
		}
		require.Equal(t, string(tailBody(0, n)), b)
	}
}

// TestTailCacheFilledAtOpen: a reopened store serves the end of its log
// from the cache at once.
func TestTailCacheFilledAtOpen(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentBytes: 64 << 10, MaxMessageBytes: 16 << 10, TailCacheBytes: 128 << 10, DefaultQueues: 1}
	s, err := Open(dir, opts)
	require.NoError(t, err)
	var last core.SendResult
	for i := range 300 {
		last, err = s.Produce(t.Context(), &core.Message{Topic: "fo", Body: tailBody(1, i)})
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())

	s = openT(t, dir, opts)
	_, end := s.cl.bounds()
	require.Equal(t, end, s.cl.cache.end.Load())
	require.LessOrEqual(t, end-s.cl.cache.start.Load(), int64(128<<10))
	require.Greater(t, end-s.cl.cache.start.Load(), int64(100<<10))
	require.Positive(t, checkTailCache(t, s, dir))
	m, err := s.Get(t.Context(), last.ID)
	require.NoError(t, err)
	require.Equal(t, string(tailBody(1, 299)), string(m.Body))
	require.Equal(t, int64(1), s.Stats().TailCacheHits)
}

// TestNoTailCache: with TailCacheBytes negative every read goes through
// the segments, none is cold, and nothing is budgeted.
func TestNoTailCache(t *testing.T) {
	s := openT(t, "", Options{SegmentBytes: 64 << 10, MaxMessageBytes: 16 << 10, TailCacheBytes: -1, DefaultQueues: 1, ReaderColdReadBytesPerSec: 1})
	for i := range 200 {
		_, err := s.Produce(t.Context(), &core.Message{Topic: "nc", Body: tailBody(2, i)})
		require.NoError(t, err)
	}
	require.Len(t, countAll(t, s, "nc"), 200)
	st := s.Stats()
	require.Zero(t, st.TailCacheBytes)
	require.Zero(t, st.TailCacheHits)
	require.Zero(t, st.ColdReads)
	require.Zero(t, st.ColdReadDelays)
	require.Positive(t, st.TailCacheMisses)
}

// TestTailCacheRing: fill keeps the last whole blocks, wraps around the
// ring's end, and serves records that straddle it.
func TestTailCacheRing(t *testing.T) {
	c, err := newTailCache(64<<10, 0) // blocks of 8 KiB
	require.NoError(t, err)
	t.Cleanup(c.release)
	require.Equal(t, int64(8<<10), c.blockBytes)
	r := rand.New(rand.NewPCG(1, 2))
	var log []byte
	for len(log) < 1<<20 {
		p := make([]byte, r.IntN(20<<10))
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		c.fill(int64(len(log)), p)
		log = append(log, p...)
		end := int64(len(log))
		require.Equal(t, end, c.end.Load())
		start := c.start.Load()
		require.LessOrEqual(t, end-start, c.capacity)
		require.Greater(t, end-start, min(end-1, c.capacity-c.blockBytes), "less than a block beyond the capacity is given up")
		require.Zero(t, start%c.blockBytes)
		for range 20 {
			off := start + r.Int64N(end-start)
			n := int(r.Int64N(end - off))
			got := make([]byte, n)
			require.True(t, c.readAt(got, off))
			require.True(t, bytes.Equal(log[off:off+int64(n)], got), "at %d, %d bytes", off, n)
			hit, err := c.view(off, n, func(b []byte) error {
				require.True(t, bytes.Equal(log[off:off+int64(n)], b))
				return nil
			})
			require.NoError(t, err)
			require.True(t, hit)
		}
		if start > 0 {
			require.False(t, c.readAt(make([]byte, 1), start-1), "evicted bytes are not served")
		}
	}
	c.dropBelow(c.end.Load() - 100)
	require.True(t, c.holds(c.end.Load()-100, 100))
	require.False(t, c.holds(c.end.Load()-101, 1))
}
