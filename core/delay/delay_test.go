package delay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
)

func TestMain(m *testing.M) {
	if runKillChild() {
		return
	}
	goleak.VerifyTestMain(m)
}

const waitFor = 20 * time.Second

// env is a store and a delay service on one folder.
type env struct {
	dir   string
	st    *store.Store
	svc   *Service
	b     core.Broker // the service's broker
	clock Clock
}

// open opens the store in dir and a started service over it, both closed at
// the end of the test (or by env.close).
func open(t testing.TB, dir string, clock Clock, opts Options) *env {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	if clock == nil {
		clock = SystemClock{}
	}
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{Now: clock.Now, DefaultQueues: 4})
	require.NoError(t, err)
	opts.Clock = clock
	if opts.PollInterval == 0 {
		opts.PollInterval = 20 * time.Millisecond
	}
	svc, err := New(st, filepath.Join(dir, "delay"), opts)
	if err != nil {
		_ = st.Close()
		require.NoError(t, err)
	}
	svc.Start()
	e := &env{dir: dir, st: st, svc: svc, b: svc.Broker(), clock: clock}
	t.Cleanup(e.close)
	return e
}

func (e *env) close() {
	if e.svc != nil {
		_ = e.svc.Close()
		e.svc = nil
	}
	if e.st != nil {
		_ = e.st.Close()
		e.st = nil
	}
}

// readAll reads every message of topic, queue by queue.
func readAll(t testing.TB, b core.Broker, topic string) [][]*core.StoredMessage {
	t.Helper()
	info, err := b.Topic(context.Background(), topic)
	if err != nil {
		return nil
	}
	out := make([][]*core.StoredMessage, info.Queues)
	for q := range info.Queues {
		var off int64
		for {
			res, err := b.Read(context.Background(), core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 256})
			require.NoError(t, err)
			out[q] = append(out[q], res.Messages...)
			if res.NextOffset == off {
				break
			}
			off = res.NextOffset
		}
	}
	return out
}

func count(qs [][]*core.StoredMessage) int {
	n := 0
	for _, q := range qs {
		n += len(q)
	}
	return n
}

// TestThousandRandomDelaysCompressedClock schedules 1,000 messages with
// random delays of 20 s to 2.5 min on a clock running 20 times faster than the
// wall clock: none is stored in its topic before its due time (the store
// uses the same clock), all arrive, and each queue gets them in due order
// (within the documented precision).
func TestThousandRandomDelaysCompressedClock(t *testing.T) {
	origin := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const factor = 20
	clock := NewScaledClock(origin, factor)
	e := open(t, "", clock, Options{})
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 1000
	due := map[string]time.Time{}
	for i := 0; i < n; i += 100 {
		var msgs []*core.Message
		now := clock.Now()
		for j := i; j < i+100; j++ {
			at := now.Add(20*time.Second + time.Duration(rng.Int64N(int64(130*time.Second))))
			body := strconv.Itoa(j)
			due[body] = at
			msgs = append(msgs, &core.Message{Topic: "orders", ShardingKey: "dev-" + strconv.Itoa(j%10), Body: []byte(body), DeliverAt: at})
		}
		res, err := e.b.ProduceBatch(ctx, msgs)
		require.NoError(t, err)
		for _, r := range res {
			require.Equal(t, "orders", r.Topic)
			require.Equal(t, -1, r.Queue)
		}
	}
	if time.Since(clock.Start) < 900*time.Millisecond { // 18 s of clock time: nothing can be due yet
		require.Zero(t, count(readAll(t, e.st, "orders")))
	}

	var got [][]*core.StoredMessage
	require.Eventually(t, func() bool {
		got = readAll(t, e.st, "orders")
		return count(got) >= n
	}, 60*time.Second, 50*time.Millisecond)
	require.Equal(t, n, count(got), "each message exactly once")

	// The precision: a tick, plus the time storing takes, which the
	// compressed clock multiplies — 200 ms of real time (a loaded CI
	// machine) is 4 s here.
	const precision = time.Second + factor*200*time.Millisecond
	seen := map[string]bool{}
	for q, msgs := range got {
		var last time.Time
		for _, m := range msgs {
			body := string(m.Body)
			require.False(t, seen[body], "duplicate %s", body)
			seen[body] = true
			require.False(t, m.StoredAt.Before(due[body]), "message %s stored at %s before its due time %s", body, m.StoredAt, due[body])
			require.True(t, m.DeliverAt.Equal(due[body]))
			require.Equal(t, q, core.QueueFor(m.ShardingKey, len(got)), "delivered to its key's queue")
			require.NotEmpty(t, m.Properties[PropID])
			require.NotContains(t, m.Properties, PropTopic)
			require.False(t, due[body].Before(last.Add(-precision)), "queue %d: %s due %s after one due %s", q, body, due[body], last)
			if due[body].After(last) {
				last = due[body]
			}
		}
	}
	st, err := e.svc.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, n, st.Scheduled)
	require.EqualValues(t, n, st.Delivered)
	require.Positive(t, st.Moved, "messages moved through levels")
}

func TestRouteFitsTheTimeLeft(t *testing.T) {
	e := open(t, "", nil, Options{})
	now := time.Now()
	for _, left := range []time.Duration{-time.Second, 0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond,
		3 * time.Second, 100 * time.Second, 40 * 24 * time.Hour} {
		level, exit, deliver := e.svc.route(now.Add(left), now)
		switch {
		case left <= 0:
			require.True(t, deliver, "left %v", left)
		case left < time.Second:
			require.Equal(t, 0, level)
			require.True(t, exit.Equal(now.Add(left)))
		default:
			require.False(t, deliver)
			hold := e.svc.holds[level]
			require.LessOrEqual(t, hold, left, "left %v", left)
			if level < len(e.svc.holds)-1 {
				require.Greater(t, 2*hold, left, "left %v: the largest level that fits", left)
			}
			require.True(t, exit.Equal(now.Add(hold)))
		}
	}
	require.Equal(t, DefaultMaxHold, e.svc.holds[len(e.svc.holds)-1])
	require.Len(t, e.svc.Levels(), 18)
}

func TestBadDelaysAreRefused(t *testing.T) {
	e := open(t, "", nil, Options{})
	ctx := t.Context()
	now := time.Now()
	_, err := e.b.Produce(ctx, &core.Message{Topic: "t", Body: []byte("x"), DeliverAt: now.Add(41 * 24 * time.Hour)})
	require.ErrorIs(t, err, ErrDelayTooLong)
	require.Contains(t, err.Error(), "the most is 960h0m0s")
	_, err = e.b.Produce(ctx, &core.Message{Topic: "t", Body: []byte("x"), DeliverAt: now.Add(-time.Hour)})
	require.ErrorIs(t, err, ErrDeliverAtPast)
	_, err = e.b.Produce(ctx, &core.Message{Topic: "bad topic", Body: []byte("x"), DeliverAt: now.Add(time.Hour)})
	require.ErrorIs(t, err, core.ErrInvalidTopic)
	// A refused message fails the whole batch: nothing of it is stored.
	_, err = e.b.ProduceBatch(ctx, []*core.Message{{Topic: "t", Body: []byte("ok")}, {Topic: "t", DeliverAt: now.Add(50 * 24 * time.Hour)}})
	require.ErrorIs(t, err, ErrDelayTooLong)
	require.Zero(t, count(readAll(t, e.st, "t")))

	// Slightly in the past (clock skew): delivered at once.
	res, err := e.b.Produce(ctx, &core.Message{Topic: "t", Body: []byte("now"), DeliverAt: now.Add(-10 * time.Second)})
	require.NoError(t, err)
	require.GreaterOrEqual(t, res.Queue, 0)
	require.Equal(t, 1, count(readAll(t, e.st, "t")))
}

func TestAutoCreateOff(t *testing.T) {
	e := open(t, "", nil, Options{DisableAutoCreate: true})
	_, err := e.b.Produce(t.Context(), &core.Message{Topic: "nope", DeliverAt: time.Now().Add(time.Hour)})
	require.ErrorIs(t, err, core.ErrTopicNotFound)
}

func TestFortyDaysAcceptedAndListed(t *testing.T) {
	e := open(t, "", nil, Options{})
	ctx := t.Context()
	at := time.Now().Add(40*24*time.Hour - time.Minute)
	res, err := e.b.Produce(ctx, &core.Message{Topic: "reminders", ShardingKey: "car-42", Body: []byte("service due"), DeliverAt: at})
	require.NoError(t, err)
	soon, err := e.b.Produce(ctx, &core.Message{Topic: "other", Body: []byte("soon"), DeliverAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)

	l, err := e.svc.List(ctx, ListRequest{})
	require.NoError(t, err)
	require.True(t, l.Done)
	require.Len(t, l.Pending, 2)
	SortByDue(l.Pending)
	require.Equal(t, soon.ID, l.Pending[0].ID)
	p := l.Pending[1]
	require.Equal(t, res.ID, p.ID)
	require.Equal(t, "reminders", p.Topic)
	require.True(t, p.Due.Equal(at))
	require.Equal(t, len(e.svc.holds)-1, p.Level, "the coarsest level")
	require.Equal(t, "car-42", p.Copy.Properties[PropShardingKey])

	l, err = e.svc.List(ctx, ListRequest{Topic: "reminders"})
	require.NoError(t, err)
	require.Len(t, l.Pending, 1)
	// Paging: one at a time.
	l, err = e.svc.List(ctx, ListRequest{Max: 1})
	require.NoError(t, err)
	require.Len(t, l.Pending, 1)
	require.False(t, l.Done)
	l2, err := e.svc.List(ctx, ListRequest{Max: 1, Cursor: l.Next})
	require.NoError(t, err)
	require.Len(t, l2.Pending, 1)
	require.NotEqual(t, l.Pending[0].ID, l2.Pending[0].ID)

	got, err := e.svc.Lookup(ctx, res.ID)
	require.NoError(t, err)
	require.True(t, got.Due.Equal(at))
}

// stoppedClock stands still until the test moves it: while it shows a time
// before a message's due time, the message cannot be due, however long the
// service runs.
type stoppedClock struct{ now atomic.Int64 }

func (c *stoppedClock) Now() time.Time                  { return time.Unix(0, c.now.Load()).UTC() }
func (c *stoppedClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }
func (c *stoppedClock) set(t time.Time)                 { c.now.Store(t.UnixNano()) }

// stored is how many messages topic holds (none are removed here).
func stored(t testing.TB, b core.Broker, topic string) int64 {
	info, err := b.Topic(t.Context(), topic)
	if err != nil {
		return 0
	}
	var n int64
	for _, r := range info.Ranges {
		n += r.Max
	}
	return n
}

// levelsDone reports whether every level has moved on all it holds.
func levelsDone(t testing.TB, b core.Broker) bool {
	info, err := b.Topic(t.Context(), DelayTopic)
	if err != nil {
		return false
	}
	for q, r := range info.Ranges {
		if r.Max == 0 {
			continue
		}
		off, err := b.CommittedOffset(t.Context(), DelayGroup, DelayTopic, q)
		if err != nil || off != r.Max {
			return false
		}
	}
	return true
}

// The longest delay, 40 days, is longer than the coarsest level's hold
// (DefaultMaxHold, 18 h 12 min): its copy goes round that level about forty
// times, then down the finer levels. The clock stands still and jumps 6 h
// at a time, the service catching up after each jump: the message is never
// in its topic while the clock shows a time before its due time (down to
// 1 ns before), arrives once the clock shows it, exactly once, and nothing
// more comes after further jumps.
func TestFortyDaysDeliveredOnceAfterManyLaps(t *testing.T) {
	clock := &stoppedClock{}
	clock.set(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	e := open(t, "", clock, Options{})
	ctx := t.Context()
	coarsest := len(e.svc.Levels()) - 1
	require.Equal(t, DefaultMaxHold, e.svc.Levels()[coarsest])
	due := clock.Now().Add(DefaultMaxDelay)
	res, err := e.b.Produce(ctx, &core.Message{Topic: "reminders", ShardingKey: "car-42", Body: []byte("service due"), DeliverAt: due})
	require.NoError(t, err)
	require.Equal(t, -1, res.Queue, "delayed, not stored in its topic")

	const step = 6 * time.Hour
	copies := map[core.MessageID]int{} // every copy seen → its level
	// waiting checks the message is still waiting, not delivered, and that
	// its newest copy comes out after the clock's time: the service has
	// moved on whatever the last jump made come out.
	waiting := func() {
		t.Helper()
		var p Pending
		early := false
		require.Eventually(t, func() bool {
			if stored(t, e.st, "reminders") > 0 {
				early = true
				return true
			}
			var err error
			p, err = e.svc.Lookup(ctx, res.ID)
			return err == nil && p.Exit.After(clock.Now())
		}, waitFor, time.Millisecond, "the copy that came out was not moved on (clock %v)", clock.Now())
		require.False(t, early, "delivered %v early", due.Sub(clock.Now()))
		require.True(t, p.Due.Equal(due))
		require.False(t, p.Exit.After(due), "a copy never comes out after the due time")
		copies[p.Copy.ID] = p.Level
	}
	for due.Sub(clock.Now()) > step {
		waiting()
		clock.set(clock.Now().Add(step))
	}
	// The last hops: level 1 (1.5 s left) comes out half a second before the
	// due time, level 0 holds the last nanosecond.
	for _, before := range []time.Duration{time.Hour, 1500 * time.Millisecond, time.Nanosecond} {
		waiting()
		clock.set(due.Add(-before))
	}
	waiting()
	clock.set(due)

	var got []*core.StoredMessage
	require.Eventually(t, func() bool {
		got = slices.Concat(readAll(t, e.st, "reminders")...)
		return len(got) > 0
	}, waitFor, time.Millisecond, "not delivered once due")
	require.Eventually(t, func() bool { return levelsDone(t, e.st) }, waitFor, time.Millisecond)
	for range 3 { // later jumps bring nothing more
		clock.set(clock.Now().Add(DefaultMaxHold))
		require.Eventually(t, func() bool { return levelsDone(t, e.st) }, waitFor, time.Millisecond)
	}
	got = slices.Concat(readAll(t, e.st, "reminders")...)
	require.Len(t, got, 1, "delivered exactly once")
	m := got[0]
	require.Equal(t, "service due", string(m.Body))
	require.Equal(t, "car-42", m.ShardingKey)
	require.True(t, m.DeliverAt.Equal(due))
	require.True(t, m.StoredAt.Equal(due), "stored when the clock showed the due time, %v", m.StoredAt)
	require.Equal(t, res.ID.String(), m.Properties[PropID])
	_, err = e.svc.Lookup(ctx, res.ID)
	require.ErrorIs(t, err, ErrAlreadyDue)

	laps := 0
	for _, level := range copies {
		if level == coarsest {
			laps++
		}
	}
	t.Logf("%d copies, %d of them in the coarsest level", len(copies), laps)
	// A lap of the coarsest level lasts its hold plus at most one step.
	require.GreaterOrEqual(t, laps, int(DefaultMaxDelay/(DefaultMaxHold+step)), "the multi-lap path")
	st, err := e.svc.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Scheduled: 1, Delivered: 1, Moved: int64(len(copies) - 1), Waiting: make([]int64, coarsest+1)}, st)
}

func TestCancel(t *testing.T) {
	origin := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := NewScaledClock(origin, 50)
	dir := t.TempDir()
	e := open(t, dir, clock, Options{})
	ctx := t.Context()
	keep, err := e.b.Produce(ctx, &core.Message{Topic: "t", Body: []byte("keep"), DeliverAt: clock.Now().Add(30 * time.Second)})
	require.NoError(t, err)
	drop, err := e.b.Produce(ctx, &core.Message{Topic: "t", Body: []byte("drop"), DeliverAt: clock.Now().Add(40 * time.Second)})
	require.NoError(t, err)
	plain, err := e.b.Produce(ctx, &core.Message{Topic: "t", Body: []byte("plain")})
	require.NoError(t, err)

	p, err := e.svc.Cancel(ctx, drop.ID)
	require.NoError(t, err)
	require.True(t, p.Cancelled)
	_, err = e.svc.Cancel(ctx, drop.ID)
	require.ErrorIs(t, err, ErrAlreadyCancelled)
	_, err = e.svc.Cancel(ctx, plain.ID)
	require.ErrorIs(t, err, ErrNotDelayed)
	unknown := core.NewCommitLogID(plain.ID.StoreID(), 1<<40, 100)
	_, err = e.svc.Cancel(ctx, unknown)
	require.ErrorIs(t, err, core.ErrMessageNotFound)
	l, err := e.svc.List(ctx, ListRequest{})
	require.NoError(t, err)
	require.Len(t, l.Pending, 1, "a cancelled message is not listed")

	// "keep" arrives (30 s at 50× ≈ 0.6 s), "drop" never does.
	require.Eventually(t, func() bool { return count(readAll(t, e.st, "t")) == 2 }, waitFor, 10*time.Millisecond)
	var delivered *core.StoredMessage
	for _, q := range readAll(t, e.st, "t") {
		for _, m := range q {
			if string(m.Body) == "keep" {
				delivered = m
			}
		}
	}
	require.NotNil(t, delivered)
	// Cancel after delivery, by the producer's ID or the delivered one.
	_, err = e.svc.Cancel(ctx, keep.ID)
	require.ErrorIs(t, err, ErrAlreadyDue)
	_, err = e.svc.Cancel(ctx, delivered.ID)
	require.ErrorIs(t, err, ErrAlreadyDue)
	// Well past "drop"'s due time (40 s ≈ 0.8 s real), it is still absent.
	require.Eventually(t, func() bool {
		st, err := e.svc.Stats(ctx)
		return err == nil && st.Dropped >= 1
	}, waitFor, 10*time.Millisecond)
	require.Equal(t, 2, count(readAll(t, e.st, "t")))
}

// TestCancelSurvivesRestart cancels, restarts store and service, and lets
// the due time pass: the cancellation holds.
func TestCancelSurvivesRestart(t *testing.T) {
	origin := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := NewScaledClock(origin, 20)
	dir := t.TempDir()
	e := open(t, dir, clock, Options{})
	ctx := t.Context()
	var ids []core.MessageID
	for i := range 4 {
		res, err := e.b.Produce(ctx, &core.Message{Topic: "t", Body: []byte(strconv.Itoa(i)), DeliverAt: clock.Now().Add(20 * time.Second)})
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	_, err := e.svc.Cancel(ctx, ids[1])
	require.NoError(t, err)
	_, err = e.svc.Cancel(ctx, ids[3])
	require.NoError(t, err)
	e.close()

	e = open(t, dir, clock, Options{})
	_, err = e.svc.Cancel(ctx, ids[1])
	require.ErrorIs(t, err, ErrAlreadyCancelled)
	require.Eventually(t, func() bool { return count(readAll(t, e.st, "t")) >= 2 }, waitFor, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		st, err := e.svc.Stats(ctx)
		return err == nil && st.Dropped >= 2
	}, waitFor, 10*time.Millisecond)
	var bodies []string
	for _, q := range readAll(t, e.st, "t") {
		for _, m := range q {
			bodies = append(bodies, string(m.Body))
		}
	}
	sort.Strings(bodies)
	require.Equal(t, []string{"0", "2"}, bodies)
}

// TestLookupFindsLaterCopies: once a message moved to a later level, Lookup
// by the producer's ID (and by a copy's ID) finds the newest copy.
func TestLookupFindsLaterCopies(t *testing.T) {
	origin := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	// 50×: the later copies wait 6 s (120 ms real) before delivery, after
	// which Lookup reports the message delivered (ErrAlreadyDue).
	e2 := open(t, "", NewScaledClock(origin, 50), Options{})
	ctx := t.Context()
	// 70 s: 64 s in level 7, then 4 s, then 2 s.
	res2, err := e2.b.Produce(ctx, &core.Message{Topic: "t", Keys: []string{"order-2"}, Body: []byte("y"), DeliverAt: e2.clock.Now().Add(70 * time.Second)})
	require.NoError(t, err)
	first, err := e2.svc.Lookup(ctx, res2.ID)
	require.NoError(t, err)
	require.Equal(t, res2.ID, first.Copy.ID)
	require.Equal(t, 7, first.Level)
	var p Pending
	require.Eventually(t, func() bool {
		p, err = e2.svc.Lookup(ctx, res2.ID)
		return err == nil && p.Copy.ID != res2.ID
	}, waitFor, 5*time.Millisecond, "the message moved to a later level")
	require.Equal(t, res2.ID, p.ID)
	require.Equal(t, res2.ID.String(), p.Copy.Properties[PropID])
	require.Contains(t, p.Copy.Keys, "order-2")
	byCopy, err := e2.svc.Lookup(ctx, p.Copy.ID)
	if err == nil {
		require.Equal(t, res2.ID, byCopy.ID)
	}
	// And it is delivered with its keys as produced.
	var got []*core.StoredMessage
	require.Eventually(t, func() bool {
		qs := readAll(t, e2.st, "t")
		got = nil
		for _, q := range qs {
			got = append(got, q...)
		}
		return len(got) == 1
	}, waitFor, 5*time.Millisecond)
	require.Equal(t, []string{"order-2"}, got[0].Keys)
	require.Equal(t, res2.ID.String(), got[0].Properties[PropID])
	found, err := e2.st.FindByKey(ctx, "t", "order-2", core.KeyQuery{})
	require.NoError(t, err)
	require.Len(t, found, 1)
	// Its copies stay stored, but it is no longer pending.
	require.Eventually(t, func() bool {
		_, err := e2.svc.Lookup(ctx, res2.ID)
		return errors.Is(err, ErrAlreadyDue)
	}, waitFor, 5*time.Millisecond, "a delivered message is not found as pending")
}

func TestOptionsValidate(t *testing.T) {
	st, err := store.Open(t.TempDir(), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	_, err = New(st, t.TempDir(), Options{Tick: time.Microsecond, BatchSize: -1, MaxHold: time.Nanosecond})
	require.ErrorIs(t, err, ErrBadOptions)
	require.Contains(t, err.Error(), "tick")
	require.Contains(t, err.Error(), "batch size")
	// The level count is fixed by the topic: another MaxHold is refused.
	s, err := New(st, t.TempDir(), Options{})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_, err = New(st, t.TempDir(), Options{MaxHold: time.Hour})
	require.ErrorIs(t, err, core.ErrTopicExists)
}

func TestCloseIsIdempotent(t *testing.T) {
	e := open(t, "", nil, Options{})
	require.NoError(t, e.svc.Close())
	require.NoError(t, e.svc.Close())
	e.svc.Start() // after Close: starts nothing (goleak would tell)
}

func ExampleService_Broker() {
	dir, _ := os.MkdirTemp("", "delay-example")
	defer os.RemoveAll(dir)
	st, _ := store.Open(filepath.Join(dir, "store"), store.Options{})
	defer st.Close()
	svc, _ := New(st, filepath.Join(dir, "delay"), Options{})
	svc.Start()
	defer svc.Close()
	res, err := svc.Broker().Produce(context.Background(), &core.Message{
		Topic: "reminders", Body: []byte("check tyres"), DeliverAt: time.Now().Add(30 * 24 * time.Hour),
	})
	fmt.Println(res.Topic, res.Queue, err)
	// Output: reminders -1 <nil>
}

// A traced delayed message's "stored" hop is recorded when it is delivered,
// under the ID its producer got.
func TestTraceDelivered(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	rec, err := trace.New(st, trace.Options{Topics: []string{"t"}})
	require.NoError(t, err)
	rec.Start()
	svc, err := New(st, filepath.Join(dir, "delay"), Options{PollInterval: 10 * time.Millisecond, Trace: rec})
	require.NoError(t, err)
	svc.Start()
	res, err := svc.Broker().Produce(t.Context(), &core.Message{Topic: "t", Body: []byte("x"), DeliverAt: time.Now().Add(300 * time.Millisecond)})
	require.NoError(t, err)
	untraced, err := svc.Broker().Produce(t.Context(), &core.Message{Topic: "u", Body: []byte("y"), DeliverAt: time.Now().Add(300 * time.Millisecond)})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := svc.Stats(t.Context())
		return err == nil && st.Delivered == 2
	}, waitFor, 10*time.Millisecond)
	require.NoError(t, svc.Close())
	require.NoError(t, rec.Close())
	hops, err := trace.Lookup(t.Context(), st, res.ID, 0)
	require.NoError(t, err)
	require.Len(t, hops, 1)
	require.Equal(t, trace.HopStored, hops[0].Hop)
	require.Equal(t, "t", hops[0].Attrs["topic"])
	hops, err = trace.Lookup(t.Context(), st, untraced.ID, 0)
	require.NoError(t, err)
	require.Empty(t, hops)
}

// Overdue reports how late the next copy to move on is: nothing while the
// service keeps up, minutes while no service runs past a due time, nothing
// again once one delivers it.
func TestOverdue(t *testing.T) {
	clock := &stoppedClock{}
	start := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	clock.set(start)
	dir := t.TempDir()
	e := open(t, dir, clock, Options{})
	ctx := t.Context()
	_, err := e.b.Produce(ctx, &core.Message{Topic: "t", Body: []byte("x"), DeliverAt: start.Add(time.Minute)})
	require.NoError(t, err)
	late, err := e.svc.Overdue(ctx)
	require.NoError(t, err)
	require.Zero(t, late)

	require.NoError(t, e.svc.Close())
	e.svc = nil
	svc, err := New(e.st, filepath.Join(dir, "delay"), Options{Clock: clock, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	defer svc.Close()
	clock.set(start.Add(10 * time.Minute))
	late, err = svc.Overdue(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, late, 9*time.Minute, "due at +1m, nobody moved it, the clock at +10m")

	svc.Start()
	require.Eventually(t, func() bool {
		late, err := svc.Overdue(ctx)
		return err == nil && late == 0
	}, 10*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 1, stored(t, e.st, "t"))
}
