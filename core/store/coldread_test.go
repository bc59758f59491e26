package store

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// adviseFS is the OS filesystem with every piece of advice the store gives
// recorded (and passed on).
type adviseFS struct {
	vfs.FS
	mu    sync.Mutex
	calls []adviceCall
}

type adviceCall struct {
	name      string
	off, size int64
	advice    vfs.Advice
}

type adviseFile struct {
	vfs.File
	fs *adviseFS
}

func (a *adviseFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := a.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return adviseFile{f, a}, nil
}

func (f adviseFile) MapRead(size int64) ([]byte, error) { return f.File.(vfs.Mapper).MapRead(size) }

func (f adviseFile) Advise(off, n int64, advice vfs.Advice) error {
	f.fs.mu.Lock()
	f.fs.calls = append(f.fs.calls, adviceCall{filepath.Base(f.Name()), off, n, advice})
	f.fs.mu.Unlock()
	return f.File.(vfs.Advisor).Advise(off, n, advice)
}

func (a *adviseFS) taken() []adviceCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]adviceCall(nil), a.calls...)
}

// readQueue reads queue 0 of topic from offset 0 to its end as reader, in
// Reads of 32, and returns the lowest log offset each Read returned.
func readQueue(t *testing.T, s *Store, topic, reader string) (firsts []int64, n int) {
	t.Helper()
	off := int64(0)
	for {
		res, err := s.Read(t.Context(), core.ReadRequest{Topic: topic, Offset: off, MaxCount: 32, Reader: reader})
		require.NoError(t, err)
		if len(res.Messages) == 0 {
			return firsts, n
		}
		firsts = append(firsts, res.Messages[0].CommitLogOffset)
		n += len(res.Messages)
		off = res.NextOffset
	}
}

// TestColdReadsAdviseTheRightRanges: reads from behind the tail cache tell
// the kernel each segment they read is read sequentially and used once,
// and drop the pages the reader passed more than the lag ago — never pages
// at or above the cache's start, never the active segment's end.
func TestColdReadsAdviseTheRightRanges(t *testing.T) {
	fsys := &adviseFS{FS: vfs.Default}
	s := openT(t, "", Options{FS: fsys, SegmentBytes: 256 << 10, MaxMessageBytes: 16 << 10, TailCacheBytes: 64 << 10, DefaultQueues: 1})
	s.cl.dropLag, s.cl.dropAlign = 64<<10, 4096 // segments of 256 KiB: finer than folios
	ctx := t.Context()
	body := make([]byte, 1000)
	var size int
	for range 1200 { // about 1.3 MiB: five segments and a bit
		r, err := s.Produce(ctx, &core.Message{Topic: "adv", Body: body})
		require.NoError(t, err)
		size = r.ID.Size()
	}
	require.Empty(t, fsys.taken(), "writes give no advice")
	cacheStart := s.cl.cache.start.Load()
	firsts, n := readQueue(t, s, "adv", "replay")
	require.Equal(t, 1200, n)
	st := s.Stats()
	require.Positive(t, st.ColdReads)
	require.Equal(t, st.ColdReadBytes, st.ColdReads*int64(size))

	segs := s.cl.segmentList()
	base := map[string]int64{}
	for _, sg := range segs {
		base[segmentName(sg[0])] = sg[0]
	}
	hinted := map[string]map[vfs.Advice]int{}
	var dropped [][2]int64
	for _, c := range fsys.taken() {
		b, ok := base[c.name]
		require.True(t, ok, "advice on %s, not a segment", c.name)
		switch c.advice {
		case vfs.AdviseSequential, vfs.AdviseNoReuse:
			require.Zero(t, c.off)
			require.Zero(t, c.size)
			if hinted[c.name] == nil {
				hinted[c.name] = map[vfs.Advice]int{}
			}
			hinted[c.name][c.advice]++
		case vfs.AdviseDontNeed:
			lo, hi := b+c.off, b+c.off+c.size
			require.LessOrEqual(t, hi, cacheStart-s.cl.dropLag, "dropped [%d, %d): within the lag of the cache", lo, hi)
			dropped = append(dropped, [2]int64{lo, hi})
		default:
			t.Fatalf("advice %d", c.advice)
		}
	}
	for _, sg := range segs {
		name := segmentName(sg[0])
		if sg[0] < cacheStart {
			require.Equal(t, map[vfs.Advice]int{vfs.AdviseSequential: 1, vfs.AdviseNoReuse: 1}, hinted[name], "segment %s, read cold: hinted once", name)
		} else {
			require.Nil(t, hinted[name], "segment %s, all in the cache: no hints", name)
		}
	}
	// What the reader passed more than the lag (and a window) ago is
	// dropped: the union of the ranges covers the log up to there.
	lastCold := int64(0)
	for _, f := range firsts {
		if f < cacheStart {
			lastCold = f
		}
	}
	covered := int64(0)
	for {
		grown := false
		for _, d := range dropped {
			if d[0] <= covered && d[1] > covered {
				covered, grown = d[1], true
			}
		}
		if !grown {
			break
		}
	}
	require.GreaterOrEqual(t, covered, lastCold-s.cl.dropLag-(64<<10), "dropped up to the lag behind the last cold read")
}

// residentPages maps the file read-only and counts its pages in the page
// cache (mincore).
func residentPages(t *testing.T, path string) (resident, total int) {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return residentRange(t, path, fi.Size())
}

// residentRange is residentPages for the first n bytes of the file.
func residentRange(t *testing.T, path string, n int64) (resident, total int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, int(n), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	page := os.Getpagesize()
	vec := make([]byte, (len(mem)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		require.NoError(t, errno, "mincore")
	}
	for _, v := range vec {
		if v&1 != 0 {
			resident++
		}
	}
	return resident, len(vec)
}

// TestColdReadLeavesTheTailInThePageCache, on the real filesystem: reading
// the whole log from the start drops what it read from the page cache
// (mincore), and leaves the pages of the tail segment where they were.
func TestColdReadLeavesTheTailInThePageCache(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{FlushPolicy: FlushSync, SegmentBytes: 1 << 20, MaxMessageBytes: 16 << 10, TailCacheBytes: 256 << 10, DefaultQueues: 1})
	s.cl.dropLag = 128 << 10
	ctx := t.Context()
	body := make([]byte, 4000)
	msgs := make([]*core.Message, 32)
	for i := range msgs {
		msgs[i] = &core.Message{Topic: "mc", Body: body}
	}
	for range 26 { // about 3.2 MiB, fsynced: clean pages
		_, err := s.ProduceBatch(ctx, msgs)
		require.NoError(t, err)
	}
	segs := s.cl.segmentList()
	require.Len(t, segs, 4)
	path := func(i int) string { return filepath.Join(dir, dirCommitLog, segmentName(segs[i][0])) }
	res0, total0 := residentPages(t, path(0))
	resTail, totalTail := residentPages(t, path(3))
	// Just written: resident, unless memory is short right now (then
	// this test proves nothing, and says so).
	require.Greater(t, res0, total0*9/10, "the first segment's pages are in the page cache after writing it")
	require.Greater(t, resTail, totalTail*9/10, "the tail's pages are in the page cache after writing them")

	_, n := readQueue(t, s, "mc", "replay")
	require.Equal(t, 26*32, n)
	require.Positive(t, s.Stats().ColdReads)

	res0After, _ := residentPages(t, path(0))
	res1After, total1 := residentPages(t, path(1))
	resTailAfter, _ := residentPages(t, path(3))
	require.LessOrEqual(t, res0After, 1, "the first segment, read cold and passed: dropped (%d of %d pages left)", res0After, total0)
	require.LessOrEqual(t, res1After, 1, "the second one too (%d of %d pages left)", res1After, total1)
	require.GreaterOrEqual(t, resTailAfter, resTail, "the tail's pages stay")
}

// TestColdReadsDropOnEveryPass: a segment read from its start again and
// again (a group replaying a backlog, then another) is dropped behind the
// reader each time — also what the second pass read back from the disk,
// which the page cache holds in large folios that a drop range must hold
// whole.
func TestColdReadsDropOnEveryPass(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{SegmentBytes: 64 << 20, TailCacheBytes: 4 << 20, DefaultQueues: 1, ReaderColdReadBytesPerSec: -1})
	body := make([]byte, 1024)
	msgs := make([]*core.Message, 256)
	for i := range msgs {
		msgs[i] = &core.Message{Topic: "passes", Body: body}
	}
	for range 160 { // about 45 MiB in one segment
		_, err := s.ProduceBatch(t.Context(), msgs)
		require.NoError(t, err)
	}
	require.NoError(t, s.fsync()) // clean pages: DONTNEED may drop them
	path := filepath.Join(dir, dirCommitLog, segmentName(0))
	for pass := range 3 {
		_, n := readQueue(t, s, "passes", fmt.Sprintf("pass-%d", pass))
		require.Equal(t, 160*256, n)
		res, total := residentRange(t, path, 16<<20)
		require.Less(t, res, total/20, "pass %d: %d of the first %d pages still cached", pass, res, total)
	}
}

// TestColdReadWaitsForItsReadersBudget: once a reader spent its budget its
// next cold read waits — until its ctx ends, here — while a read at the
// tail and another reader's cold read go at once (with a ctx that is
// already cancelled: they do not wait at all).
func TestColdReadWaitsForItsReadersBudget(t *testing.T) {
	s := openT(t, "", Options{SegmentBytes: 256 << 10, MaxMessageBytes: 16 << 10, TailCacheBytes: 64 << 10, DefaultQueues: 1,
		ReaderColdReadBytesPerSec: 1}) // a bucket of 256 KiB, refilled at a byte a second
	body := make([]byte, 4000)
	for range 200 { // about 800 KiB
		_, err := s.Produce(t.Context(), &core.Message{Topic: "bud", Body: body})
		require.NoError(t, err)
	}
	info, err := s.Topic(t.Context(), "bud")
	require.NoError(t, err)
	end := info.Ranges[0].Max

	off, read := int64(0), 0
	var waitErr error
	for waitErr == nil {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		var res core.ReadResult
		res, waitErr = s.Read(ctx, core.ReadRequest{Topic: "bud", Offset: off, MaxCount: 8, Reader: "backlog"})
		cancel()
		read += len(res.Messages)
		off = res.NextOffset
		require.Less(t, off, end-10, "the budget ran out before the tail")
	}
	require.ErrorIs(t, waitErr, context.DeadlineExceeded)
	require.LessOrEqual(t, read*len(body), 256<<10, "no more than the bucket held")
	st := s.Stats()
	require.Equal(t, int64(1), st.ColdReadDelays)
	require.Positive(t, st.ColdReadDelay)

	done, cancel := context.WithCancel(t.Context())
	cancel()
	res, err := s.Read(done, core.ReadRequest{Topic: "bud", Offset: end - 3, Reader: "backlog"})
	require.NoError(t, err, "a read at the tail is never charged")
	require.Len(t, res.Messages, 3)
	res, err = s.Read(done, core.ReadRequest{Topic: "bud", Offset: 0, MaxCount: 8, Reader: "other"})
	require.NoError(t, err, "another reader has a budget of its own")
	require.Len(t, res.Messages, 8)
	require.Equal(t, int64(1), s.Stats().ColdReadDelays)
}

// TestColdReadsShareTheStoreWideBudget: with a bound for all readers
// together, one reader's cold reads can spend it for the others.
func TestColdReadsShareTheStoreWideBudget(t *testing.T) {
	s := openT(t, "", Options{SegmentBytes: 256 << 10, MaxMessageBytes: 16 << 10, TailCacheBytes: 64 << 10, DefaultQueues: 1,
		ReaderColdReadBytesPerSec: -1, ColdReadBytesPerSec: 1})
	body := make([]byte, 4000)
	for range 200 {
		_, err := s.Produce(t.Context(), &core.Message{Topic: "all", Body: body})
		require.NoError(t, err)
	}
	off := int64(0)
	for range 64 { // 256 KiB: the whole bucket
		res, err := s.Read(t.Context(), core.ReadRequest{Topic: "all", Offset: off, MaxCount: 1, Reader: "a"})
		require.NoError(t, err)
		off = res.NextOffset
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := s.Read(ctx, core.ReadRequest{Topic: "all", Offset: 0, MaxCount: 8, Reader: "b"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestColdReadBudgetDelays: a reader that reads more than its bucket holds
// is slowed to its rate, and comes through.
func TestColdReadBudgetDelays(t *testing.T) {
	s := openT(t, "", Options{SegmentBytes: 256 << 10, MaxMessageBytes: 16 << 10, TailCacheBytes: 64 << 10, DefaultQueues: 1,
		ReaderColdReadBytesPerSec: 2 << 20}) // a bucket of 256 KiB
	body := make([]byte, 4000)
	for range 200 {
		_, err := s.Produce(t.Context(), &core.Message{Topic: "slow", Body: body})
		require.NoError(t, err)
	}
	start := time.Now()
	_, n := readQueue(t, s, "slow", "r")
	elapsed := time.Since(start)
	require.Equal(t, 200, n)
	st := s.Stats()
	require.Greater(t, st.ColdReadBytes, int64(512<<10))
	require.Positive(t, st.ColdReadDelays)
	require.Positive(t, st.ColdReadDelay)
	// Reading more than the bucket at 2 MiB/s takes at least the rest's
	// worth of time, whatever the machine: a slower one spends more of it
	// reading and less waiting (the bucket fills meanwhile), so the bound
	// is on the whole read, not on the waits.
	minTime := time.Duration(float64(st.ColdReadBytes-(256<<10)) / float64(2<<20) * float64(time.Second))
	require.GreaterOrEqual(t, elapsed, minTime*9/10)
}

// TestColdReadOfACutSegmentIsAnError: bytes cut from under a segment
// (a failing disk, a careless operator) make a cold read fail with a
// corruption error, as a read through the mapping does.
func TestColdReadOfACutSegmentIsAnError(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{SegmentBytes: 64 << 10, MaxMessageBytes: 16 << 10, TailCacheBytes: 64 << 10, DefaultQueues: 1})
	for range 100 {
		_, err := s.Produce(t.Context(), &core.Message{Topic: "cut", Body: make([]byte, 2000)})
		require.NoError(t, err)
	}
	require.Positive(t, s.cl.cache.start.Load())
	require.NoError(t, os.Truncate(filepath.Join(dir, dirCommitLog, segmentName(0)), 100))
	_, err := s.Read(t.Context(), core.ReadRequest{Topic: "cut", Offset: 1})
	require.ErrorIs(t, err, core.ErrCorrupt)
}

// TestColdReadMaxBytes: a Read from behind the tail cache returns at most
// ColdReadMaxBytes (one record always, however large), a Read at the tail
// its whole MaxBytes; a negative ColdReadMaxBytes leaves only MaxBytes.
func TestColdReadMaxBytes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		coldMax int
		want    int // messages of a cold Read with MaxCount 64
	}{
		{"capped", 20 << 10, 5}, // 5 records of 4,000-odd bytes fit in 20 KiB, not 6
		{"one record always", 100, 1},
		{"off", -1, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openT(t, "", Options{SegmentBytes: 1 << 20, MaxMessageBytes: 16 << 10, TailCacheBytes: 64 << 10, DefaultQueues: 1,
				ColdReadMaxBytes: tc.coldMax})
			body := make([]byte, 4000)
			for range 200 { // about 800 KiB: the first 180 or so are behind the cache
				_, err := s.Produce(t.Context(), &core.Message{Topic: "cap", Body: body})
				require.NoError(t, err)
			}
			res, err := s.Read(t.Context(), core.ReadRequest{Topic: "cap", Offset: 0, MaxCount: 64})
			require.NoError(t, err)
			require.Len(t, res.Messages, tc.want)
			require.Equal(t, int64(tc.want), res.NextOffset, "the next Read goes on where this one stopped")
			res, err = s.Read(t.Context(), core.ReadRequest{Topic: "cap", Offset: 190, MaxCount: 64})
			require.NoError(t, err)
			require.Len(t, res.Messages, 10, "the tail is not capped")
		})
	}
}

// TestColdReadsDirect, on the real filesystem: large records behind the
// tail cache are read around the page cache (O_DIRECT) — the bytes are
// right, at any alignment — and so are dense runs of small ones, while
// small records interleaved with other queues' go through the page cache.
// Where the filesystem refuses O_DIRECT the same reads go through the page
// cache, and the test checks that instead.
func TestColdReadsDirect(t *testing.T) {
	dir := t.TempDir()
	direct := true
	probe := filepath.Join(dir, "probe")
	require.NoError(t, os.WriteFile(probe, []byte("x"), 0o644))
	if f, err := vfs.Default.(vfs.DirectOpener).OpenDirect(probe); err != nil {
		direct = false
		t.Logf("the filesystem refuses O_DIRECT (%v): checking the buffered fallback", err)
	} else {
		require.NoError(t, f.Close())
	}
	s := openT(t, dir, Options{SegmentBytes: 8 << 20, TailCacheBytes: 256 << 10, DefaultQueues: 4, ReaderColdReadBytesPerSec: -1})
	ctx := t.Context()
	fill := func(topic string, queues, n, size int) map[int][][]byte {
		sent := map[int][][]byte{}
		for i := range n {
			body := make([]byte, size+i%7) // sizes that move the records off any alignment
			for j := range body {
				body[j] = byte(i*31 + j)
			}
			res, err := s.Produce(ctx, &core.Message{Topic: topic, ShardingKey: fmt.Sprint(i % queues), Body: body})
			require.NoError(t, err)
			sent[res.Queue] = append(sent[res.Queue], body)
		}
		return sent
	}
	readAll := func(topic string, sent map[int][][]byte) {
		for q, bodies := range sent {
			var got [][]byte
			for off := int64(0); ; {
				res, err := s.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 64, Reader: topic})
				require.NoError(t, err)
				if len(res.Messages) == 0 {
					break
				}
				for _, m := range res.Messages {
					got = append(got, m.Body)
				}
				off = res.NextOffset
			}
			require.Equal(t, len(bodies), len(got), "queue %d", q)
			for i := range bodies {
				require.True(t, bytes.Equal(bodies[i], got[i]), "queue %d message %d", q, i)
			}
		}
	}
	// Small records of 4 queues, side by side in the log: sparse for each
	// queue's reader, read through the page cache.
	sent := fill("small", 4, 4000, 900)
	for range 8 { // push them all behind the tail cache
		fill("filler", 1, 64, 4000)
	}
	before := s.Stats()
	readAll("small", sent)
	st := s.Stats()
	require.Greater(t, st.ColdReadBytes-before.ColdReadBytes, int64(3<<20), "read cold")
	require.Zero(t, st.ColdReadDirectBytes-before.ColdReadDirectBytes, "sparse small records go through the page cache")

	// Large records of 2 queues, and small ones of 1 queue (dense).
	large := fill("large", 2, 200, 20<<10)
	dense := fill("dense", 1, 2000, 900)
	for range 8 {
		fill("filler", 1, 64, 4000)
	}
	for _, c := range []struct {
		topic string
		sent  map[int][][]byte
	}{{"large", large}, {"dense", dense}} {
		before := s.Stats()
		readAll(c.topic, c.sent)
		st := s.Stats()
		cold, dir := st.ColdReadBytes-before.ColdReadBytes, st.ColdReadDirectBytes-before.ColdReadDirectBytes
		require.Greater(t, cold, int64(1<<20), "%s: read cold", c.topic)
		if direct {
			require.GreaterOrEqual(t, dir, cold*9/10, "%s: read around the page cache", c.topic)
		} else {
			require.Zero(t, dir, "%s: no O_DIRECT here", c.topic)
		}
	}
}

// TestColdReadBuffersReusedOnlyAfterRelease: a cold Read's run buffers go
// back to the pool only through its ReadResult.Release. A Read whose
// result is kept (not released) keeps its bodies while many later Reads
// release theirs and reuse the buffers; and the later Reads, read into
// reused buffers, return the bytes produced.
func TestColdReadBuffersReusedOnlyAfterRelease(t *testing.T) {
	s := openT(t, t.TempDir(), Options{SegmentBytes: 8 << 20, TailCacheBytes: 256 << 10, DefaultQueues: 1, ReaderColdReadBytesPerSec: -1})
	ctx := t.Context()
	body := func(i int) []byte {
		b := make([]byte, 900+i%7)
		for j := range b {
			b[j] = byte(i*31 + j)
		}
		return b
	}
	const n = 3000
	for i := range n {
		_, err := s.Produce(ctx, &core.Message{Topic: "t", Body: body(i)})
		require.NoError(t, err)
	}
	read := func(off int64) core.ReadResult {
		res, err := s.Read(ctx, core.ReadRequest{Topic: "t", Queue: 0, Offset: off, MaxCount: 64, Reader: "r"})
		require.NoError(t, err)
		require.NotEmpty(t, res.Messages)
		for k, m := range res.Messages {
			require.True(t, bytes.Equal(body(int(off)+k), m.Body), "message %d", int(off)+k)
		}
		return res
	}
	kept := read(0)
	require.NotNil(t, kept.Release, "a cold Read of small records side by side takes pooled buffers")
	taken, made := coldBufsTaken.Load(), coldBufsMade.Load()
	cold := 0
	for off := int64(64); off < n-64; off += 64 {
		res := read(off)
		if res.Release == nil {
			continue // from the tail cache: nothing pooled
		}
		cold++
		res.Release()
		res.Release() // a second call changes nothing
	}
	require.Greater(t, cold, 20)
	require.Greater(t, (coldBufsTaken.Load()-taken)-(coldBufsMade.Load()-made), int64(0), "no buffer was reused")
	for k, m := range kept.Messages {
		require.True(t, bytes.Equal(body(k), m.Body), "message %d of the kept Read changed", k)
	}
}
