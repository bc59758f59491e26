package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/store"
)

// BenchmarkConsume measures steady-state in-process consumption: the members
// join and settle their assignment on a warm-up set first (untimed), then
// b.N 1 KiB messages are stored while the listeners are held at a gate
// (untimed; each queue prefetches at most one pull batch), and the timer runs
// from opening the gate until every message was handled and committed.
// Real store, real coordinator, real goroutines.
func BenchmarkConsume(b *testing.B) {
	cases := []struct {
		name    string
		members int
		keys    int
		orderly bool
	}{
		{"clustering/queues=8/members=4/size=1KiB", 4, 10_000, false},
		{"orderly/queues=8/members=4/keys=100/size=1KiB", 4, 100, true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s, err := store.Open(b.TempDir(), store.Options{IndexSlots: 1 << 16, IndexEntries: 1 << 20})
			require.NoError(b, err)
			defer s.Close()
			ctx := context.Background()
			_, err = s.CreateTopic(ctx, core.TopicConfig{Name: "bench", Queues: 8})
			require.NoError(b, err)
			body := make([]byte, 1024)
			produce := func(n int) {
				batch := make([]*core.Message, 256)
				for i := 0; i < n; i += len(batch) {
					k := min(len(batch), n-i)
					for j := 0; j < k; j++ {
						batch[j] = &core.Message{Topic: "bench", ShardingKey: fmt.Sprintf("key-%d", (i+j)%c.keys), Body: body}
					}
					_, err := s.ProduceBatch(ctx, batch[:k])
					require.NoError(b, err)
				}
			}
			coord, err := group.New(s, group.Options{})
			require.NoError(b, err)
			coord.Start()
			defer coord.Close()
			r, err := retry.New(s, retry.Options{})
			require.NoError(b, err)
			r.Start()
			defer r.Close()

			const warm = 8_000
			var got atomic.Int64
			total := int64(warm + b.N)
			done := make(chan struct{})
			var gate sync.RWMutex
			var cs []*PushConsumer
			for m := 0; m < c.members; m++ {
				p, err := NewPushConsumer(coord, r, Options{Group: "bench", ClientID: fmt.Sprintf("m%d", m),
					Orderly: c.orderly, Subscriptions: []group.Subscription{{Topic: "bench"}},
					PullBatch: 64, MaxInflightPerQueue: 64,
					Listener: func(ctx context.Context, m *core.StoredMessage) Result {
						gate.RLock()
						gate.RUnlock()
						if got.Add(1) == total {
							close(done)
						}
						return Success
					}})
				require.NoError(b, err)
				require.NoError(b, p.Start(ctx))
				cs = append(cs, p)
			}
			produce(warm)
			require.Eventually(b, func() bool {
				if got.Load() < warm {
					return false
				}
				members := coord.Members("bench")
				for _, m := range members {
					n := 0
					for _, q := range m.Queues {
						if q.Topic == "bench" {
							n++
						}
					}
					if n != 8/c.members {
						return false
					}
				}
				return len(members) == c.members
			}, time.Minute, time.Millisecond)
			gate.Lock()
			produce(b.N)
			b.SetBytes(1024)
			b.ReportAllocs()
			b.ResetTimer()
			gate.Unlock()
			select {
			case <-done:
			case <-time.After(5 * time.Minute):
				b.Fatal("not everything was consumed")
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			for _, p := range cs {
				require.NoError(b, p.Close(ctx))
			}
		})
	}
}
