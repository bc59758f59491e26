package client_test

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/wire"
)

// Issue #21: a 4 MiB message body (core.MaxBodyBytes) over the wire
// protocol with the default limits, and clear errors past them.

// big returns a message of topic with an n-byte body (a pattern seeded by
// seed) and metadata of every kind.
func big(topic string, n int, seed byte) *core.Message {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return &core.Message{Topic: topic, ShardingKey: "car-" + strconv.Itoa(int(seed)), Tag: "firmware",
		Keys: []string{"fw-" + strconv.Itoa(int(seed))}, Properties: map[string]string{"version": "1.2." + strconv.Itoa(int(seed))}, Body: b}
}

func requireBig(t testing.TB, want *core.Message, got *core.StoredMessage) {
	t.Helper()
	require.Len(t, got.Body, len(want.Body))
	require.True(t, bytes.Equal(want.Body, got.Body), "body differs")
	require.Equal(t, want.ShardingKey, got.ShardingKey)
	require.Equal(t, want.Properties, got.Properties)
}

// TestFourMiBOverTheWire: with the default limits a 4 MiB body with its
// metadata is produced (Send, SendAsync) and read back whole by Get, Pull,
// a push consumer and a POP consumer — four of them in four queues come
// one per POP answer, each once, instead of one answer over the frame
// limit.
func TestFourMiBOverTheWire(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dial(t, env.Addr)
	ctx := t.Context()
	_, err := c.CreateTopic(ctx, "firmware", 4)
	require.NoError(t, err)
	p := c.NewProducer()
	msgs := map[core.MessageID]*core.Message{}
	for seed := range byte(3) {
		m := big("firmware", core.MaxBodyBytes, seed)
		r, err := p.Send(ctx, m)
		require.NoError(t, err)
		msgs[r.ID] = m
	}
	async := big("firmware", core.MaxBodyBytes, 3)
	done := make(chan error, 1)
	p.SendAsync(ctx, async, func(r core.SendResult, err error) {
		if err == nil {
			msgs[r.ID] = async
		}
		done <- err
	})
	require.NoError(t, <-done)
	require.Len(t, msgs, 4)

	for id, m := range msgs {
		got, err := c.Get(ctx, id)
		require.NoError(t, err)
		requireBig(t, m, got)
		pr, err := c.Pull(ctx, "firmware", got.Queue, got.QueueOffset, 32, 0)
		require.NoError(t, err)
		require.NotEmpty(t, pr.Messages)
		requireBig(t, m, pr.Messages[0])
	}

	t.Run("push consumer", func(t *testing.T) {
		var mu sync.Mutex
		got := map[core.MessageID]bool{}
		pc, err := dial(t, env.Addr).NewPushConsumer(consumer.Options{Group: "push", Subscriptions: []group.Subscription{{Topic: "firmware"}},
			HeartbeatInterval: 50 * time.Millisecond, PollWait: 200 * time.Millisecond,
			Listener: func(_ context.Context, m *core.StoredMessage) consumer.Result {
				want := msgs[m.ID]
				mu.Lock()
				defer mu.Unlock()
				if want != nil && bytes.Equal(want.Body, m.Body) {
					got[m.ID] = true
				}
				return consumer.Success
			}})
		require.NoError(t, err)
		require.NoError(t, pc.Start(ctx))
		t.Cleanup(func() { _ = pc.Close(context.Background()) })
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) == len(msgs)
		}, 20*time.Second, 10*time.Millisecond, "every 4 MiB message, whole")
	})

	t.Run("pop consumer", func(t *testing.T) {
		sc := c.NewSimpleConsumer("popper", "firmware")
		got := map[core.MessageID]bool{}
		for len(got) < len(msgs) {
			rs, err := sc.Receive(ctx, 32, time.Second)
			require.NoError(t, err, "the connection stays up")
			require.Len(t, rs, 1, "one 4 MiB message per answer: two would exceed the pop's 4 MiB")
			require.False(t, got[rs[0].ID], "handed out twice")
			requireBig(t, msgs[rs[0].ID], rs[0].StoredMessage)
			require.NoError(t, sc.Ack(ctx, rs[0].Handle))
			got[rs[0].ID] = true
		}
	})
}

// TestAboveTheLimitsOverTheWire: a message one byte past the store's limit
// gets error 12 naming both sizes and the setting; a produce larger than
// the server's frame is refused by the Go client before it is sent; a raw
// frame past the limit is skipped by the server and answered with error 5
// naming the limit, on a connection that goes on; a lookup whose answer
// would exceed the frame is refused with error 5 rather than sent. After
// each, the same connection serves the next request.
func TestAboveTheLimitsOverTheWire(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dial(t, env.Addr)
	ctx := t.Context()
	p := c.NewProducer()
	small := func() {
		t.Helper()
		_, err := p.Send(ctx, &core.Message{Topic: "after", Body: []byte("still fine")})
		require.NoError(t, err)
	}

	t.Run("message over store.max_message_bytes", func(t *testing.T) {
		_, err := p.Send(ctx, big("t", core.DefaultMaxMessageBytes, 1))
		require.ErrorIs(t, err, core.ErrMessageTooLarge)
		var we *wire.Error
		require.ErrorAs(t, err, &we)
		require.Equal(t, wire.CodeMessageTooLarge, we.Code)
		require.Contains(t, we.Message, "limit 4456448 (store.max_message_bytes)")
		small()
	})

	t.Run("request over the server's frame, in the client", func(t *testing.T) {
		_, err := p.Send(ctx, &core.Message{Topic: "t", Body: make([]byte, wire.DefaultMaxFrame)})
		require.ErrorIs(t, err, wire.ErrFrameTooLarge)
		require.ErrorContains(t, err, "the server's limit 8388608")
		small()
	})

	t.Run("raw frame over the limit is skipped and answered", func(t *testing.T) {
		nc, err := net.Dial("tcp", env.Addr)
		require.NoError(t, err)
		defer nc.Close()
		hello(t, nc, wire.Version, "")
		payload, err := wire.EncodeProduce([]*core.Message{{Topic: "t", Body: make([]byte, wire.DefaultMaxFrame)}})
		require.NoError(t, err)
		go func() {
			_, _ = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpProduce, ID: 42, Payload: payload}))
		}()
		require.NoError(t, nc.SetReadDeadline(time.Now().Add(20*time.Second)))
		f, err := wire.ReadFrame(nc, 1<<20)
		require.NoError(t, err)
		require.Equal(t, uint64(42), f.ID, "the answer is the request's")
		require.NotZero(t, f.Flags&wire.FlagError)
		we := wire.DecodeError(f.Payload)
		require.Equal(t, wire.CodeFrameTooLarge, we.Code)
		require.Contains(t, we.Message, "limit 8388608")
		_, err = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpPing, ID: 43}))
		require.NoError(t, err)
		f, err = wire.ReadFrame(nc, 1<<20)
		require.NoError(t, err)
		require.Equal(t, uint64(43), f.ID, "the connection goes on")
		require.Zero(t, f.Flags&wire.FlagError)
		info, err := env.Store.Topic(ctx, "t")
		if err == nil {
			for _, r := range info.Ranges {
				require.Zero(t, r.Max, "nothing of the skipped produce is stored")
			}
		}
	})

	t.Run("answer over the frame", func(t *testing.T) {
		for seed := range byte(2) {
			m := big("lookup", core.MaxBodyBytes, 9)
			m.Body[0] = seed
			_, err := p.Send(ctx, m)
			require.NoError(t, err)
		}
		_, err := c.FindByKey(ctx, "lookup", "car-9", core.KeyQuery{})
		require.ErrorIs(t, err, wire.ErrFrameTooLarge, "two 4 MiB messages and their envelopes exceed 8 MiB")
		require.ErrorContains(t, err, "ask for fewer messages")
		found, err := c.FindByKey(ctx, "lookup", "car-9", core.KeyQuery{Max: 1})
		require.NoError(t, err)
		require.Len(t, found, 1)
		small()
	})
}

// TestWireConnectionsKeepNoLargeBuffers: eight clients each send and read
// back a 4 MiB message; afterwards the process's heap — server and client
// connections, both directions, and the store's writer — is within 2 MiB
// of what it was with the same connections idle, where one kept buffer
// would add 4 MiB. (It found the store's writer keeping a 4 MiB record's
// chunk buffer in each of its two batches for good: now until a
// checkpoint interval passes without one, Store.trimLarge.)
func TestWireConnectionsKeepNoLargeBuffers(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	ctx := t.Context()
	const conns = 8
	cs := make([]*client.Client, conns)
	for i := range cs {
		cs[i] = dial(t, env.Addr)
		_, err := cs[i].NewProducer().Send(ctx, &core.Message{Topic: "mem", Body: []byte("warm")})
		require.NoError(t, err)
	}
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	before := heap()
	for i, c := range cs {
		m := big("mem", core.MaxBodyBytes, byte(i))
		r, err := c.NewProducer().Send(ctx, m)
		require.NoError(t, err)
		got, err := c.Get(ctx, r.ID)
		require.NoError(t, err)
		require.Len(t, got.Body, core.MaxBodyBytes)
	}
	// The store's writer keeps a large record's buffers while such
	// records keep coming, and lets go of them after a checkpoint
	// interval (1 s) without one.
	var after uint64
	require.Eventually(t, func() bool {
		after = heap()
		return int64(after)-int64(before) < 2<<20
	}, 10*time.Second, 100*time.Millisecond, "a buffer of a 4 MiB message was kept (heap %d B before)", before)
	t.Logf("heap before %d B, after %d B", before, after)
}
