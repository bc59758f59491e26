package consumer

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/store"
)

// BenchmarkConsume measures in-process consumption end to end: b.N 1 KiB
// messages are stored first (untimed), then the members consume them all
// with commits. Real store, real coordinator, real goroutines.
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
			batch := make([]*core.Message, 256)
			for i := 0; i < b.N; i += len(batch) {
				n := min(len(batch), b.N-i)
				for k := 0; k < n; k++ {
					batch[k] = &core.Message{Topic: "bench", ShardingKey: fmt.Sprintf("key-%d", (i+k)%c.keys), Body: body}
				}
				_, err := s.ProduceBatch(ctx, batch[:n])
				require.NoError(b, err)
			}
			coord, err := group.New(s, group.Options{})
			require.NoError(b, err)
			coord.Start()
			defer coord.Close()
			r, err := retry.New(s, retry.Options{})
			require.NoError(b, err)
			r.Start()
			defer r.Close()

			var got atomic.Int64
			done := make(chan struct{})
			b.SetBytes(1024)
			b.ReportAllocs()
			b.ResetTimer()
			var cs []*PushConsumer
			for m := 0; m < c.members; m++ {
				p, err := NewPushConsumer(coord, r, Options{Group: "bench", ClientID: fmt.Sprintf("m%d", m),
					Orderly: c.orderly, Subscriptions: []group.Subscription{{Topic: "bench"}}, PullBatch: 64,
					Listener: func(ctx context.Context, m *core.StoredMessage) Result {
						if got.Add(1) == int64(b.N) {
							close(done)
						}
						return Success
					}})
				require.NoError(b, err)
				require.NoError(b, p.Start(ctx))
				cs = append(cs, p)
			}
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
