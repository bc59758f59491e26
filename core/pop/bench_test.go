package pop

import (
	"context"
	"testing"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/retry"
)

// BenchmarkPopAck pops batches of 32 one-KiB messages from an 8-queue topic
// and acknowledges each: one op is one Pop plus its 32 Acks.
func BenchmarkPopAck(b *testing.B) {
	b.Run("size=1KiB/batch=32", benchPopAck)
}

func benchPopAck(b *testing.B) {
	const batch, refill = 32, 16384
	e := newEnv(b, "", retry.Options{}, Options{})
	e.createTopic(b, "bench", 8)
	ctx := context.Background()
	body := make([]byte, 1024)
	fill := func() {
		msgs := make([]*core.Message, 512)
		for range refill / len(msgs) {
			for i := range msgs {
				msgs[i] = &core.Message{Topic: "bench", Body: body}
			}
			if _, err := e.b.ProduceBatch(ctx, msgs); err != nil {
				b.Fatal(err)
			}
		}
	}
	fill()
	popped := 0
	b.ReportAllocs()
	b.SetBytes(batch * int64(len(body)))
	for b.Loop() {
		got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "bench", Max: batch})
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range got {
			if err := e.s.Ack(ctx, p.Handle); err != nil {
				b.Fatal(err)
			}
		}
		popped += len(got)
		if len(got) < batch {
			b.StopTimer()
			fill()
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(popped)/b.Elapsed().Seconds(), "msgs/s")
}
