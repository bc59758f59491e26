package client_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/server/servertest"
)

// BenchmarkPushConsumerOneAtATime: a push consumer over loopback TCP that
// keeps up with messages produced one at a time (each produced once the
// one before was consumed), on a topic of 8 queues: the moderate-rate case,
// where each long poll finds one message. cpu-µs/msg is the process's CPU
// (server, client and consumer together; getrusage) per message.
func BenchmarkPushConsumerOneAtATime(b *testing.B) {
	env := servertest.Start(b, servertest.Options{})
	c := dial(b, env.Addr)
	_, err := c.CreateTopic(b.Context(), "bench", 8)
	require.NoError(b, err)
	got := make(chan struct{}, 1)
	pc, err := c.NewPushConsumer(consumer.Options{Group: "g", Subscriptions: []group.Subscription{{Topic: "bench"}},
		PollWait: 30 * time.Second,
		Listener: func(context.Context, *core.StoredMessage) consumer.Result {
			got <- struct{}{}
			return consumer.Success
		}})
	require.NoError(b, err)
	require.NoError(b, pc.Start(b.Context()))
	defer func() { require.NoError(b, pc.Close(context.Background())) }()
	p := c.NewProducer()
	keys := core.QueueKeys(8)
	send := func(i int) {
		_, err := p.Send(b.Context(), &core.Message{Topic: "bench", ShardingKey: keys[i%8], Body: fmt.Append(nil, i)})
		require.NoError(b, err)
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			b.Fatalf("message %d not consumed in 10 s", i)
		}
	}
	for i := range 64 { // every queue assigned and polled
		send(i)
	}
	cpu0 := cpuTime()
	b.ResetTimer()
	for i := range b.N {
		send(i)
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/msg")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
