package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// copyDir copies a data directory tree.
func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(target)
		if err != nil {
			return err
		}
		defer out.Close()
		_, err = io.Copy(out, in)
		return err
	})
	require.NoError(t, err)
}

func lastSegmentPath(t testing.TB, dir string) string {
	t.Helper()
	names, err := os.ReadDir(filepath.Join(dir, dirCommitLog))
	require.NoError(t, err)
	var segs []string
	for _, n := range names {
		if _, ok := parseOffsetName(n.Name()); ok {
			segs = append(segs, n.Name())
		}
	}
	sort.Strings(segs)
	require.NotEmpty(t, segs)
	return filepath.Join(dir, dirCommitLog, segs[len(segs)-1])
}

// markUnclean leaves the abort marker behind, as a crash would.
func markUnclean(t testing.TB, dir string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, fileAbort), nil, 0o644))
}

// countAll returns the messages of every queue of a topic, in queue order.
func countAll(t testing.TB, s *Store, topic string) []*core.StoredMessage {
	t.Helper()
	info, err := s.Topic(context.Background(), topic)
	require.NoError(t, err)
	var out []*core.StoredMessage
	for q := 0; q < info.Queues; q++ {
		out = append(out, readAll(t, s, topic, q)...)
	}
	return out
}

// TestTornTailEveryOffset cuts the last segment at every byte inside its
// last records, and once zero-fills the tail: each reopen keeps exactly the
// records that are whole, and appends go on.
func TestTornTailEveryOffset(t *testing.T) {
	ctx := t.Context()
	src := t.TempDir()
	opts := Options{DefaultQueues: 2, IndexSlots: 64, IndexEntries: 4096}
	s, err := Open(src, opts)
	require.NoError(t, err)
	var ends []int64 // end offset of each record
	for i := 0; i < 20; i++ {
		r, err := s.Produce(ctx, msg("torn", fmt.Sprintf("k%d", i%3), i))
		require.NoError(t, err)
		m, err := s.Get(ctx, r.ID)
		require.NoError(t, err)
		ends = append(ends, r.CommitLogOffset+int64(m.Size))
	}
	require.NoError(t, s.Close())
	seg := lastSegmentPath(t, src)
	full, err := os.ReadFile(seg)
	require.NoError(t, err)
	require.Equal(t, ends[len(ends)-1], int64(len(full)), "one segment")

	whole := func(cut int64) int {
		n := 0
		for _, e := range ends {
			if e <= cut {
				n++
			}
		}
		return n
	}
	start := ends[len(ends)-4] // inside the last three records
	step := int64(1)
	if testing.Short() {
		step = 7
	}
	for cut := start; cut <= int64(len(full)); cut += step {
		for _, unclean := range []bool{false, true} {
			dir := t.TempDir()
			copyDir(t, src, dir)
			require.NoError(t, os.Truncate(lastSegmentPath(t, dir), cut))
			if unclean {
				markUnclean(t, dir)
			}
			s, err := Open(dir, opts)
			require.NoError(t, err, "cut at %d", cut)
			got := countAll(t, s, "torn")
			require.Len(t, got, whole(cut), "cut at %d", cut)
			r, err := s.Produce(ctx, msg("torn", "k0", 99))
			require.NoError(t, err)
			m, err := s.Get(ctx, r.ID)
			require.NoError(t, err)
			require.Equal(t, "body-99", string(m.Body))
			require.Len(t, countAll(t, s, "torn"), whole(cut)+1)
			require.NoError(t, s.Close())
		}
	}

	// A tail of zeros (a file extended but never written) is cut too.
	dir := t.TempDir()
	copyDir(t, src, dir)
	f, err := os.OpenFile(lastSegmentPath(t, dir), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write(make([]byte, 4096))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	markUnclean(t, dir)
	s = openT(t, dir, opts)
	require.Len(t, countAll(t, s, "torn"), 20)
	_, logEnd := s.cl.bounds()
	require.Equal(t, ends[len(ends)-1], logEnd, "zero tail cut")
	_, err = s.Produce(ctx, msg("torn", "k0", 100))
	require.NoError(t, err)
	require.Len(t, countAll(t, s, "torn"), 21)
}

// TestBitFlipInSealedSegment damages one record in an old segment: reading
// it reports corruption (never the bad data), every other record is still
// served, before and after a reopen, and after a full rebuild of the consume
// queues from the log.
func TestBitFlipInSealedSegment(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	opts := Options{DefaultQueues: 1, SegmentBytes: 4096, MaxMessageBytes: 1024, IndexSlots: 64, IndexEntries: 4096}
	s, err := Open(dir, opts)
	require.NoError(t, err)
	var sent []core.SendResult
	for i := 0; i < 100; i++ {
		r, err := s.Produce(ctx, msg("flip", "", i))
		require.NoError(t, err)
		sent = append(sent, r)
	}
	require.NoError(t, s.Close())
	victim := sent[5] // in the first, sealed segment
	segs, err := os.ReadDir(filepath.Join(dir, dirCommitLog))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(segs), 3)

	for _, field := range []struct {
		name string
		at   int64
	}{{"body", 100}, {"length", offLength + 1}, {"magic", 0}} {
		t.Run(field.name, func(t *testing.T) {
			d := t.TempDir()
			copyDir(t, dir, d)
			path := filepath.Join(d, dirCommitLog, segmentName(0))
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			b[victim.CommitLogOffset+field.at] ^= 0x10
			require.NoError(t, os.WriteFile(path, b, 0o644))

			check := func(s *Store) {
				_, err := s.Get(ctx, victim.ID)
				require.ErrorIs(t, err, core.ErrCorrupt)
				res, err := s.Read(ctx, core.ReadRequest{Topic: "flip", Offset: 0, MaxCount: 100})
				require.NoError(t, err)
				require.Len(t, res.Messages, 5, "messages before the damage are served")
				require.Equal(t, int64(5), res.NextOffset)
				_, err = s.Read(ctx, core.ReadRequest{Topic: "flip", Offset: 5})
				var ce *core.CorruptError
				require.ErrorAs(t, err, &ce)
				require.Equal(t, int64(5), ce.QueueOffset)
				require.ErrorIs(t, err, core.ErrCorrupt)
				rest := 0
				off := int64(6)
				for {
					res, err := s.Read(ctx, core.ReadRequest{Topic: "flip", Offset: off, MaxCount: 100})
					require.NoError(t, err)
					rest += len(res.Messages)
					if res.NextOffset == off {
						break
					}
					off = res.NextOffset
				}
				require.Equal(t, 94, rest, "records after the damage are not lost")
				for i, r := range sent {
					if i == 5 {
						continue
					}
					m, err := s.Get(ctx, r.ID)
					require.NoError(t, err)
					require.Equal(t, fmt.Sprintf("body-%d", i), string(m.Body))
				}
			}
			s := openT(t, d, opts)
			check(s)
			require.NoError(t, s.Close())

			// Throw away the derived data: recovery rebuilds it from the log,
			// skipping the damaged record and keeping those after it.
			require.NoError(t, os.RemoveAll(filepath.Join(d, "consumequeue")))
			require.NoError(t, os.RemoveAll(filepath.Join(d, dirIndex)))
			require.NoError(t, os.Remove(filepath.Join(d, fileCheckpoint)))
			markUnclean(t, d)
			check(openT(t, d, opts))
		})
	}
}

// TestCorruptTailMiddleOfLastSegment: damage in the active segment followed
// by valid records is corruption, not a torn tail; the records after it stay.
func TestCorruptInActiveSegmentKeepsLaterRecords(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	opts := Options{DefaultQueues: 1}
	s, err := Open(dir, opts)
	require.NoError(t, err)
	var sent []core.SendResult
	for i := 0; i < 10; i++ {
		r, err := s.Produce(ctx, msg("mid", "", i))
		require.NoError(t, err)
		sent = append(sent, r)
	}
	require.NoError(t, s.Close())
	path := lastSegmentPath(t, dir)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[sent[3].CommitLogOffset+offLength] = 0x7F // length 0x7F...: rejected without allocating
	require.NoError(t, os.WriteFile(path, b, 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, fileCheckpoint)))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "consumequeue")))
	markUnclean(t, dir)

	s = openT(t, dir, opts)
	_, logEnd := s.cl.bounds()
	require.Equal(t, int64(len(b)), logEnd, "nothing cut")
	for i, r := range sent {
		_, err := s.Get(ctx, r.ID)
		if i == 3 {
			require.ErrorIs(t, err, core.ErrCorrupt)
			continue
		}
		require.NoError(t, err, "record %d", i)
	}
}

// TestPowerLoss uses CrashFS, which keeps only synced bytes, to show the
// flush policies' contracts: sync loses nothing acknowledged; async loses at
// most what the last flush had not covered. (A real machine cannot be made
// to lose power here, so this layer stands in for the disk.)
func TestPowerLoss(t *testing.T) {
	for _, policy := range []FlushPolicy{FlushSync, FlushAsync} {
		t.Run(string(policy), func(t *testing.T) {
			for round := 0; round < 5; round++ {
				powerLossRound(t, policy, round)
			}
		})
	}
}

func powerLossRound(t *testing.T, policy FlushPolicy, round int) {
	ctx := t.Context()
	fsys := vfs.NewCrashFS()
	opts := Options{FS: fsys, FlushPolicy: policy, DefaultQueues: 4, SegmentBytes: 16 << 10, MaxMessageBytes: 4096,
		FlushInterval: 5e6, CheckpointInterval: 3e6, IndexSlots: 64, IndexEntries: 4096}
	s, err := Open("/data", opts)
	require.NoError(t, err)

	var mu sync.Mutex
	var acked []core.SendResult
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 8; g++ {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := s.Produce(ctx, msg("p", fmt.Sprintf("k%d", g), i))
				if err != nil {
					return
				}
				mu.Lock()
				acked = append(acked, r)
				mu.Unlock()
			}
		})
	}
	// Let a few hundred messages through, then lose power.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= 300+100*round
	}, 10*time.Second, 100*time.Microsecond)
	mu.Lock()
	before := append([]core.SendResult(nil), acked...)
	mu.Unlock()
	synced := s.synced.Load()
	crashed := fsys.CrashClone()
	close(stop)
	wg.Wait()
	require.NoError(t, s.Close())

	s2, err := Open("/data", Options{FS: crashed, FlushPolicy: policy, DefaultQueues: 4, SegmentBytes: 16 << 10,
		MaxMessageBytes: 4096, IndexSlots: 64, IndexEntries: 4096})
	require.NoError(t, err)
	defer s2.Close()
	lost := 0
	for _, r := range before {
		_, err := s2.Get(ctx, r.ID)
		if err == nil {
			continue
		}
		require.ErrorIs(t, err, core.ErrMessageNotFound)
		lost++
		if policy == FlushSync {
			t.Fatalf("sync mode lost acknowledged message %s at %d", r.ID, r.CommitLogOffset)
		}
		require.GreaterOrEqual(t, r.CommitLogOffset, synced, "async lost a message the last flush covered")
	}
	// Whatever survived is consistent: dense queues, readable records.
	for q := 0; q < 4; q++ {
		msgs := readAll(t, s2, "p", q)
		for k, m := range msgs {
			require.Equal(t, int64(k), m.QueueOffset)
		}
	}
	t.Logf("%s round %d: %d acked before power loss, %d lost", policy, round, len(before), lost)
}

// TestWriteErrorsAreSticky injects write and fsync failures (including a
// torn write and a full disk) below the store.
func TestWriteErrorsAreSticky(t *testing.T) {
	cases := []struct {
		name   string
		policy FlushPolicy
		inject vfs.InjectFunc
	}{
		{"torn write", FlushAsync, func(op vfs.Op, path string, n int) (int, error) {
			if op == vfs.OpWrite && filepath.Base(filepath.Dir(path)) == dirCommitLog {
				return n / 2, vfs.ErrInjected
			}
			return n, nil
		}},
		{"disk full", FlushSync, func(op vfs.Op, path string, n int) (int, error) {
			if op == vfs.OpWrite && filepath.Base(filepath.Dir(path)) == dirCommitLog {
				return 0, syscall.ENOSPC
			}
			return n, nil
		}},
		{"fsync fails", FlushSync, func(op vfs.Op, path string, n int) (int, error) {
			if op == vfs.OpSync && filepath.Base(filepath.Dir(path)) == dirCommitLog {
				return 0, syscall.EIO
			}
			return n, nil
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			fsys := vfs.NewCrashFS()
			opts := Options{FS: fsys, FlushPolicy: c.policy, DefaultQueues: 1}
			s, err := Open("/data", opts)
			require.NoError(t, err)
			var good []core.SendResult
			for i := 0; i < 10; i++ {
				r, err := s.Produce(ctx, msg("w", "", i))
				require.NoError(t, err)
				good = append(good, r)
			}
			_, logEnd := s.cl.bounds()
			require.NoError(t, s.Failure())

			fsys.SetInject(c.inject)
			_, err = s.Produce(ctx, msg("w", "", 10))
			require.ErrorIs(t, err, core.ErrStoreFailed)
			require.ErrorIs(t, s.Failure(), core.ErrStoreFailed, "Failure tells why writes are refused")
			fsys.SetInject(nil)
			// Sticky: the store refuses writes even though the fault is gone.
			_, err = s.Produce(ctx, msg("w", "", 11))
			require.ErrorIs(t, err, core.ErrStoreFailed)
			// What was acknowledged is still served.
			for _, r := range good {
				_, err := s.Get(ctx, r.ID)
				require.NoError(t, err)
			}
			require.Len(t, readAll(t, s, "w", 0), 10, "the failed message is not visible")
			if c.policy == FlushAsync {
				// No half record stays in the file.
				size, err := fsys.Stat(lastSegmentPathFS(t, fsys))
				require.NoError(t, err)
				require.Equal(t, logEnd, size.Size())
			}
			_ = s.Close()

			s = openT(t, "/data", Options{FS: fsys, FlushPolicy: c.policy, DefaultQueues: 1})
			for _, r := range good {
				_, err := s.Get(ctx, r.ID)
				require.NoError(t, err)
			}
			n := len(readAll(t, s, "w", 0))
			require.GreaterOrEqual(t, n, 10)
			require.LessOrEqual(t, n, 11, "at most the unacknowledged message survives")
			_, err = s.Produce(ctx, msg("w", "", 12))
			require.NoError(t, err, "a reopened store writes again")
		})
	}
}

func lastSegmentPathFS(t testing.TB, fsys vfs.FS) string {
	names, err := fsys.ReadDir("/data/" + dirCommitLog)
	require.NoError(t, err)
	require.NotEmpty(t, names)
	return "/data/" + dirCommitLog + "/" + names[len(names)-1]
}

var _ = errors.Is

// TestMappedReadFaultIsAnError cuts a segment file under a running store (as
// a failing disk or a careless operator would): reading the vanished bytes
// through the mapping raises SIGBUS, which must come back as an error, not
// kill the process. (Without the tail cache, which would serve the bytes
// from memory.)
func TestMappedReadFaultIsAnError(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	s := openT(t, dir, Options{DefaultQueues: 1, TailCacheBytes: -1})
	r, err := s.Produce(ctx, &core.Message{Topic: "f", Body: make([]byte, 8192)})
	require.NoError(t, err)
	_, err = s.Get(ctx, r.ID)
	require.NoError(t, err)
	require.NotNil(t, s.cl.segs[0].mem, "the segment is mapped")
	require.NoError(t, os.Truncate(lastSegmentPath(t, dir), 0))
	_, err = s.Get(ctx, r.ID)
	require.Error(t, err)
	require.ErrorContains(t, err, "fault")
	_, err = s.Read(ctx, core.ReadRequest{Topic: "f"})
	require.ErrorIs(t, err, core.ErrCorrupt)
}
