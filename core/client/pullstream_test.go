package client_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/wire"
)

// countingProxy forwards TCP connections to addr and counts the frames of
// each op the clients send. It runs until the test ends.
type countingProxy struct {
	ln  net.Listener
	mu  sync.Mutex
	ops map[wire.Op]int
	wg  sync.WaitGroup
}

func startCountingProxy(t *testing.T, addr string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &countingProxy{ln: ln, ops: map[wire.Op]int{}}
	var conns []net.Conn
	var cmu sync.Mutex
	p.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			cmu.Lock()
			conns = append(conns, in, out)
			cmu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(in, out); _ = in.Close() })
			p.wg.Go(func() {
				defer out.Close()
				r := bufio.NewReader(in)
				for {
					f, err := wire.ReadFrame(r, wire.DefaultMaxFrame)
					if err != nil {
						return
					}
					p.mu.Lock()
					p.ops[f.Op]++
					p.mu.Unlock()
					if _, err := out.Write(wire.AppendFrame(nil, f)); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		cmu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		cmu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *countingProxy) count(op wire.Op) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ops[op]
}

// TestPushConsumerStreamsItsPulls: a push consumer keeping up with
// messages that arrive one at a time gets them over few pull requests
// (each a stream of up to PullBatch answers), not one request per message;
// every message arrives once, in order.
func TestPushConsumerStreamsItsPulls(t *testing.T) {
	const n, batch = 60, 16
	env := servertest.Start(t, servertest.Options{})
	proxy := startCountingProxy(t, env.Addr)
	c := dial(t, proxy.ln.Addr().String())
	_, err := c.CreateTopic(t.Context(), "ps", 1)
	require.NoError(t, err)
	got := make(chan string, n)
	pc, err := c.NewPushConsumer(consumer.Options{Group: "g", Subscriptions: []group.Subscription{{Topic: "ps"}},
		PullBatch: batch, PollWait: 30 * time.Second,
		Listener: func(_ context.Context, m *core.StoredMessage) consumer.Result {
			got <- string(m.Body)
			return consumer.Success
		}})
	require.NoError(t, err)
	require.NoError(t, pc.Start(t.Context()))
	defer func() { require.NoError(t, pc.Close(context.Background())) }()
	// Wait for the queue's first pull to be out, then produce one message
	// at a time, each after the one before was consumed.
	require.Eventually(t, func() bool { return proxy.count(wire.OpGroupPull) > 0 }, 10*time.Second, 5*time.Millisecond)
	before := proxy.count(wire.OpGroupPull)
	p := c.NewProducer()
	for i := range n {
		_, err := p.Send(t.Context(), &core.Message{Topic: "ps", Body: fmt.Append(nil, i)})
		require.NoError(t, err)
		select {
		case b := <-got:
			require.Equal(t, fmt.Sprint(i), b, "in order")
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d not consumed within 10 s (polls wait 30 s)", i)
		}
	}
	pulls := proxy.count(wire.OpGroupPull) - before
	// One request per 16 messages, and a few more where an answer's
	// commit or a stream's end races the next message; one per message
	// (60) without streams.
	require.LessOrEqual(t, pulls, n/batch+4, "%d pull requests for %d messages", pulls, n)
	require.Never(t, func() bool { return len(got) > 0 }, 200*time.Millisecond, 10*time.Millisecond, "no message twice")
}
