package brokertest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// BenchResize measures what resizing a topic in use costs its producers,
// the same way on every engine: four producers (spread over brokers, one
// engine per node) send 1 KiB keyed messages while, if resize is set,
// brokers[0] resizes the topic 8 ↔ 16 every period. It reports resize-µs
// (one resize call), produce-p50-µs, produce-p99-µs and produce-max-µs
// over the run, and of the produces that overlapped a resize call
// met-p50-µs and met-max-µs, and pause-p50-µs: per resize the longest
// produce it met, the median over the resizes (what a resize costs the
// producers it meets, the pause). A run with resize unset is the baseline.
func BenchResize(b *testing.B, brokers []core.Broker, resize bool, period time.Duration) {
	ctx := context.Background()
	_, err := brokers[0].CreateTopic(ctx, core.TopicConfig{Name: "bench", Queues: 8})
	require.NoError(b, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	type span struct{ from, to time.Time }
	var spans []span // the produces' (under mu)
	body := make([]byte, 1024)
	for p := range 4 {
		wg.Go(func() {
			var mine []time.Duration
			var mySpans []span
			defer func() { mu.Lock(); lat = append(lat, mine...); spans = append(spans, mySpans...); mu.Unlock() }()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				m := &core.Message{Topic: "bench", ShardingKey: fmt.Sprintf("dev-%d-%d", p, i%64), Body: body}
				if _, err := brokers[p%len(brokers)].Produce(ctx, m); err != nil {
					b.Error(err)
					return
				}
				t1 := time.Now()
				mine = append(mine, t1.Sub(t0))
				mySpans = append(mySpans, span{t0, t1})
			}
		})
	}
	var took time.Duration
	var resizes []span
	for i := 0; b.Loop(); i++ {
		time.Sleep(period) // the producers' steady state between two resizes
		if resize {
			t0 := time.Now()
			if _, err := brokers[0].ResizeTopic(ctx, "bench", 8+8*(i%2^1)); err != nil {
				b.Fatal(err)
			}
			took += time.Since(t0)
			resizes = append(resizes, span{t0, time.Now()})
		}
	}
	b.ReportMetric(float64(took.Microseconds())/float64(b.N), "resize-µs")
	b.StopTimer()
	close(stop)
	wg.Wait()
	var met []time.Duration
	pauses := make([]time.Duration, len(resizes)) // per resize, the longest produce it met
	for _, p := range spans {
		for i, r := range resizes {
			if p.from.Before(r.to) && r.from.Before(p.to) {
				met = append(met, p.to.Sub(p.from))
				pauses[i] = max(pauses[i], p.to.Sub(p.from))
				break
			}
		}
	}
	if slices.Sort(met); len(met) > 0 {
		b.ReportMetric(float64(met[len(met)-1].Microseconds()), "met-max-µs")
		b.ReportMetric(float64(met[len(met)/2].Microseconds()), "met-p50-µs")
	}
	if slices.Sort(pauses); len(pauses) > 0 {
		b.ReportMetric(float64(pauses[len(pauses)/2].Microseconds()), "pause-p50-µs")
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "produce-max-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "produce-p99-µs")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "produce-p50-µs")
	}
}
