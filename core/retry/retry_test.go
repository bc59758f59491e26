package retry

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every require.Eventually of these tests.
const waitFor = 10 * time.Second

// openStore opens a store in dir (a fresh temp dir if empty) and closes it
// at the end of the test.
func openStore(t testing.TB, dir string) *store.Store {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s, err := store.Open(dir, store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newService creates a Service (started if start is set) and closes it at
// the end of the test. PollInterval defaults to an hour here, so that a
// scheduler that missed an arrival would make the test time out.
func newService(t testing.TB, b core.Broker, opts Options, start bool) *Service {
	t.Helper()
	if opts.PollInterval == 0 {
		opts.PollInterval = time.Hour
	}
	s, err := New(b, opts)
	require.NoError(t, err)
	if start {
		s.Start()
	}
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// readQueue reads a whole queue.
func readQueue(t testing.TB, b core.Broker, topic string, queue int) []*core.StoredMessage {
	t.Helper()
	var out []*core.StoredMessage
	var off int64
	for {
		res, err := b.Read(context.Background(), core.ReadRequest{Topic: topic, Queue: queue, Offset: off, MaxCount: 256})
		require.NoError(t, err)
		out = append(out, res.Messages...)
		if res.NextOffset == off {
			return out
		}
		off = res.NextOffset
	}
}

// waitQueue waits until topic/queue holds at least n messages and returns them.
func waitQueue(t testing.TB, b core.Broker, topic string, queue, n int) []*core.StoredMessage {
	t.Helper()
	var got []*core.StoredMessage
	require.Eventually(t, func() bool {
		if _, err := b.Topic(context.Background(), topic); err != nil {
			return false
		}
		got = readQueue(t, b, topic, queue)
		return len(got) >= n
	}, waitFor, 2*time.Millisecond, "waiting for %d messages in %s/%d", n, topic, queue)
	return got
}

// produceOne stores a message with every field set and returns it as stored.
func produceOne(t testing.TB, b core.Broker, topic, key string, i int) *core.StoredMessage {
	t.Helper()
	r, err := b.Produce(context.Background(), &core.Message{
		Topic:       topic,
		ShardingKey: key,
		Tag:         "tag-a",
		Keys:        []string{fmt.Sprintf("order-%d", i)},
		Properties:  map[string]string{"app.i": fmt.Sprint(i)},
		Body:        []byte(fmt.Sprintf("body-%d", i)),
	})
	require.NoError(t, err)
	m, err := b.Get(context.Background(), r.ID)
	require.NoError(t, err)
	return m
}

// schedulerDone reports whether every level has delivered all it holds.
func schedulerDone(t testing.TB, b core.Broker) bool {
	t.Helper()
	info, err := b.Topic(context.Background(), ScheduleTopic)
	require.NoError(t, err)
	for q, r := range info.Ranges {
		if r.Max == 0 {
			continue
		}
		off, err := b.CommittedOffset(context.Background(), SchedulerGroup, ScheduleTopic, q)
		if err != nil || off != r.Max {
			return false
		}
	}
	return true
}

func TestRedeliveryScheduleDeadLetterAndRedrive(t *testing.T) {
	ctx := t.Context()
	const group = "billing"
	schedule := []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond}
	b := openStore(t, "")
	s := newService(t, b, Options{Schedule: schedule, MaxAttempts: 3}, true)

	orig := produceOne(t, b, "orders", "dev-1", 7)
	m := orig
	var gaps []time.Duration
	for attempt := 1; attempt <= 3; attempt++ {
		sentAt := time.Now()
		out, err := s.SendBack(ctx, group, m, fmt.Sprintf("boom %d", attempt))
		require.NoError(t, err)
		require.Equal(t, Scheduled, out)

		got := waitQueue(t, b, RetryTopic(group), 0, attempt)
		require.Len(t, got, attempt, "exactly one redelivery per send-back")
		m = got[attempt-1]
		gap := m.StoredAt.Sub(sentAt)
		gaps = append(gaps, gap)
		require.GreaterOrEqual(t, gap, schedule[attempt-1], "redelivery %d came before its delay", attempt)
		require.Equal(t, attempt, m.ReconsumeCount)
		require.Equal(t, RetryTopic(group), m.Topic)
		require.Equal(t, orig.ShardingKey, m.ShardingKey)
		require.Equal(t, orig.Tag, m.Tag)
		require.Equal(t, orig.Keys, m.Keys)
		require.Equal(t, orig.Body, m.Body)
		require.Equal(t, orig.BornAt.UnixNano(), m.BornAt.UnixNano())
		require.True(t, m.DeliverAt.IsZero(), "deliver-at is not passed on")
		require.Equal(t, map[string]string{
			"app.i":         "7",
			PropOriginTopic: "orders",
			PropOriginID:    orig.ID.String(),
			PropReason:      fmt.Sprintf("boom %d", attempt),
		}, m.Properties)
	}
	t.Logf("send-back to redelivery: %v (schedule %v)", gaps, schedule)

	out, err := s.SendBack(ctx, group, m, "boom 4")
	require.NoError(t, err)
	require.Equal(t, DeadLettered, out)
	dead := readQueue(t, b, DLQTopic(group), 0)
	require.Len(t, dead, 1)
	require.Equal(t, 3, dead[0].ReconsumeCount)
	require.Equal(t, "boom 4", dead[0].Properties[PropReason])
	require.Equal(t, orig.ID.String(), dead[0].Properties[PropOriginID])
	require.Equal(t, "orders", dead[0].Properties[PropOriginTopic])
	require.Equal(t, orig.Body, dead[0].Body)

	// Nothing else is on its way: every level delivered what it held, and
	// the retry topic holds the three redeliveries only.
	require.Eventually(t, func() bool { return schedulerDone(t, b) }, waitFor, 2*time.Millisecond)
	require.Len(t, readQueue(t, b, RetryTopic(group), 0), 3)
	for topic, queues := range map[string]int{RetryTopic(group): 1, DLQTopic(group): 1, ScheduleTopic: 3} {
		info, err := b.Topic(ctx, topic)
		require.NoError(t, err)
		require.Equal(t, queues, info.Queues, topic)
	}

	n, err := s.Redrive(ctx, group, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	info, err := b.Topic(ctx, "orders")
	require.NoError(t, err)
	back := readQueue(t, b, "orders", core.QueueFor("dev-1", info.Queues))
	require.Len(t, back, 2)
	r := back[1]
	require.Equal(t, 0, r.ReconsumeCount)
	require.Equal(t, orig.Body, r.Body)
	require.Equal(t, orig.Keys, r.Keys)
	require.Equal(t, orig.Tag, r.Tag)
	require.Equal(t, orig.ID.String(), r.Properties[PropOriginID])
	require.NotContains(t, r.Properties, PropReason)

	n, err = s.Redrive(ctx, group, 10)
	require.NoError(t, err)
	require.Zero(t, n, "a dead letter is redriven once")
	require.Len(t, readQueue(t, b, DLQTopic(group), 0), 1, "dead letters stay readable")
}

// The defaults nobody waits for in real time: a message that fails every
// time goes through DefaultMaxAttempts redeliveries, the n-th after
// DefaultSchedule[n-1] (10 s … 2 h, 4 h 45 min in all) by the service's
// clock, then to the dead-letter topic. The clock runs 4,000 times faster
// than the wall clock (about 4 s of real time).
func TestDefaultScheduleRunsEndToEnd(t *testing.T) {
	ctx := t.Context()
	const (
		group  = "billing"
		factor = 4000
		// late bounds how long after its due time, in real time, a
		// redelivery may be stored: a scheduler's wake-up and produce.
		late = 250 * time.Millisecond
	)
	clock := delay.NewScaledClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), factor)
	// clockAt is what the clock showed at wall-clock time w.
	clockAt := func(w time.Time) time.Time {
		return clock.Origin.Add(time.Duration(float64(w.Sub(clock.Start)) * factor))
	}
	b := openStore(t, "")
	s := newService(t, b, Options{Clock: clock}, true)
	require.Equal(t, DefaultMaxAttempts, s.MaxAttempts())
	require.Equal(t, DefaultSchedule, s.Schedule())
	require.Len(t, DefaultSchedule, DefaultMaxAttempts, "one level per attempt: no level repeats")

	orig := produceOne(t, b, "orders", "dev-1", 1)
	m := orig
	var lateness time.Duration // by the clock
	for attempt := 1; attempt <= DefaultMaxAttempts; attempt++ {
		wait := DefaultSchedule[attempt-1]
		before := clock.Now()
		out, err := s.SendBack(ctx, group, m, fmt.Sprintf("boom %d", attempt))
		after := clock.Now()
		require.NoError(t, err)
		require.Equal(t, Scheduled, out, "attempt %d", attempt)

		// Scheduled in its own level, due its delay after the send-back.
		level := readQueue(t, b, ScheduleTopic, attempt-1)
		require.Len(t, level, 1, "attempt %d is level %d's only message", attempt, attempt-1)
		due := level[0].DeliverAt
		require.WithinRange(t, due, before.Add(wait), after.Add(wait), "attempt %d is due %v after its send-back", attempt, wait)

		got := waitQueue(t, b, RetryTopic(group), 0, attempt)
		require.Len(t, got, attempt, "exactly one redelivery per send-back")
		m = got[attempt-1]
		at := clockAt(m.StoredAt)
		require.False(t, at.Before(due), "attempt %d redelivered %v early", attempt, due.Sub(at))
		require.LessOrEqual(t, at.Sub(due), late*factor, "attempt %d redelivered %v late by the clock", attempt, at.Sub(due))
		lateness = max(lateness, at.Sub(due))
		require.Equal(t, attempt, m.ReconsumeCount)
		require.Equal(t, orig.ID.String(), m.Properties[PropOriginID])
		require.Equal(t, fmt.Sprintf("boom %d", attempt), m.Properties[PropReason])
		require.Equal(t, orig.Body, m.Body)
	}

	t.Logf("latest redelivery: %v after its due time by the clock (%v real)", lateness, lateness/factor)

	out, err := s.SendBack(ctx, group, m, "boom 17")
	require.NoError(t, err)
	require.Equal(t, DeadLettered, out)
	dead := readQueue(t, b, DLQTopic(group), 0)
	require.Len(t, dead, 1)
	require.Equal(t, DefaultMaxAttempts, dead[0].ReconsumeCount)
	require.Equal(t, "boom 17", dead[0].Properties[PropReason])
	require.Equal(t, orig.ID.String(), dead[0].Properties[PropOriginID])
	require.Equal(t, "orders", dead[0].Properties[PropOriginTopic])
	require.Equal(t, orig.Body, dead[0].Body)

	// Nothing else is on its way: every level delivered its one message and
	// the retry topic holds the sixteen redeliveries only.
	require.Eventually(t, func() bool { return schedulerDone(t, b) }, waitFor, 2*time.Millisecond)
	require.Len(t, readQueue(t, b, RetryTopic(group), 0), DefaultMaxAttempts)
	info, err := b.Topic(ctx, ScheduleTopic)
	require.NoError(t, err)
	require.Equal(t, len(DefaultSchedule), info.Queues)
}

func TestLevelKeepsOrder(t *testing.T) {
	ctx := t.Context()
	b := openStore(t, "")
	s := newService(t, b, Options{Schedule: []time.Duration{5 * time.Millisecond, time.Hour}, MaxAttempts: 2}, true)
	var want []string
	for i := range 20 {
		m := produceOne(t, b, "orders", "", i)
		_, err := s.SendBack(ctx, "g", m, "")
		require.NoError(t, err)
		want = append(want, string(m.Body))
	}
	got := waitQueue(t, b, RetryTopic("g"), 0, len(want))
	var bodies []string
	for _, m := range got {
		bodies = append(bodies, string(m.Body))
		require.Equal(t, 1, m.ReconsumeCount)
		require.NotContains(t, m.Properties, PropReason)
	}
	require.Equal(t, want, bodies)
}

func TestLongScheduleRepeatsLastLevel(t *testing.T) {
	ctx := t.Context()
	b := openStore(t, "")
	s := newService(t, b, Options{Schedule: []time.Duration{time.Hour, 5 * time.Millisecond}, MaxAttempts: 5}, true)
	m := produceOne(t, b, "orders", "k", 1)
	m.ReconsumeCount = 3 // attempt 4 is beyond the schedule: the last level repeats
	out, err := s.SendBack(ctx, "g", m, "x")
	require.NoError(t, err)
	require.Equal(t, Scheduled, out)
	got := waitQueue(t, b, RetryTopic("g"), 0, 1)
	require.Equal(t, 4, got[0].ReconsumeCount)
}

func TestScheduledMessageSurvivesRestart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		schedule []time.Duration
		// shift moves the clock of the Service after the restart.
		shift time.Duration
	}{
		{name: "due after restart", schedule: []time.Duration{50 * time.Millisecond}},
		{name: "overdue goes at once", schedule: []time.Duration{time.Hour}, shift: 2 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			dir := t.TempDir()
			b := openStore(t, dir)
			// Never started: the message cannot be delivered before the restart.
			s := newService(t, b, Options{Schedule: tc.schedule}, false)
			m := produceOne(t, b, "orders", "k", 1)
			sentAt := time.Now()
			_, err := s.SendBack(ctx, "g", m, "crash test")
			require.NoError(t, err)
			require.NoError(t, s.Close())
			require.NoError(t, b.Close())

			b = openStore(t, dir)
			s = newService(t, b, Options{Schedule: tc.schedule, Clock: delay.NewScaledClock(time.Now().Add(tc.shift), 1)}, true)
			got := waitQueue(t, b, RetryTopic("g"), 0, 1)
			require.Eventually(t, func() bool { return schedulerDone(t, b) }, waitFor, 2*time.Millisecond)
			require.NoError(t, s.Close())
			got = readQueue(t, b, RetryTopic("g"), 0)
			require.Len(t, got, 1, "delivered exactly once")
			require.Equal(t, 1, got[0].ReconsumeCount)
			require.Equal(t, m.ID.String(), got[0].Properties[PropOriginID])
			if tc.shift == 0 {
				require.GreaterOrEqual(t, got[0].StoredAt.Sub(sentAt), tc.schedule[0])
			}
		})
	}
}

func TestRedriveProgressSurvivesRestart(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	b := openStore(t, dir)
	s := newService(t, b, Options{}, true)
	for i := range 3 {
		require.NoError(t, s.DeadLetter(ctx, "g", produceOne(t, b, "orders", "k", i), "poison"))
	}
	n, err := s.Redrive(ctx, "g", 2)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.NoError(t, s.Close())
	require.NoError(t, b.Close())

	b = openStore(t, dir)
	s = newService(t, b, Options{}, true)
	n, err = s.Redrive(ctx, "g", 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = s.Redrive(ctx, "g", 10)
	require.NoError(t, err)
	require.Zero(t, n)
	info, err := b.Topic(ctx, "orders")
	require.NoError(t, err)
	back := readQueue(t, b, "orders", core.QueueFor("k", info.Queues))
	require.Len(t, back, 6)
	for i, m := range back[3:] {
		require.Equal(t, fmt.Sprintf("body-%d", i), string(m.Body), "redriven oldest first")
	}
}

func TestValidateGroup(t *testing.T) {
	for _, tc := range []struct {
		group string
		ok    bool
	}{
		{"orders", true},
		{"A.b_c-9", true},
		{strings.Repeat("g", MaxGroupLen), true},
		{"", false},
		{strings.Repeat("g", MaxGroupLen+1), false},
		{"a b", false},
		{"%SCHEDULER%", false},
		{"grp/1", false},
		{"ü", false},
	} {
		t.Run(tc.group, func(t *testing.T) {
			err := ValidateGroup(tc.group)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrInvalidGroup)
			}
		})
	}
	require.Equal(t, "%RETRY%g", RetryTopic("g"))
	require.Equal(t, "%DLQ%g", DLQTopic("g"))
	require.NoError(t, core.ValidateSystemTopic(RetryTopic(strings.Repeat("g", MaxGroupLen))))
}

func TestBadInput(t *testing.T) {
	ctx := t.Context()
	b := openStore(t, "")
	s := newService(t, b, Options{}, true)
	m := produceOne(t, b, "orders", "k", 1)

	_, err := s.SendBack(ctx, "bad group", m, "")
	require.ErrorIs(t, err, ErrInvalidGroup)
	_, err = s.SendBack(ctx, "g", nil, "")
	require.ErrorIs(t, err, core.ErrInvalidMessage)
	require.ErrorIs(t, s.DeadLetter(ctx, "", m, ""), ErrInvalidGroup)
	_, err = s.Redrive(ctx, "g%", 1)
	require.ErrorIs(t, err, ErrInvalidGroup)
	_, err = s.Redrive(ctx, "g", 0)
	require.ErrorIs(t, err, ErrInvalidMax)
	n, err := s.Redrive(ctx, "never-failed", 5)
	require.NoError(t, err)
	require.Zero(t, n)

	// A reason is bounded.
	out, err := s.SendBack(ctx, "g", m, strings.Repeat("é", MaxReasonLen))
	require.NoError(t, err)
	require.Equal(t, Scheduled, out)
}

func TestNewRefusesBadOptions(t *testing.T) {
	b := openStore(t, "")
	for _, tc := range []struct {
		name string
		opts Options
		want []string
	}{
		{name: "empty schedule", opts: Options{Schedule: []time.Duration{}}, want: []string{"0 levels"}},
		{name: "every problem", opts: Options{Schedule: []time.Duration{time.Second, 0, -time.Second}, MaxAttempts: -1, PollInterval: -1},
			want: []string{"level 1", "level 2", "max attempts -1", "poll interval"}},
		{name: "too many levels", opts: Options{Schedule: make([]time.Duration, MaxLevels+1)}, want: []string{"1025 levels"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(b, tc.opts)
			require.ErrorIs(t, err, ErrBadOptions)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
	_, err := New(nil, Options{})
	require.ErrorIs(t, err, ErrBadOptions)

	// The schedule's length fixes the schedule topic's queue count.
	s, err := New(b, Options{Schedule: []time.Duration{time.Second, time.Minute}})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_, err = New(b, Options{Schedule: []time.Duration{time.Second}})
	require.ErrorIs(t, err, core.ErrTopicExists)
}

func TestCloseIsIdempotent(t *testing.T) {
	b := openStore(t, "")
	s, err := New(b, Options{})
	require.NoError(t, err)
	s.Start()
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	s.Start() // after Close: starts nothing (goleak would tell)
}

// Backlog counts what waits for redelivery, over every level, and falls
// as the schedulers deliver.
func TestBacklog(t *testing.T) {
	ctx := t.Context()
	b := openStore(t, "")
	s := newService(t, b, Options{Schedule: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}, MaxAttempts: 5,
		PollInterval: 10 * time.Millisecond}, false)
	for i := range 3 {
		m := produceOne(t, b, "orders", "k", i)
		m.ReconsumeCount = i % 2 // levels 0 and 1
		_, err := s.SendBack(ctx, "g", m, "x")
		require.NoError(t, err)
	}
	n, err := s.Backlog(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "not started: everything waits")
	s.Start()
	require.Eventually(t, func() bool {
		n, err := s.Backlog(ctx)
		return err == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond)
	waitQueue(t, b, RetryTopic("g"), 0, 3)
}
