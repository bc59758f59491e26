package delay

import (
	"bufio"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
)

// jumpClock is the wall clock plus an offset a benchmark moves forward.
type jumpClock struct{ offset atomic.Int64 }

func (c *jumpClock) Now() time.Time                  { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *jumpClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// BenchmarkSchedule measures accepting delayed messages: batches of 100
// with delays spread over 40 days (async flush).
func BenchmarkSchedule(b *testing.B) {
	dir := b.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	svc, err := New(st, filepath.Join(dir, "delay"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close() // not started: nothing moves while we measure
	br := svc.Broker()
	rng := rand.New(rand.NewPCG(1, 1))
	body := make([]byte, 100)
	batch := make([]*core.Message, 100)
	b.ReportAllocs()
	b.SetBytes(int64(len(body) * len(batch)))
	for b.Loop() {
		now := time.Now()
		for i := range batch {
			batch[i] = &core.Message{Topic: "t", ShardingKey: "dev-" + strconv.Itoa(i), Body: body,
				DeliverAt: now.Add(time.Minute + time.Duration(rng.Int64N(int64(39*24*time.Hour))))}
		}
		if _, err := br.ProduceBatch(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "timers/s")
}

// BenchmarkMillionTimers schedules FERRYMQ_TIMERS (default 1,000,000)
// delayed messages of 100 bytes with delays of 1 to 2 hours, reports the
// scheduling rate and the RSS the pending timers cost, then moves the clock
// two hours ahead and reports how fast the service delivers them all.
// Run with -benchtime 1x.
func BenchmarkMillionTimers(b *testing.B) {
	n := 1_000_000
	if v := os.Getenv("FERRYMQ_TIMERS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	for b.Loop() {
		dir := b.TempDir()
		clock := &jumpClock{}
		st, err := store.Open(filepath.Join(dir, "store"), store.Options{SegmentBytes: 256 << 20, Now: clock.Now})
		if err != nil {
			b.Fatal(err)
		}
		svc, err := New(st, filepath.Join(dir, "delay"), Options{Clock: clock, PollInterval: 50 * time.Millisecond, BatchSize: 1024})
		if err != nil {
			b.Fatal(err)
		}
		svc.Start()
		br := svc.Broker()
		runtime.GC()
		before := rssBytes()
		rng := rand.New(rand.NewPCG(1, 1))
		body := make([]byte, 100)
		start := time.Now()
		const batchLen = 500
		for i := 0; i < n; i += batchLen {
			batch := make([]*core.Message, 0, batchLen)
			now := clock.Now()
			for j := i; j < min(n, i+batchLen); j++ {
				batch = append(batch, &core.Message{Topic: "t", ShardingKey: "dev-" + strconv.Itoa(j%10_000), Body: body,
					DeliverAt: now.Add(time.Hour + time.Duration(rng.Int64N(int64(time.Hour))))})
			}
			if _, err := br.ProduceBatch(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
		}
		sched := time.Since(start)
		runtime.GC()
		after := rssBytes()
		b.ReportMetric(float64(n)/sched.Seconds(), "scheduled/s")
		b.ReportMetric(float64(after-before)/(1<<20), "MiB-RSS-for-pending")
		b.ReportMetric(float64(after)/(1<<20), "MiB-RSS-total")

		clock.offset.Add(int64(2*time.Hour + time.Minute))
		start = time.Now()
		moved := waitDelivered(b, svc, n, 10*time.Millisecond)
		fire := time.Since(start)
		b.ReportMetric(float64(moved)/float64(n), "copies/timer")
		b.ReportMetric(float64(n)/fire.Seconds(), "fired/s")
		_ = svc.Close()
		_ = st.Close()
	}
}

// waitDelivered polls svc's stats every tick until n messages were
// delivered, and returns how many copies moved them; a stats error fails b
// at once. The hour only bounds a hang: -timeout comes first.
func waitDelivered(b *testing.B, svc *Service, n int, tick time.Duration) (moved int64) {
	b.Helper()
	var st Stats
	var err error
	require.Eventually(b, func() bool {
		st, err = svc.Stats(context.Background())
		return err != nil || st.Delivered >= int64(n)
	}, time.Hour, tick, "%d delayed messages delivered", n)
	require.NoError(b, err)
	return st.Moved
}

// rssBytes reads the process's resident set size from /proc.
func rssBytes() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkTimersOnTime schedules FERRYMQ_TIMERS (default 200,000) delayed
// messages with delays of 1 to 60 minutes on a clock running 300 times
// faster than the wall clock — the hour plays in 12 s, so about 17,000
// messages come due per real second, each moved through its levels on the
// way — and reports how late they were delivered (p50, p99, max, in clock
// seconds) and the copies each cost. Run with -benchtime 1x.
func BenchmarkTimersOnTime(b *testing.B) {
	n := 200_000
	if v := os.Getenv("FERRYMQ_TIMERS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	for b.Loop() {
		dir := b.TempDir()
		clock := NewScaledClock(time.Now(), 300)
		st, err := store.Open(filepath.Join(dir, "store"), store.Options{SegmentBytes: 256 << 20, Now: clock.Now})
		if err != nil {
			b.Fatal(err)
		}
		svc, err := New(st, filepath.Join(dir, "delay"), Options{Clock: clock, PollInterval: 5 * time.Millisecond, BatchSize: 1024})
		if err != nil {
			b.Fatal(err)
		}
		svc.Start()
		br := svc.Broker()
		rng := rand.New(rand.NewPCG(2, 2))
		body := make([]byte, 100)
		for i := 0; i < n; i += 500 {
			batch := make([]*core.Message, 0, 500)
			now := clock.Now()
			for j := i; j < min(n, i+500); j++ {
				batch = append(batch, &core.Message{Topic: "t", Body: body,
					DeliverAt: now.Add(time.Minute + time.Duration(rng.Int64N(int64(59*time.Minute))))})
			}
			if _, err := br.ProduceBatch(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
		}
		moved := waitDelivered(b, svc, n, 20*time.Millisecond)
		b.ReportMetric(float64(moved)/float64(n), "copies/timer")
		var late []float64
		info, _ := st.Topic(context.Background(), "t")
		for q := range info.Queues {
			for off := int64(0); ; {
				res, err := st.Read(context.Background(), core.ReadRequest{Topic: "t", Queue: q, Offset: off, MaxCount: 1024})
				if err != nil {
					b.Fatal(err)
				}
				for _, m := range res.Messages {
					late = append(late, m.StoredAt.Sub(m.DeliverAt).Seconds())
				}
				if res.NextOffset == off {
					break
				}
				off = res.NextOffset
			}
		}
		if len(late) != n {
			b.Fatalf("%d delivered, want %d", len(late), n)
		}
		slices.Sort(late)
		if late[0] < 0 {
			b.Fatalf("a message was delivered %.3f s early", -late[0])
		}
		b.ReportMetric(late[len(late)/2], "late-p50-s")
		b.ReportMetric(late[len(late)*99/100], "late-p99-s")
		b.ReportMetric(late[len(late)-1], "late-max-s")
		b.ReportMetric(float64(n)/(59*60/300.0), "due/s")
		_ = svc.Close()
		_ = st.Close()
	}
}
