package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func dial(t testing.TB, addr string) *client.Client {
	t.Helper()
	c, err := client.Dial(t.Context(), client.Options{Addr: addr, MaxBackoff: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

type seen struct {
	mu sync.Mutex
	by map[core.MessageID]int
}

func (s *seen) add(id core.MessageID) {
	s.mu.Lock()
	if s.by == nil {
		s.by = map[core.MessageID]int{}
	}
	s.by[id]++
	s.mu.Unlock()
}

func (s *seen) has(res []core.SendResult) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range res {
		if s.by[r.ID] == 0 {
			return false
		}
	}
	return true
}

func TestProduceAndEveryConsumptionMode(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dial(t, env.Addr)
	ctx := t.Context()
	_, err := c.CreateTopic(ctx, "orders", 4)
	require.NoError(t, err)
	p := c.NewProducer()
	var sent []core.SendResult
	for i := 0; i < 50; i++ {
		r, err := p.Send(ctx, &core.Message{Topic: "orders", ShardingKey: fmt.Sprintf("car-%d", i%5), Keys: []string{fmt.Sprintf("o-%d", i)},
			Properties: map[string]string{"i": strconv.Itoa(i)}, Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
		require.Equal(t, "orders", r.Topic)
		sent = append(sent, r)
	}
	batch, err := p.SendBatch(ctx, []*core.Message{{Topic: "orders", Body: []byte("b1")}, {Topic: "orders", Body: []byte("b2")}})
	require.NoError(t, err)
	sent = append(sent, batch...)

	// Admin calls.
	m, err := c.Get(ctx, sent[7].ID)
	require.NoError(t, err)
	require.Equal(t, "7", string(m.Body))
	require.Equal(t, "7", m.Properties["i"])
	found, err := c.FindByKey(ctx, "orders", "o-9", core.KeyQuery{})
	require.NoError(t, err)
	require.Len(t, found, 1)
	topics, err := c.Topics(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, topics)
	_, err = c.Topic(ctx, "nope")
	require.ErrorIs(t, err, core.ErrTopicNotFound, "sentinels survive the wire")
	pr, err := c.Pull(ctx, "orders", 0, 0, 100, 0)
	require.NoError(t, err)
	require.NotEmpty(t, pr.Messages)

	t.Run("clustering", func(t *testing.T) {
		got := &seen{}
		var cs []*consumer.PushConsumer
		for i := 0; i < 2; i++ {
			pc, err := dial(t, env.Addr).NewPushConsumer(consumer.Options{Group: "clu", Subscriptions: []group.Subscription{{Topic: "orders"}},
				HeartbeatInterval: 50 * time.Millisecond, PollWait: 200 * time.Millisecond, CommitInterval: 10 * time.Millisecond,
				Listener: func(ctx context.Context, m *core.StoredMessage) consumer.Result {
					got.add(m.ID)
					return consumer.Success
				}})
			require.NoError(t, err)
			require.NoError(t, pc.Start(ctx))
			cs = append(cs, pc)
		}
		require.Eventually(t, func() bool { return got.has(sent) }, 20*time.Second, 10*time.Millisecond)
		for _, pc := range cs {
			require.NoError(t, pc.Close(ctx))
		}
		lag, err := c.Lag(ctx, "clu", "")
		if err == nil { // the group may have no live members left
			for _, l := range lag {
				if l.Topic == "orders" {
					require.Zero(t, l.Lag)
				}
			}
		}
		for q := 0; q < 4; q++ {
			off, err := env.Store.CommittedOffset(ctx, "clu", "orders", q)
			require.NoError(t, err)
			info, _ := env.Store.Topic(ctx, "orders")
			require.Equal(t, info.Ranges[q].Max, off)
		}
	})

	t.Run("broadcast", func(t *testing.T) {
		a, b := &seen{}, &seen{}
		for _, s := range []*seen{a, b} {
			pc, err := dial(t, env.Addr).NewPushConsumer(consumer.Options{Group: "bro", Mode: group.Broadcast,
				Subscriptions: []group.Subscription{{Topic: "orders"}}, HeartbeatInterval: 50 * time.Millisecond, PollWait: 200 * time.Millisecond,
				Listener: func(ctx context.Context, m *core.StoredMessage) consumer.Result { s.add(m.ID); return consumer.Success }})
			require.NoError(t, err)
			require.NoError(t, pc.Start(ctx))
			t.Cleanup(func() { _ = pc.Close(context.Background()) })
		}
		require.Eventually(t, func() bool { return a.has(sent) && b.has(sent) }, 20*time.Second, 10*time.Millisecond)
	})

	t.Run("orderly with retry in place", func(t *testing.T) {
		var mu sync.Mutex
		order := map[string][]int{}
		failed := map[core.MessageID]bool{}
		pc, err := dial(t, env.Addr).NewPushConsumer(consumer.Options{Group: "ord", Orderly: true,
			Subscriptions: []group.Subscription{{Topic: "orders"}}, HeartbeatInterval: 50 * time.Millisecond,
			PollWait: 200 * time.Millisecond, SuspendTime: time.Millisecond,
			Listener: func(ctx context.Context, m *core.StoredMessage) consumer.Result {
				mu.Lock()
				defer mu.Unlock()
				if !failed[m.ID] && m.QueueOffset%7 == 3 {
					failed[m.ID] = true
					return consumer.Retry
				}
				v, _ := strconv.Atoi(string(m.Body))
				order[m.ShardingKey] = append(order[m.ShardingKey], v)
				return consumer.Success
			}})
		require.NoError(t, err)
		require.NoError(t, pc.Start(ctx))
		t.Cleanup(func() { _ = pc.Close(context.Background()) })
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, o := range order {
				n += len(o)
			}
			return n == len(sent)
		}, 20*time.Second, 10*time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		for k, o := range order {
			if k == "" {
				continue
			}
			for i := 1; i < len(o); i++ {
				require.Less(t, o[i-1], o[i], "key %s", k)
			}
		}
	})

	t.Run("concurrent with retry through the broker", func(t *testing.T) {
		var mu sync.Mutex
		attempts := map[string][]int{}
		pc, err := dial(t, env.Addr).NewPushConsumer(consumer.Options{Group: "rty",
			Subscriptions: []group.Subscription{{Topic: "orders"}}, HeartbeatInterval: 50 * time.Millisecond, PollWait: 200 * time.Millisecond,
			Listener: func(ctx context.Context, m *core.StoredMessage) consumer.Result {
				mu.Lock()
				defer mu.Unlock()
				attempts[string(m.Body)] = append(attempts[string(m.Body)], m.ReconsumeCount)
				if string(m.Body) == "13" && m.ReconsumeCount < 2 {
					return consumer.Retry
				}
				return consumer.Success
			}})
		require.NoError(t, err)
		require.NoError(t, pc.Start(ctx))
		t.Cleanup(func() { _ = pc.Close(context.Background()) })
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(attempts["13"]) == 3
		}, 20*time.Second, 10*time.Millisecond)
		mu.Lock()
		require.Equal(t, []int{0, 1, 2}, attempts["13"])
		mu.Unlock()
	})

	t.Run("pop", func(t *testing.T) {
		sc := c.NewSimpleConsumer("popper", "orders")
		sc.Invisible = 100 * time.Millisecond
		got := &seen{}
		var kept []client.Received
		require.Eventually(t, func() bool {
			rs, err := sc.Receive(ctx, 32, 100*time.Millisecond)
			require.NoError(t, err)
			for _, r := range rs {
				if string(r.Body) == "21" && r.Attempt == 1 {
					kept = append(kept, r) // never acked: comes back
					continue
				}
				require.NoError(t, sc.Ack(ctx, r.Handle))
				got.add(r.ID)
			}
			return len(got.by) >= len(sent)-1 && len(kept) == 1
		}, 20*time.Second, time.Millisecond)
		err := sc.Ack(ctx, kept[0].Handle+"x")
		require.Error(t, err)
		// The kept message reappears after its invisible time, attempt 2.
		require.Eventually(t, func() bool {
			rs, err := sc.Receive(ctx, 32, 100*time.Millisecond)
			require.NoError(t, err)
			for _, r := range rs {
				require.NoError(t, sc.Ack(ctx, r.Handle))
				if string(r.Body) == "21" && r.Attempt == 2 {
					return true
				}
			}
			return false
		}, 20*time.Second, time.Millisecond)
	})
}

func TestPipelinedAsyncSendsKeepPerKeyOrder(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dial(t, env.Addr)
	p := c.NewProducer()
	const n = 5000
	var wg sync.WaitGroup
	wg.Add(n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		p.SendAsync(t.Context(), &core.Message{Topic: "seq", ShardingKey: fmt.Sprintf("dev-%d", i%10), Body: []byte(strconv.Itoa(i))},
			func(_ core.SendResult, err error) {
				if err != nil {
					errs <- err
				}
				wg.Done()
			})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	info, err := env.Store.Topic(t.Context(), "seq")
	require.NoError(t, err)
	total := 0
	for q := range info.Ranges {
		last := map[string]int{}
		off := int64(0)
		for {
			res, err := env.Store.Read(t.Context(), core.ReadRequest{Topic: "seq", Queue: q, Offset: off, MaxCount: 1000})
			require.NoError(t, err)
			for _, m := range res.Messages {
				v, _ := strconv.Atoi(string(m.Body))
				if prev, ok := last[m.ShardingKey]; ok {
					require.Less(t, prev, v, "key %s out of order", m.ShardingKey)
				}
				last[m.ShardingKey] = v
				total++
			}
			if res.NextOffset == off {
				break
			}
			off = res.NextOffset
		}
	}
	require.Equal(t, n, total)
}

// A one-way send gets no answer, yet the message is stored: it is read back
// from the store, once, as it was sent.
func TestSendOneWayReachesTheStore(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dial(t, env.Addr)
	_, err := c.CreateTopic(t.Context(), "oneway", 1)
	require.NoError(t, err)
	sent := core.Message{Topic: "oneway", ShardingKey: "dev-1", Tag: "fw", Keys: []string{"k1"},
		Properties: map[string]string{"p": "v"}, Body: []byte("one-way")}
	m := sent
	before := time.Now()
	require.NoError(t, c.NewProducer().SendOneWay(t.Context(), &m))

	var got []*core.StoredMessage
	require.Eventually(t, func() bool {
		res, err := env.Store.Read(t.Context(), core.ReadRequest{Topic: "oneway", Queue: 0, Offset: 0, MaxCount: 10})
		if err != nil {
			return false
		}
		got = res.Messages
		return len(got) > 0
	}, 5*time.Second, 5*time.Millisecond, "the one-way message never reached the store")
	require.Len(t, got, 1)
	// The wire carries no birth time: the message is born when stored.
	require.WithinRange(t, got[0].BornAt, before, time.Now())
	got[0].BornAt = time.Time{}
	require.Equal(t, sent, got[0].Message)
	require.Zero(t, got[0].QueueOffset)
}

func TestServerRestartMidStream(t *testing.T) {
	dir := t.TempDir()
	env := servertest.Start(t, servertest.Options{Dir: dir, FlushPolicy: "sync"})
	addr := env.Addr
	c := dial(t, addr)
	p := c.NewProducer()
	p.Backoff = 20 * time.Millisecond
	p.Retries = 50
	var mu sync.Mutex
	var acked []core.SendResult
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r, err := p.Send(t.Context(), &core.Message{Topic: "r", ShardingKey: "k", Body: []byte(strconv.Itoa(i))})
			if err != nil {
				continue // the send failed for good: not acknowledged
			}
			mu.Lock()
			acked = append(acked, r)
			mu.Unlock()
		}
	}()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) > 100 }, 10*time.Second, time.Millisecond)
	env.Stop()
	env2 := servertest.Start(t, servertest.Options{Dir: dir, Addr: addr, FlushPolicy: "sync"})
	mu.Lock()
	before := len(acked)
	mu.Unlock()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) > before+100 }, 20*time.Second, time.Millisecond,
		"the client reconnected and goes on")
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	for _, r := range acked {
		_, err := env2.Store.Get(t.Context(), r.ID)
		require.NoError(t, err, "acknowledged message %s lost", r.ID)
	}
}

// rawConn speaks the protocol by hand, for bad-input tests.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

func hello(t *testing.T, nc net.Conn, version int, token string) wire.Frame {
	t.Helper()
	p := fmt.Appendf(nil, `{"version":%d,"token":%q}`, version, token)
	_, err := nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpHello, ID: 1, Payload: p}))
	require.NoError(t, err)
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := wire.ReadFrame(nc, 1<<20)
	require.NoError(t, err)
	return f
}

// expectClosed reads until the server closes the connection.
func expectClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, err := wire.ReadFrame(nc, 1<<20); err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server should have closed the connection")
			return
		}
	}
}

func TestBadClientsDoNotHurtOthers(t *testing.T) {
	env := servertest.Start(t, servertest.Options{Token: "s3cret", Server: serverOpts()})
	good, err := client.Dial(t.Context(), client.Options{Addr: env.Addr, Token: "s3cret"})
	require.NoError(t, err)
	defer good.Close()
	p := good.NewProducer()
	check := func() {
		_, err := p.Send(t.Context(), &core.Message{Topic: "ok", Body: []byte("still fine")})
		require.NoError(t, err)
	}

	t.Run("bad token", func(t *testing.T) {
		_, err := client.Dial(t.Context(), client.Options{Addr: env.Addr, Token: "wrong"})
		var we *wire.Error
		require.ErrorAs(t, err, &we)
		require.Equal(t, wire.CodeUnauthorized, we.Code)
	})
	t.Run("wrong version", func(t *testing.T) {
		nc := rawConn(t, env.Addr)
		f := hello(t, nc, 99, "s3cret")
		require.NotZero(t, f.Flags&wire.FlagError)
		require.Equal(t, wire.CodeVersion, wire.DecodeError(f.Payload).Code)
		expectClosed(t, nc)
	})
	t.Run("request before hello", func(t *testing.T) {
		nc := rawConn(t, env.Addr)
		_, _ = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpTopicList, ID: 5, Payload: []byte("{}")}))
		f, err := wire.ReadFrame(nc, 1<<20)
		require.NoError(t, err)
		require.Equal(t, wire.CodeHandshake, wire.DecodeError(f.Payload).Code)
		expectClosed(t, nc)
	})
	t.Run("silent client", func(t *testing.T) {
		nc := rawConn(t, env.Addr)
		expectClosed(t, nc) // handshake timeout
	})
	t.Run("oversized frame with a header that is not sound", func(t *testing.T) {
		// (One with a sound header is skipped and answered:
		// TestAboveTheLimitsOverTheWire.)
		nc := rawConn(t, env.Addr)
		hello(t, nc, wire.Version, "s3cret")
		_, _ = nc.Write([]byte{0x7F, 0xFF, 0xFF, 0xFF, 0x7E, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
		f, err := wire.ReadFrame(nc, 1<<20)
		require.NoError(t, err)
		require.Equal(t, wire.CodeFrameTooLarge, wire.DecodeError(f.Payload).Code)
		expectClosed(t, nc)
	})
	t.Run("unknown op, truncated payload, bad json", func(t *testing.T) {
		nc := rawConn(t, env.Addr)
		hello(t, nc, wire.Version, "s3cret")
		for _, f := range []wire.Frame{
			{Op: 0x7E, ID: 2},
			{Op: wire.OpProduce, ID: 3, Payload: []byte{0, 0, 0, 1, 5, 'a'}},
			{Op: wire.OpTopicCreate, ID: 4, Payload: []byte("{not json")},
			{Op: wire.OpGet, ID: 5, Payload: []byte("short")},
		} {
			_, err := nc.Write(wire.AppendFrame(nil, f))
			require.NoError(t, err)
			r, err := wire.ReadFrame(nc, 1<<20)
			require.NoError(t, err)
			require.Equal(t, f.ID, r.ID)
			require.NotZero(t, r.Flags&wire.FlagError, "op %s", f.Op)
		}
		// The connection still works.
		_, err := nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpPing, ID: 9}))
		require.NoError(t, err)
		r, err := wire.ReadFrame(nc, 1<<20)
		require.NoError(t, err)
		require.Equal(t, uint64(9), r.ID)
		require.Zero(t, r.Flags&wire.FlagError)
	})
	t.Run("client that never reads", func(t *testing.T) {
		nc := rawConn(t, env.Addr)
		hello(t, nc, wire.Version, "s3cret")
		req := wire.AppendFrame(nil, wire.Frame{Op: wire.OpTopicList, ID: 7, Payload: []byte("{}")})
		// Ask for far more responses than fit in the socket buffers and never
		// read them: the server stops reading, then drops the connection
		// after its write timeout. Bounded in time and count.
		deadline := time.Now().Add(20 * time.Second)
		_ = nc.SetWriteDeadline(deadline)
		var werr error
		for i := 0; i < 5_000_000 && werr == nil; i++ {
			_, werr = nc.Write(req)
		}
		var ne net.Error
		require.Error(t, werr)
		require.False(t, errors.As(werr, &ne) && ne.Timeout(), "the server closed the connection (%v)", werr)
		check()
	})
	t.Run("killed mid-frame", func(t *testing.T) {
		nc := rawConn(t, env.Addr)
		hello(t, nc, wire.Version, "s3cret")
		full := wire.AppendFrame(nil, wire.Frame{Op: wire.OpProduce, ID: 3, Payload: make([]byte, 1000)})
		_, _ = nc.Write(full[:500])
		_ = nc.Close()
	})
	check()
}

// A coalesced batch the server refuses because of one bad message is sent
// again message by message: only the bad one fails.
func TestCoalescedBadMessageFailsAlone(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dial(t, env.Addr)
	p := c.NewProducer()
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := map[int]error{}
	const n = 300
	wg.Add(n)
	for i := 0; i < n; i++ {
		topic := "good"
		if i == 150 {
			topic = "bad topic"
		}
		p.SendAsync(t.Context(), &core.Message{Topic: topic, ShardingKey: "k", Body: []byte(strconv.Itoa(i))}, func(_ core.SendResult, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				failed[i] = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, failed, 1)
	require.ErrorIs(t, failed[150], core.ErrInvalidTopic)
	info, err := env.Store.Topic(t.Context(), "good")
	require.NoError(t, err)
	total := int64(0)
	for _, r := range info.Ranges {
		total += r.Max
	}
	require.Equal(t, int64(n-1), total)
}

// TestSeveralAddressesFindTheOneListening: with several core addresses
// (the nodes of a JetStream deployment, of which one listens), the client
// connects through the one that answers. (TestBinaryNATSTwoNodes lists the
// dead leader's address first after a failover.)
func TestSeveralAddressesFindTheOneListening(t *testing.T) {
	dead := func() string { // a loopback port nobody listens on
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		a := l.Addr().String()
		require.NoError(t, l.Close())
		return a
	}
	first := servertest.Start(t, servertest.Options{})
	c := dial(t, dead()+","+first.Addr+","+dead())
	ctx := t.Context()
	_, err := c.NewProducer().Send(ctx, &core.Message{Topic: "t", Body: []byte("1")})
	require.NoError(t, err)
	_, err = c.Topics(ctx)
	require.NoError(t, err)
}
