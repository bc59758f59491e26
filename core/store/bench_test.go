package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/brokertest"
)

// Benchmarks of the hot paths. They write real files with real fsync in a
// temp dir (set TMPDIR to put them on another disk). Numbers and the command
// lines behind docs/BENCHMARKS.md come from here.

func benchStore(b *testing.B, opts Options) *Store {
	b.Helper()
	if opts.IndexSlots == 0 {
		opts.IndexSlots, opts.IndexEntries = 1<<16, 1<<20
	}
	s, err := Open(b.TempDir(), opts)
	require.NoError(b, err)
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// produceParallel runs b.N produces of size-byte bodies over producers
// goroutines, batch messages per call, and reports msgs/s and msgs/fsync.
func produceParallel(b *testing.B, s *Store, producers, size, batch int) {
	body := make([]byte, size)
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	before := s.Stats()
	b.ResetTimer()
	var wg sync.WaitGroup
	per := (b.N + producers - 1) / producers
	for p := 0; p < producers; p++ {
		wg.Go(func() {
			msgs := make([]*core.Message, batch)
			for i := range msgs {
				msgs[i] = &core.Message{Topic: "bench", ShardingKey: fmt.Sprintf("dev-%d-%d", p, i), Body: body}
			}
			for i := 0; i < per; i += batch {
				n := min(batch, per-i)
				if _, err := s.ProduceBatch(ctx, msgs[:n]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	after := s.Stats()
	el := b.Elapsed().Seconds()
	b.ReportMetric(float64(producers*per)/el, "msgs/s")
	if f := after.Fsyncs - before.Fsyncs; f > 0 {
		b.ReportMetric(float64(after.Messages-before.Messages)/float64(f), "msgs/fsync")
	}
	if c := after.WriteCycles - before.WriteCycles; c > 0 {
		b.ReportMetric(float64(after.Messages-before.Messages)/float64(c), "msgs/write")
	}
}

func BenchmarkProduce(b *testing.B) {
	cases := []struct {
		name      string
		policy    FlushPolicy
		producers int
		size      int
		batch     int
	}{
		{"async/producers=1/batch=64/size=1KiB", FlushAsync, 1, 1024, 64},
		{"async/producers=4/batch=64/size=1KiB", FlushAsync, 4, 1024, 64},
		{"async/producers=16/size=100B", FlushAsync, 16, 100, 1},
		{"async/producers=16/batch=16/size=100B", FlushAsync, 16, 100, 16},
		{"async/producers=16/size=1KiB", FlushAsync, 16, 1024, 1},
		{"sync/producers=1/size=1KiB", FlushSync, 1, 1024, 1},
		{"sync/producers=64/size=1KiB", FlushSync, 64, 1024, 1},
		{"sync/producers=256/size=1KiB", FlushSync, 256, 1024, 1},
		{"async/producers=1/size=4MiB", FlushAsync, 1, 4 << 20, 1},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s := benchStore(b, Options{FlushPolicy: c.policy})
			produceParallel(b, s, c.producers, c.size, c.batch)
		})
	}
}

// fillQueue writes n messages of size bytes to a one-queue topic.
func fillQueue(b *testing.B, s *Store, n, size int) []core.SendResult {
	b.Helper()
	body := make([]byte, size)
	msgs := make([]*core.Message, 256)
	for i := range msgs {
		msgs[i] = &core.Message{Topic: "read", Body: body}
	}
	var out []core.SendResult
	for i := 0; i < n; i += len(msgs) {
		r, err := s.ProduceBatch(context.Background(), msgs[:min(len(msgs), n-i)])
		require.NoError(b, err)
		out = append(out, r...)
	}
	return out
}

func BenchmarkReadQueue(b *testing.B) {
	for _, size := range []int{100, 1024} {
		b.Run(fmt.Sprintf("size=%d/batch=32", size), func(b *testing.B) {
			s := benchStore(b, Options{DefaultQueues: 1})
			const n = 200_000
			fillQueue(b, s, n, size)
			ctx := context.Background()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			off := int64(0)
			read := 0
			for read < b.N {
				res, err := s.Read(ctx, core.ReadRequest{Topic: "read", Offset: off, MaxCount: 32})
				if err != nil {
					b.Fatal(err)
				}
				read += len(res.Messages)
				off = res.NextOffset
				if off >= n {
					off = 0
				}
			}
			b.ReportMetric(float64(read)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

func BenchmarkGetByID(b *testing.B) {
	s := benchStore(b, Options{DefaultQueues: 1})
	ids := fillQueue(b, s, 100_000, 1024)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if _, err := s.Get(ctx, ids[i%len(ids)].ID); err != nil {
			b.Fatal(err)
		}
		i += 7919
	}
}

// BenchmarkRecovery measures Open after a crash with logBytes of log: once
// with the checkpoint in place (what a crash normally leaves) and once with
// it and the consume queues gone (a full rebuild from the log). Set
// FERRYMQ_BENCH_LOG_BYTES to change the size (default 1 GiB).
func BenchmarkRecovery(b *testing.B) {
	logBytes := int64(1 << 30)
	if v := os.Getenv("FERRYMQ_BENCH_LOG_BYTES"); v != "" {
		_, _ = fmt.Sscan(v, &logBytes)
	}
	dir := b.TempDir()
	opts := Options{SegmentBytes: 256 << 20}
	s, err := Open(dir, opts)
	require.NoError(b, err)
	body := make([]byte, 1024)
	msgs := make([]*core.Message, 256)
	for i := range msgs {
		msgs[i] = &core.Message{Topic: "rec", ShardingKey: fmt.Sprintf("dev-%d", i), Body: body}
	}
	for {
		if _, end := s.cl.bounds(); end >= logBytes {
			break
		}
		_, err := s.ProduceBatch(context.Background(), msgs)
		require.NoError(b, err)
	}
	require.NoError(b, s.Close())
	for _, mode := range []string{"checkpoint", "full-rebuild"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				markUnclean(b, dir)
				if mode == "full-rebuild" {
					require.NoError(b, os.Remove(filepath.Join(dir, fileCheckpoint)))
					require.NoError(b, os.RemoveAll(filepath.Join(dir, "consumequeue")))
					require.NoError(b, os.RemoveAll(filepath.Join(dir, dirIndex)))
				}
				b.StartTimer()
				start := time.Now()
				s, err := Open(dir, opts)
				require.NoError(b, err)
				b.ReportMetric(time.Since(start).Seconds(), "s/open")
				b.StopTimer()
				require.NoError(b, s.Close())
				b.StartTimer()
			}
		})
	}
}

// BenchmarkResizeTopic measures what a resize costs the producers of a
// topic in use: 4 producers send 1 KiB messages with FlushSync while the
// topic is resized 8 ↔ 16 every 20 ms. resize-µs is one resize (the most
// producers may be held: the metadata write); produce-max-µs,
// produce-p99-µs and produce-p50-µs are the produces' latencies over the
// run, to set against resizes=no (the same run without resizing).
func BenchmarkResizeTopic(b *testing.B) {
	for _, resize := range []bool{false, true} {
		b.Run(fmt.Sprintf("resizes=%v", map[bool]string{false: "no", true: "yes"}[resize]), func(b *testing.B) {
			brokertest.BenchResize(b, []core.Broker{benchStore(b, Options{FlushPolicy: FlushSync})}, resize, 20*time.Millisecond)
		})
	}
}

// BenchmarkReadTail reads one queue 32 messages at a time from three
// places of a 100 MiB log: the newest 16 MiB from the tail cache (hit), the
// same from the segments' mappings with the cache off (mapped: a warm page
// cache), and the oldest 48 MiB from behind a 32 MiB cache (cold: pread,
// drop-behind — so each pass reads from the disk again, as a backlog replay
// does — with the reader's budget unlimited, and at its default).
func BenchmarkReadTail(b *testing.B) {
	const logBytes, tailBytes, coldBytes = 100 << 20, 16 << 20, 48 << 20
	for _, size := range []int{1024, 64 << 10} {
		n := logBytes / size
		for _, c := range []struct {
			name     string
			cache    int64
			budget   int64
			from, to int
		}{
			{"hit", 32 << 20, -1, n - tailBytes/size, n},
			{"mapped", -1, -1, n - tailBytes/size, n},
			{"cold", 32 << 20, -1, 0, coldBytes / size},
			{"cold-budget", 32 << 20, 0, 0, coldBytes / size},
		} {
			b.Run(fmt.Sprintf("%s/size=%dKiB/batch=32", c.name, size>>10), func(b *testing.B) {
				s := benchStore(b, Options{DefaultQueues: 1, TailCacheBytes: c.cache, ReaderColdReadBytesPerSec: c.budget})
				fillQueue(b, s, n, size)
				ctx := context.Background()
				before, diskBefore := s.Stats(), diskReadBytes(b)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				off, read := int64(c.from), 0
				for read < b.N {
					res, err := s.Read(ctx, core.ReadRequest{Topic: "read", Offset: off, MaxCount: 32, Reader: "bench"})
					if err != nil {
						b.Fatal(err)
					}
					read += len(res.Messages)
					off = res.NextOffset
					if off >= int64(c.to) {
						off = int64(c.from)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(read)/b.Elapsed().Seconds(), "msgs/s")
				b.ReportMetric(float64(diskReadBytes(b)-diskBefore)/1e6/b.Elapsed().Seconds(), "disk-MB/s")
				after := s.Stats()
				if hits, misses := after.TailCacheHits-before.TailCacheHits, after.TailCacheMisses-before.TailCacheMisses; hits+misses > 0 {
					b.ReportMetric(float64(hits)/float64(hits+misses), "hit-ratio")
				}
			})
		}
	}
}

// BenchmarkTailCacheFill is the writer's copy into a warm tail cache (its
// pages touched once already), per write of a batch's chunk.
func BenchmarkTailCacheFill(b *testing.B) {
	for _, chunk := range []int{16 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("chunk=%dKiB", chunk>>10), func(b *testing.B) {
			c, err := newTailCache(DefaultTailCacheBytes, 0)
			require.NoError(b, err)
			b.Cleanup(c.release)
			p := make([]byte, chunk)
			off := int64(0)
			for off < c.capacity { // touch every page once
				c.fill(off, p)
				off += int64(len(p))
			}
			b.SetBytes(int64(chunk))
			b.ResetTimer()
			for b.Loop() {
				c.fill(off, p)
				off += int64(len(p))
			}
		})
	}
}

// diskReadBytes is what this process has had read from the disk so far
// (read_bytes of /proc/self/io: page-cache misses, readahead included).
func diskReadBytes(b *testing.B) int64 {
	b.Helper()
	data, err := os.ReadFile("/proc/self/io")
	require.NoError(b, err)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "read_bytes: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatal("no read_bytes in /proc/self/io")
	return 0
}
