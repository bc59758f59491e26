package jetstream_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/brokertest"
	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// BenchmarkProduceAsync: pipelined produces of 256-byte keyed messages to
// a 4-queue topic on a single in-process nats-server, file storage, the
// server's default sync interval (sync=always is per-message fsync:
// docs/BENCHMARKS.md).
func BenchmarkProduceAsync(b *testing.B) {
	s := natstest.RunServer(b)
	e := openEngineB(b, s.URL)
	body := make([]byte, 256)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 1024)
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sem <- struct{}{}
		wg.Add(1)
		e.ProduceAsync([]*core.Message{{Topic: "bench", ShardingKey: fmt.Sprint("car-", i%1000), Body: body}}, func(_ []core.SendResult, err error) {
			if err != nil {
				b.Error(err)
			}
			<-sem
			wg.Done()
		})
	}
	wg.Wait()
}

// BenchmarkReadQueue: reading one queue of a 4-queue topic with batched
// direct gets (32 per read) — what a downlink node spends per command that
// is not for its clients, and a consumer per message.
func BenchmarkReadQueue(b *testing.B) {
	s := natstest.RunServer(b)
	e := openEngineB(b, s.URL)
	const n = 20_000
	body := make([]byte, 256)
	msgs := make([]*core.Message, 0, 512)
	for i := 0; i < n; i++ {
		msgs = append(msgs, &core.Message{Topic: "bench", ShardingKey: fmt.Sprint("car-", i%1000), Body: body})
		if len(msgs) == cap(msgs) {
			_, err := e.ProduceBatch(context.Background(), msgs)
			require.NoError(b, err)
			msgs = msgs[:0]
		}
	}
	ctx := context.Background()
	b.ResetTimer()
	read := 0
	for read < b.N {
		for q := 0; q < 4 && read < b.N; q++ {
			off := int64(0)
			for read < b.N {
				res, err := e.Read(ctx, core.ReadRequest{Topic: "bench", Queue: q, Offset: off, MaxCount: 32})
				require.NoError(b, err)
				if len(res.Messages) == 0 {
					break
				}
				read += len(res.Messages)
				off = res.NextOffset
			}
		}
	}
}

// BenchmarkResizeTopic: what a resize costs producers. Two nodes (engines
// on their own connections) each run two sync producers of 1 KiB keyed
// messages while one node resizes the topic 8 ↔ 16 every 200 ms; the other
// node learns each resize from the fence. Against the same run without
// resizes; on one in-process server and on a 3-node in-process cluster
// (R3, the other node on another server), sync_interval: always
// (docs/BENCHMARKS.md).
func BenchmarkResizeTopic(b *testing.B) {
	for _, servers := range []int{1, 3} {
		for _, resize := range []bool{false, true} {
			b.Run(fmt.Sprintf("servers=%d/resizes=%v", servers, map[bool]string{false: "no", true: "yes"}[resize]), func(b *testing.B) {
				benchResize(b, servers, resize)
			})
		}
	}
}

func benchResize(b *testing.B, servers int, resize bool) {
	var urls []string
	if servers == 1 {
		urls = []string{natstest.RunServer(b, natstest.SyncAlways()).URL}
	} else {
		urls = strings.Split(natstest.RunCluster(b, servers, natstest.SyncAlways()).URLs(), ",")
	}
	var nodes []*jetstream.Engine
	for i := range 2 {
		u := urls[i%len(urls)]
		e, err := jetstream.Open(b.Context(), jetstream.Options{URLs: []string{u}, Replicas: servers, Timeout: 5 * time.Second})
		require.NoError(b, err)
		b.Cleanup(func() { _ = e.Close() })
		nodes = append(nodes, e)
	}
	brokertest.BenchResize(b, []core.Broker{nodes[0], nodes[1]}, resize, 200*time.Millisecond)
}
