package pop

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every wait of these tests.
const waitFor = 10 * time.Second

// env is a store, a retry service and a pop service, all running.
type env struct {
	dir string
	b   *store.Store
	r   *retry.Service
	s   *Service
}

// fastRetry redelivers within milliseconds.
var fastRetry = retry.Options{Schedule: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond}, MaxAttempts: 3}

// fastPop allows invisible times from 10 ms.
var fastPop = Options{MinInvisible: 10 * time.Millisecond}

// newEnv opens everything over dir (a fresh temp dir if empty) and closes it
// all at the end of the test, pop first.
func newEnv(t testing.TB, dir string, ropts retry.Options, popts Options) *env {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	b, err := store.Open(dir, store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	r, err := retry.New(b, ropts)
	require.NoError(t, err)
	r.Start()
	t.Cleanup(func() { _ = r.Close() })
	s, err := New(b, r, popts)
	require.NoError(t, err)
	s.Start()
	t.Cleanup(func() { _ = s.Close() })
	return &env{dir: dir, b: b, r: r, s: s}
}

// close stops everything, as a process exit would.
func (e *env) close(t testing.TB) {
	t.Helper()
	require.NoError(t, e.s.Close())
	require.NoError(t, e.r.Close())
	require.NoError(t, e.b.Close())
}

// createTopic creates topic with n queues.
func (e *env) createTopic(t testing.TB, topic string, n int) {
	t.Helper()
	_, err := e.b.CreateTopic(context.Background(), core.TopicConfig{Name: topic, Queues: n})
	require.NoError(t, err)
}

// produce stores n messages with sharding key key (none if empty); bodies
// are "<key>-<i>".
func (e *env) produce(t testing.TB, topic, key string, n int) []core.SendResult {
	t.Helper()
	msgs := make([]*core.Message, n)
	for i := range msgs {
		msgs[i] = &core.Message{
			Topic: topic, ShardingKey: key, Tag: fmt.Sprintf("t%d", i%2),
			Properties: map[string]string{"seq": fmt.Sprint(i)},
			Body:       fmt.Appendf(nil, "%s-%d", key, i),
		}
	}
	res, err := e.b.ProduceBatch(context.Background(), msgs)
	require.NoError(t, err)
	return res
}

// committed returns the group's committed offset, -1 if none.
func (e *env) committed(t testing.TB, group, topic string, queue int) int64 {
	t.Helper()
	o, err := e.b.CommittedOffset(context.Background(), group, topic, queue)
	if errors.Is(err, core.ErrNoCommittedOffset) {
		return -1
	}
	require.NoError(t, err)
	return o
}

func pop1(t testing.TB, s *Service, req Request) Popped {
	t.Helper()
	got, err := s.Pop(t.Context(), req)
	require.NoError(t, err)
	require.Len(t, got, 1)
	return got[0]
}

func TestExpiredMessageComesBackViaRetry(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, "", fastRetry, fastPop)
	sent := e.produce(t, "orders", "dev-1", 1)[0]

	hung := pop1(t, e.s, Request{Group: "g", Topic: "orders", Invisible: 50 * time.Millisecond})
	require.Equal(t, 1, hung.Attempt)
	require.Equal(t, sent.ID, hung.Message.ID)
	require.Equal(t, 0, hung.Message.ReconsumeCount)

	// Another consumer long-polls and gets it once its invisible time ran
	// out and the retry back-off passed.
	p := pop1(t, e.s, Request{Group: "g", Topic: "orders", Wait: waitFor})
	require.Equal(t, 2, p.Attempt)
	require.Equal(t, 1, p.Message.ReconsumeCount)
	require.Equal(t, retry.RetryTopic("g"), p.Message.Topic)
	require.Equal(t, sent.ID.String(), p.Message.Properties[retry.PropOriginID])
	require.Equal(t, "orders", p.Message.Properties[retry.PropOriginTopic])
	require.Equal(t, ReasonExpired, p.Message.Properties[retry.PropReason])
	require.Equal(t, "dev-1-0", string(p.Message.Body))
	require.False(t, p.VisibleAt.Before(time.Now().Add(DefaultInvisible-time.Second)), "default invisible time")

	require.ErrorIs(t, e.s.Ack(ctx, hung.Handle), ErrHandleExpired)
	require.NoError(t, e.s.Ack(ctx, p.Handle))
	require.ErrorIs(t, e.s.Ack(ctx, p.Handle), ErrHandleExpired, "acked twice")
	require.Equal(t, int64(1), e.committed(t, "g", "orders", sent.Queue), "the original counts as done")
	require.Equal(t, int64(1), e.committed(t, "g", retry.RetryTopic("g"), 0))
	got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "orders"})
	require.NoError(t, err)
	require.Empty(t, got)
}

func TestAckAfterDeadlineHasNoEffect(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, "", fastRetry, fastPop)
	e.createTopic(t, "orders", 1)
	e.produce(t, "orders", "", 1)

	p := pop1(t, e.s, Request{Group: "g", Topic: "orders", Invisible: 30 * time.Millisecond})
	require.Eventually(t, func() bool { return time.Now().After(p.VisibleAt) }, waitFor, time.Millisecond)
	require.ErrorIs(t, e.s.Ack(ctx, p.Handle), ErrHandleExpired)
	_, err := e.s.ChangeInvisibleTime(ctx, p.Handle, time.Second)
	require.ErrorIs(t, err, ErrHandleExpired)

	again := pop1(t, e.s, Request{Group: "g", Topic: "orders", Wait: waitFor})
	require.Equal(t, 2, again.Attempt, "the late ack did not consume it")
	require.NoError(t, e.s.Ack(ctx, again.Handle))
}

func TestForgedHandlesAreRefused(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, "", fastRetry, fastPop)
	e.produce(t, "orders", "k", 1)
	p := pop1(t, e.s, Request{Group: "g", Topic: "orders", Invisible: time.Minute})

	other, err := New(e.b, e.r, fastPop)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	foreign := pop1(t, other, Request{Group: "g2", Topic: "orders", Max: 1, Invisible: time.Minute})

	flip := func(s string, i int) string {
		c := byte('A')
		if s[i] == 'A' {
			c = 'B'
		}
		return s[:i] + string(c) + s[i+1:]
	}
	good, err := e.s.sign.decode(p.Handle)
	require.NoError(t, err)
	tampered := good
	tampered.offset++ // a well-formed handle for another message, re-encoded by someone without the key
	forger := newSigner([]byte("not the secret"))

	for _, tc := range []struct {
		name, handle string
	}{
		{"empty", ""},
		{"random", "hello-world"},
		{"not base64", "!!!!"},
		{"flipped first", flip(p.Handle, 0)},
		{"flipped middle", flip(p.Handle, len(p.Handle)/2)},
		{"flipped tag", flip(p.Handle, len(p.Handle)-5)},
		{"truncated", p.Handle[:len(p.Handle)-4]},
		{"extended", p.Handle + "AAAA"},
		{"huge", strings.Repeat("A", 100_000)},
		{"forged", forger.encode(tampered)},
		{"from another service", foreign.Handle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, e.s.Ack(ctx, tc.handle), ErrInvalidHandle)
			_, err := e.s.ChangeInvisibleTime(ctx, tc.handle, time.Second)
			require.ErrorIs(t, err, ErrInvalidHandle)
		})
	}
	require.NoError(t, e.s.Ack(ctx, p.Handle), "forgeries had no effect")
}

func TestChangeInvisibleTimeExtends(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, "", fastRetry, fastPop)
	e.createTopic(t, "orders", 1)
	e.produce(t, "orders", "", 1)
	p := pop1(t, e.s, Request{Group: "g", Topic: "orders", Invisible: 40 * time.Millisecond})

	for _, d := range []time.Duration{time.Millisecond, 13 * time.Hour} {
		_, err := e.s.ChangeInvisibleTime(ctx, p.Handle, d)
		require.ErrorIs(t, err, ErrInvisibleTime, "%v", d)
	}
	h2, err := e.s.ChangeInvisibleTime(ctx, p.Handle, waitFor)
	require.NoError(t, err)
	require.NotEqual(t, p.Handle, h2)
	_, err = e.s.ChangeInvisibleTime(ctx, p.Handle, time.Second)
	require.ErrorIs(t, err, ErrHandleExpired, "the old handle is replaced")

	require.Eventually(t, func() bool { return time.Now().After(p.VisibleAt.Add(20 * time.Millisecond)) }, waitFor, time.Millisecond)
	require.ErrorIs(t, e.s.Ack(ctx, p.Handle), ErrHandleExpired)
	require.NoError(t, e.s.Ack(ctx, h2))
	require.Equal(t, int64(1), e.committed(t, "g", "orders", 0))
	_, err = e.b.Topic(ctx, retry.RetryTopic("g"))
	require.ErrorIs(t, err, core.ErrTopicNotFound, "the message was never sent back")
}

func TestBadRequests(t *testing.T) {
	e := newEnv(t, "", fastRetry, fastPop)
	e.produce(t, "orders", "", 1)
	for _, tc := range []struct {
		name string
		req  Request
		want error
	}{
		{"unknown topic", Request{Group: "g", Topic: "nope"}, core.ErrTopicNotFound},
		{"invalid topic", Request{Group: "g", Topic: "a b"}, core.ErrTopicNotFound},
		{"empty group", Request{Topic: "orders"}, retry.ErrInvalidGroup},
		{"bad group", Request{Group: "g/1", Topic: "orders"}, retry.ErrInvalidGroup},
		{"invisible too short", Request{Group: "g", Topic: "orders", Invisible: time.Millisecond}, ErrInvisibleTime},
		{"invisible too long", Request{Group: "g", Topic: "orders", Invisible: 12*time.Hour + 1}, ErrInvisibleTime},
		{"negative invisible", Request{Group: "g", Topic: "orders", Invisible: -time.Second}, ErrInvisibleTime},
		{"negative max", Request{Group: "g", Topic: "orders", Max: -1}, ErrInvalidRequest},
		{"negative wait", Request{Group: "g", Topic: "orders", Wait: -1}, ErrInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := e.s.Pop(t.Context(), tc.req)
			require.ErrorIs(t, err, tc.want)
			require.Empty(t, got)
		})
	}
	// The defaults stay RocketMQ's.
	d := Options{}.withDefaults()
	require.Equal(t, []time.Duration{60 * time.Second, 10 * time.Second, 12 * time.Hour},
		[]time.Duration{d.DefaultInvisible, d.MinInvisible, d.MaxInvisible})
	_, err := New(e.b, e.r, Options{}) // with the real bounds, 50 ms is refused
	require.NoError(t, err)
}

func TestNewRefusesBadOptions(t *testing.T) {
	e := newEnv(t, "", fastRetry, fastPop)
	for _, tc := range []struct {
		name string
		opts Options
		want []string
	}{
		{"bounds", Options{MinInvisible: time.Minute, MaxInvisible: time.Second}, []string{"bounds", "default invisible"}},
		{"every problem", Options{MaxPop: 2000, MaxInflight: -1, RetryInterval: -1}, []string{"max pop 2000", "max inflight -1", "retry interval"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(e.b, e.r, tc.opts)
			require.ErrorIs(t, err, ErrBadOptions)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
	_, err := New(nil, e.r, Options{})
	require.ErrorIs(t, err, ErrBadOptions)
	_, err = New(e.b, nil, Options{})
	require.ErrorIs(t, err, ErrBadOptions)
}

func TestHungConsumerDoesNotStrandQueue(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, "", fastRetry, fastPop)
	e.createTopic(t, "orders", 4)
	sent := e.produce(t, "orders", "dev-1", 5)
	q := sent[0].Queue

	hung := pop1(t, e.s, Request{Group: "g", Topic: "orders", Max: 1, Invisible: time.Minute})
	require.Equal(t, int64(0), hung.Message.QueueOffset)

	got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "orders", Max: 10})
	require.NoError(t, err)
	require.Len(t, got, 4, "the other popper gets the queue's later messages")
	for i, p := range got {
		require.Equal(t, q, p.Message.Queue)
		require.Equal(t, int64(i+1), p.Message.QueueOffset)
		require.NoError(t, e.s.Ack(ctx, p.Handle))
	}
	require.Equal(t, int64(0), e.committed(t, "g", "orders", q), "the watermark waits for the hung message")
	require.NoError(t, e.s.Ack(ctx, hung.Handle))
	require.Equal(t, int64(5), e.committed(t, "g", "orders", q))
}

func TestLongPoll(t *testing.T) {
	e := newEnv(t, "", fastRetry, fastPop)
	e.createTopic(t, "orders", 2)

	t.Run("returns when a message arrives", func(t *testing.T) {
		const wait = 20 * time.Second
		type result struct {
			got     []Popped
			err     error
			elapsed time.Duration
		}
		done := make(chan result, 1)
		go func() {
			start := time.Now()
			got, err := e.s.Pop(context.Background(), Request{Group: "g", Topic: "orders", Wait: wait})
			done <- result{got, err, time.Since(start)}
		}()
		require.Eventually(t, func() bool { return e.s.waiting.Load() == 1 }, waitFor, time.Millisecond)
		e.produce(t, "orders", "", 1)
		r := <-done
		require.NoError(t, r.err)
		require.Len(t, r.got, 1)
		require.Less(t, r.elapsed, wait/2, "returned well before the deadline")
		t.Logf("long poll returned after %v", r.elapsed)
		require.NoError(t, e.s.Ack(t.Context(), r.got[0].Handle))
	})
	t.Run("times out empty", func(t *testing.T) {
		start := time.Now()
		got, err := e.s.Pop(t.Context(), Request{Group: "g", Topic: "orders", Wait: 30 * time.Millisecond})
		require.NoError(t, err)
		require.Empty(t, got)
		require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	})
	t.Run("ends with the context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			_, err := e.s.Pop(ctx, Request{Group: "g", Topic: "orders", Wait: time.Hour})
			done <- err
		}()
		require.Eventually(t, func() bool { return e.s.waiting.Load() == 1 }, waitFor, time.Millisecond)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
	t.Run("ends with Close", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			_, err := e.s.Pop(context.Background(), Request{Group: "g", Topic: "orders", Wait: time.Hour})
			done <- err
		}()
		require.Eventually(t, func() bool { return e.s.waiting.Load() == 1 }, waitFor, time.Millisecond)
		require.NoError(t, e.s.Close())
		require.ErrorIs(t, <-done, core.ErrClosed)
		_, err := e.s.Pop(t.Context(), Request{Group: "g", Topic: "orders"})
		require.ErrorIs(t, err, core.ErrClosed)
		require.NoError(t, e.s.Close())
	})
}

func TestConcurrentPoppersGetEachMessageOnce(t *testing.T) {
	const total, poppers = 2000, 4
	e := newEnv(t, "", fastRetry, fastPop)
	e.createTopic(t, "orders", 8)
	for i := 0; i < total; i += 500 {
		e.produce(t, "orders", "", 500)
	}

	var mu sync.Mutex
	seen := map[core.MessageID]int{}
	var acked atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, poppers)
	for range poppers {
		wg.Go(func() {
			for acked.Load() < total && ctx.Err() == nil {
				got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "orders", Max: 32, Invisible: time.Minute, Wait: 20 * time.Millisecond})
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				for _, p := range got {
					mu.Lock()
					seen[p.Message.ID]++
					mu.Unlock()
					if err := e.s.Ack(ctx, p.Handle); err != nil {
						errs <- err
						return
					}
					acked.Add(1)
				}
			}
		})
	}
	require.Eventually(t, func() bool { return acked.Load() >= total || len(errs) > 0 }, 20*time.Second, 5*time.Millisecond)
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, seen, total)
	for id, n := range seen {
		require.Equal(t, 1, n, "message %s delivered %d times", id, n)
	}
	info, err := e.b.Topic(t.Context(), "orders")
	require.NoError(t, err)
	for q, r := range info.Ranges {
		require.Equal(t, r.Max, e.committed(t, "g", "orders", q), "queue %d", q)
	}
}

func TestRestartDeliversUnackedAgain(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, "", fastRetry, fastPop)
	e.createTopic(t, "orders", 1)
	e.produce(t, "orders", "", 3)
	got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "orders", Invisible: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.NoError(t, e.s.Ack(ctx, got[0].Handle))
	require.NoError(t, e.s.Ack(ctx, got[2].Handle)) // out of order: the watermark stays at 1
	require.Equal(t, int64(1), e.committed(t, "g", "orders", 0))
	e.close(t)

	e = newEnv(t, e.dir, fastRetry, fastPop)
	require.ErrorIs(t, e.s.Ack(ctx, got[1].Handle), ErrInvalidHandle, "handles do not survive a restart")
	again, err := e.s.Pop(ctx, Request{Group: "g", Topic: "orders", Invisible: time.Minute})
	require.NoError(t, err)
	var offs []int64
	for _, p := range again {
		offs = append(offs, p.Message.QueueOffset)
		require.Equal(t, 1, p.Attempt)
		require.NoError(t, e.s.Ack(ctx, p.Handle))
	}
	require.Equal(t, []int64{1, 2}, offs, "everything from the watermark on comes again")
	require.Equal(t, int64(3), e.committed(t, "g", "orders", 0))
}

func TestTagFilter(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, "", fastRetry, fastPop)
	e.createTopic(t, "orders", 1)
	e.produce(t, "orders", "", 10) // tags t0, t1, t0, …
	got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "orders", Tags: []string{"t1"}})
	require.NoError(t, err)
	require.Len(t, got, 5)
	for _, p := range got {
		require.Equal(t, "t1", p.Message.Tag)
		require.NoError(t, e.s.Ack(ctx, p.Handle))
	}
	require.Equal(t, int64(10), e.committed(t, "g", "orders", 0), "filtered-out messages count as done")
}

func TestMaxInflightBoundsAQueue(t *testing.T) {
	ctx := t.Context()
	opts := fastPop
	opts.MaxInflight = 4
	e := newEnv(t, "", fastRetry, opts)
	e.createTopic(t, "orders", 1)
	e.produce(t, "orders", "", 10)
	got, err := e.s.Pop(ctx, Request{Group: "g", Topic: "orders", Invisible: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 4)
	more, err := e.s.Pop(ctx, Request{Group: "g", Topic: "orders", Invisible: time.Minute})
	require.NoError(t, err)
	require.Empty(t, more)
	require.NoError(t, e.s.Ack(ctx, got[1].Handle))
	more, err = e.s.Pop(ctx, Request{Group: "g", Topic: "orders", Invisible: time.Minute})
	require.NoError(t, err)
	require.Empty(t, more, "the bound spans from the oldest message not done")
	require.NoError(t, e.s.Ack(ctx, got[0].Handle))
	more, err = e.s.Pop(ctx, Request{Group: "g", Topic: "orders", Invisible: time.Minute})
	require.NoError(t, err)
	require.Len(t, more, 2)
	require.Equal(t, int64(4), more[0].Message.QueueOffset)
}
