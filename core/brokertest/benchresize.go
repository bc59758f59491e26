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
// (one resize, the most producers may be held) and produce-p50-µs,
// produce-p99-µs and produce-max-µs over the run; a run with resize unset
// is the baseline.
func BenchResize(b *testing.B, brokers []core.Broker, resize bool, period time.Duration) {
	ctx := context.Background()
	_, err := brokers[0].CreateTopic(ctx, core.TopicConfig{Name: "bench", Queues: 8})
	require.NoError(b, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	body := make([]byte, 1024)
	for p := range 4 {
		wg.Go(func() {
			var mine []time.Duration
			defer func() { mu.Lock(); lat = append(lat, mine...); mu.Unlock() }()
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
				mine = append(mine, time.Since(t0))
			}
		})
	}
	var took time.Duration
	for i := 0; b.Loop(); i++ {
		time.Sleep(period) // the producers' steady state between two resizes
		if resize {
			t0 := time.Now()
			if _, err := brokers[0].ResizeTopic(ctx, "bench", 8+8*(i%2^1)); err != nil {
				b.Fatal(err)
			}
			took += time.Since(t0)
		}
	}
	b.ReportMetric(float64(took.Microseconds())/float64(b.N), "resize-µs")
	b.StopTimer()
	close(stop)
	wg.Wait()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "produce-max-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "produce-p99-µs")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "produce-p50-µs")
	}
}
