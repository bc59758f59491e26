package consumer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	t     *testing.T
	dir   string
	store *store.Store
	coord *group.Coordinator
	retry Retrier
	stop  func()
}

// newEnv opens a real store in a temp dir with a group coordinator and the
// retry service over it (compressed backoff schedule).
func newEnv(t *testing.T, dir string) *env {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s, err := store.Open(dir, store.Options{IndexSlots: 1024, IndexEntries: 1 << 16, CheckpointInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	c, err := group.New(s, group.Options{HeartbeatTimeout: 300 * time.Millisecond, CheckInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	c.Start()
	r, closeRetry := newRetrier(t, s)
	e := &env{t: t, dir: dir, store: s, coord: c, retry: r}
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			closeRetry()
			_ = c.Close()
			_ = s.Close()
		})
	}
	t.Cleanup(e.stop)
	return e
}

func (e *env) consumer(id string, opts Options) *PushConsumer {
	e.t.Helper()
	if opts.Group == "" {
		opts.Group = "g"
	}
	opts.ClientID = id
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 50 * time.Millisecond
	}
	if opts.PollWait == 0 {
		opts.PollWait = 100 * time.Millisecond
	}
	if opts.SuspendTime == 0 {
		opts.SuspendTime = time.Millisecond
	}
	if opts.CommitInterval == 0 {
		opts.CommitInterval = 10 * time.Millisecond
	}
	p, err := NewPushConsumer(e.coord, e.retry, opts)
	require.NoError(e.t, err)
	require.NoError(e.t, p.Start(e.t.Context()))
	e.t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func (e *env) produce(topic string, n int, key func(i int) string) []core.SendResult {
	e.t.Helper()
	var out []core.SendResult
	for i := 0; i < n; i++ {
		r, err := e.store.Produce(e.t.Context(), &core.Message{Topic: topic, ShardingKey: key(i), Body: []byte(strconv.Itoa(i))})
		require.NoError(e.t, err)
		out = append(out, r)
	}
	return out
}

// seen records deliveries by message ID.
type seen struct {
	mu    sync.Mutex
	by    map[core.MessageID][]string
	count int
}

func newSeen() *seen { return &seen{by: map[core.MessageID][]string{}} }

func (s *seen) add(id core.MessageID, who string) {
	s.mu.Lock()
	s.by[id] = append(s.by[id], who)
	s.count++
	s.mu.Unlock()
}

func (s *seen) has(ids []core.SendResult) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range ids {
		if len(s.by[r.ID]) == 0 {
			return false
		}
	}
	return true
}

func committedEqualsMax(t *testing.T, e *env, groupName, topic string) {
	t.Helper()
	info, err := e.store.Topic(t.Context(), topic)
	require.NoError(t, err)
	for q, r := range info.Ranges {
		off, err := e.store.CommittedOffset(t.Context(), groupName, topic, q)
		if r.Max == 0 {
			continue
		}
		require.NoError(t, err, "queue %d", q)
		require.Equal(t, r.Max, off, "queue %d committed exactly", q)
	}
}

// committedAtMax reports whether every queue of topic that holds messages
// has groupName's committed offset at its end.
func committedAtMax(t *testing.T, e *env, groupName, topic string) bool {
	t.Helper()
	info, err := e.store.Topic(t.Context(), topic)
	require.NoError(t, err)
	for q, r := range info.Ranges {
		if r.Max == 0 {
			continue
		}
		if off, err := e.store.CommittedOffset(t.Context(), groupName, topic, q); err != nil || off != r.Max {
			return false
		}
	}
	return true
}

func TestClusteringThreeMembersEightQueues(t *testing.T) {
	e := newEnv(t, "")
	_, err := e.store.CreateTopic(t.Context(), core.TopicConfig{Name: "orders", Queues: 8})
	require.NoError(t, err)
	got := newSeen()
	var cs []*PushConsumer
	for _, id := range []string{"m1", "m2", "m3"} {
		cs = append(cs, e.consumer(id, Options{Subscriptions: []group.Subscription{{Topic: "orders"}},
			Listener: func(ctx context.Context, m *core.StoredMessage) Result { got.add(m.ID, id); return Success }}))
	}
	sent := e.produce("orders", 3000, func(i int) string { return fmt.Sprintf("car-%d", i%97) })
	require.Eventually(t, func() bool { return got.has(sent) }, 30*time.Second, 10*time.Millisecond)
	for _, c := range cs {
		require.NoError(t, c.Close(t.Context()))
	}
	committedEqualsMax(t, e, "g", "orders")
	// Every member got a share; nothing was delivered twice (no failures,
	// no crashes, so no duplicates are expected).
	per := map[string]int{}
	for _, who := range got.by {
		require.Len(t, who, 1)
		per[who[0]]++
	}
	require.Len(t, per, 3, "all three members consumed")
	require.NoError(t, group.CheckLeaseLog(e.coord.LeaseLog()))
}

func TestClusteringMemberKilledMidBatch(t *testing.T) {
	e := newEnv(t, "")
	_, err := e.store.CreateTopic(t.Context(), core.TopicConfig{Name: "orders", Queues: 8})
	require.NoError(t, err)
	sent := e.produce("orders", 2000, func(i int) string { return fmt.Sprintf("car-%d", i%50) })

	done := newSeen() // successfully handled
	hang := make(chan struct{})
	var hung sync.Once
	victimStarted := 0
	var vmu sync.Mutex
	victim := e.consumer("victim", Options{Subscriptions: []group.Subscription{{Topic: "orders"}}, ConsumeGoroutines: 4,
		Listener: func(ctx context.Context, m *core.StoredMessage) Result {
			vmu.Lock()
			victimStarted++
			n := victimStarted
			vmu.Unlock()
			if n > 50 {
				hung.Do(func() { close(hang) })
				<-ctx.Done() // hangs mid-batch until the process "dies"
				return Retry
			}
			done.add(m.ID, "victim")
			return Success
		}})
	<-hang
	others := make([]*PushConsumer, 0, 2)
	for _, id := range []string{"m2", "m3"} {
		others = append(others, e.consumer(id, Options{Subscriptions: []group.Subscription{{Topic: "orders"}},
			Listener: func(ctx context.Context, m *core.StoredMessage) Result { done.add(m.ID, id); return Success }}))
	}
	victim.abort() // kill: no commit, no leave; the coordinator sees missed heartbeats
	require.Eventually(t, func() bool { return done.has(sent) }, 30*time.Second, 10*time.Millisecond,
		"the victim's uncommitted messages reach the others")
	for _, c := range others {
		require.NoError(t, c.Close(t.Context()))
	}
	committedEqualsMax(t, e, "g", "orders")
	require.NoError(t, group.CheckLeaseLog(e.coord.LeaseLog()))
	dups := 0
	for _, who := range done.by {
		if len(who) > 1 {
			dups++
		}
	}
	t.Logf("%d messages delivered twice (at-least-once after a kill)", dups)
}

func TestOrderlyPerKeyOrderWithFailures(t *testing.T) {
	e := newEnv(t, "")
	_, err := e.store.CreateTopic(t.Context(), core.TopicConfig{Name: "ord", Queues: 8})
	require.NoError(t, err)
	const n, keys = 10_000, 100
	var mu sync.Mutex
	attempts := map[string][]int{} // key → sequence numbers in the order attempted
	okSeq := map[string][]int{}
	failedOnce := map[core.MessageID]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	listener := func(ctx context.Context, m *core.StoredMessage) Result {
		seq, _ := strconv.Atoi(string(m.Body))
		mu.Lock()
		defer mu.Unlock()
		attempts[m.ShardingKey] = append(attempts[m.ShardingKey], seq)
		if !failedOnce[m.ID] && rng.IntN(20) == 0 {
			failedOnce[m.ID] = true
			return Retry
		}
		okSeq[m.ShardingKey] = append(okSeq[m.ShardingKey], seq)
		return Success
	}
	for _, id := range []string{"o1", "o2"} {
		e.consumer(id, Options{Orderly: true, Subscriptions: []group.Subscription{{Topic: "ord"}}, Listener: listener})
	}
	e.produce("ord", n, func(i int) string { return fmt.Sprintf("key-%d", i%keys) })
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		total := 0
		for _, s := range okSeq {
			total += len(s)
		}
		return total >= n
	}, 60*time.Second, 20*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	failures := 0
	for k, seqs := range okSeq {
		require.Len(t, seqs, n/keys, k)
		for i := 1; i < len(seqs); i++ {
			require.Less(t, seqs[i-1], seqs[i], "key %s out of order", k)
		}
		// A failed message is retried before anything later of its key.
		att := attempts[k]
		for i := 1; i < len(att); i++ {
			require.LessOrEqual(t, att[i-1], att[i], "key %s: a later message was tried before a failed one", k)
			if att[i-1] == att[i] {
				failures++
			}
		}
	}
	require.Positive(t, failures, "failures were injected")
}

func TestBroadcastEachMemberSeesAllAndKeepsProgress(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	_, err := e.store.CreateTopic(t.Context(), core.TopicConfig{Name: "cfg", Queues: 4})
	require.NoError(t, err)
	gotA, gotB := newSeen(), newSeen()
	opts := func(s *seen) Options {
		return Options{Group: "cache", Mode: group.Broadcast, Subscriptions: []group.Subscription{{Topic: "cfg"}},
			Listener: func(ctx context.Context, m *core.StoredMessage) Result { s.add(m.ID, ""); return Success }}
	}
	a := e.consumer("A", opts(gotA))
	b := e.consumer("B", opts(gotB))
	first := e.produce("cfg", 200, func(i int) string { return strconv.Itoa(i) })
	require.Eventually(t, func() bool { return gotA.has(first) && gotB.has(first) }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, a.Close(t.Context()))
	require.NoError(t, b.Close(t.Context()))

	// Restart the whole engine; each member resumes from its own progress.
	e.stop()
	e2 := newEnv(t, dir)
	second := e2.produce("cfg", 100, func(i int) string { return strconv.Itoa(i) })
	gotA2, gotB2 := newSeen(), newSeen()
	e2.consumer("A", opts(gotA2))
	e2.consumer("B", opts(gotB2))
	require.Eventually(t, func() bool { return gotA2.has(second) && gotB2.has(second) }, 20*time.Second, 10*time.Millisecond)
	gotA2.mu.Lock()
	defer gotA2.mu.Unlock()
	for _, r := range first {
		require.Empty(t, gotA2.by[r.ID], "A does not get old messages again")
	}
}

func TestRetryBackoffThenDeadLetterThenRedrive(t *testing.T) {
	e := newEnv(t, "")
	_, err := e.store.CreateTopic(t.Context(), core.TopicConfig{Name: "orders", Queues: 2})
	require.NoError(t, err)
	type attempt struct {
		at    time.Time
		count int
		topic string
	}
	var mu sync.Mutex
	var bad []attempt
	redriven := make(chan core.StoredMessage, 1)
	good := newSeen()
	e.consumer("c1", Options{Subscriptions: []group.Subscription{{Topic: "orders"}},
		Listener: func(ctx context.Context, m *core.StoredMessage) Result {
			if string(m.Body) != "bad" {
				good.add(m.ID, "c1")
				return Success
			}
			mu.Lock()
			defer mu.Unlock()
			if m.Properties["redriven"] == "" && len(bad) > len(testSchedule) {
				redriven <- *m // the copy that came back from the dead-letter topic
				return Success
			}
			bad = append(bad, attempt{at: time.Now(), count: m.ReconsumeCount, topic: m.Topic})
			return Retry
		}})
	sent := e.produce("orders", 20, func(i int) string { return strconv.Itoa(i) })
	_, err = e.store.Produce(t.Context(), &core.Message{Topic: "orders", ShardingKey: "x", Body: []byte("bad")})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return good.has(sent) }, 10*time.Second, 5*time.Millisecond)

	dlq := "%DLQ%g"
	require.Eventually(t, func() bool {
		info, err := e.store.Topic(t.Context(), dlq)
		return err == nil && info.Ranges[0].Max == 1
	}, 20*time.Second, 5*time.Millisecond, "the message reaches the dead-letter topic")
	mu.Lock()
	require.Len(t, bad, len(testSchedule)+1, "first delivery plus one per retry, then the DLQ")
	for i, a := range bad {
		require.Equal(t, i, a.count, "the reconsume count travels with the message")
		require.Equal(t, "orders", a.topic, "listeners see the original topic")
		if i > 0 {
			gap := a.at.Sub(bad[i-1].at)
			require.GreaterOrEqual(t, gap, testSchedule[i-1], "attempt %d came before its backoff", i)
		}
	}
	mu.Unlock()
	res, err := e.store.Read(t.Context(), core.ReadRequest{Topic: dlq, Queue: 0})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	require.Equal(t, "bad", string(res.Messages[0].Body))
	require.NotEmpty(t, res.Messages[0].Properties["retry.reason"])

	rs := e.retry.(*retry.Service)
	n, err := rs.Redrive(t.Context(), "g", 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	select {
	case m := <-redriven:
		require.Equal(t, "orders", m.Topic)
		require.Equal(t, 0, m.ReconsumeCount)
	case <-time.After(20 * time.Second):
		t.Fatal("re-driven message not delivered")
	}
	n, err = rs.Redrive(t.Context(), "g", 10)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is re-driven twice")
}

// TestRestartBetweenDeliveryAndCommit kills a consumer (no final commit) and
// restarts the engine: nothing is lost, and the only duplicates are messages
// at or after the committed offsets — the documented at-least-once window.
func TestRestartBetweenDeliveryAndCommit(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	_, err := e.store.CreateTopic(t.Context(), core.TopicConfig{Name: "t", Queues: 4})
	require.NoError(t, err)
	sent := e.produce("t", 2000, func(i int) string { return fmt.Sprintf("k%d", i%40) })
	first := newSeen()
	stopAt := make(chan struct{})
	var once sync.Once
	var n atomic32
	c := e.consumer("c1", Options{Subscriptions: []group.Subscription{{Topic: "t"}}, CommitInterval: 5 * time.Millisecond,
		Listener: func(ctx context.Context, m *core.StoredMessage) Result {
			first.add(m.ID, "first")
			if n.add() == 1000 {
				once.Do(func() { close(stopAt) })
			}
			return Success
		}})
	<-stopAt
	c.abort()
	committed := map[int]int64{}
	for q := 0; q < 4; q++ {
		off, err := e.store.CommittedOffset(t.Context(), "g", "t", q)
		if err == nil {
			committed[q] = off
		}
	}
	e.stop() // the engine persists offsets on a clean close

	e2 := newEnv(t, dir)
	second := newSeen()
	all := newSeen()
	for _, s := range []*seen{first} {
		for id := range s.by {
			all.add(id, "first")
		}
	}
	e2.consumer("c2", Options{Subscriptions: []group.Subscription{{Topic: "t"}},
		Listener: func(ctx context.Context, m *core.StoredMessage) Result {
			second.add(m.ID, "second")
			all.add(m.ID, "second")
			return Success
		}})
	require.Eventually(t, func() bool { return all.has(sent) }, 30*time.Second, 10*time.Millisecond, "nothing lost")
	dups := 0
	for _, r := range sent {
		if len(first.by[r.ID]) > 0 && len(second.by[r.ID]) > 0 {
			dups++
			require.GreaterOrEqual(t, r.QueueOffset, committed[r.Queue], "a duplicate below the committed offset")
		}
	}
	t.Logf("%d duplicates after the kill, all at or after the committed offsets %v", dups, committed)
}

type atomic32 struct {
	mu sync.Mutex
	v  int
}

func (a *atomic32) add() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.v++
	return a.v
}

func TestTagFilteredSubscription(t *testing.T) {
	e := newEnv(t, "")
	_, err := e.store.CreateTopic(t.Context(), core.TopicConfig{Name: "tagged", Queues: 2})
	require.NoError(t, err)
	got := newSeen()
	var want []core.SendResult
	for i := 0; i < 100; i++ {
		tag := []string{"alarm", "telemetry"}[i%2]
		r, err := e.store.Produce(t.Context(), &core.Message{Topic: "tagged", Tag: tag, Body: []byte(tag)})
		require.NoError(t, err)
		if tag == "alarm" {
			want = append(want, r)
		}
	}
	c := e.consumer("c1", Options{Subscriptions: []group.Subscription{{Topic: "tagged", Tags: []string{"alarm"}}},
		Listener: func(ctx context.Context, m *core.StoredMessage) Result {
			if m.Tag != "alarm" {
				t.Errorf("got a %q message through an alarm-only subscription", m.Tag)
			}
			got.add(m.ID, "c1")
			return Success
		}})
	require.Eventually(t, func() bool { return got.has(want) }, 10*time.Second, 5*time.Millisecond)
	// Filtered messages count as consumed: queue 1 holds only telemetry
	// (keyless messages alternate queues), yet its offset moves to the end.
	// Its worker may pull after the last alarm arrived, so wait for it.
	require.Eventually(t, func() bool { return committedAtMax(t, e, "g", "tagged") }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, c.Close(t.Context()))
	require.Equal(t, 50, got.count)
	committedEqualsMax(t, e, "g", "tagged")
}

// A member joining gets its share while the others are busy, without any
// member's heartbeat tick coming round: heartbeats here are an hour apart
// (and so is the coordinator's timeout), so only the worker that learns
// from its own pull that its queue was reassigned can hand it over.
func TestJoinHandsQueuesOverBeforeTheNextHeartbeat(t *testing.T) {
	e := newEnv(t, "")
	coord, err := group.New(e.store, group.Options{HeartbeatTimeout: time.Hour, CheckInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	coord.Start()
	t.Cleanup(func() { _ = coord.Close() })
	_, err = e.store.CreateTopic(t.Context(), core.TopicConfig{Name: "orders", Queues: 4})
	require.NoError(t, err)
	sent := e.produce("orders", 2000, func(i int) string { return fmt.Sprintf("car-%d", i%61) })
	got := newSeen()
	start := func(id string) {
		p, err := NewPushConsumer(coord, e.retry, Options{Group: "g", ClientID: id, Orderly: true,
			Subscriptions: []group.Subscription{{Topic: "orders"}}, HeartbeatInterval: time.Hour,
			PollWait: 100 * time.Millisecond, CommitInterval: 10 * time.Millisecond,
			Listener: func(ctx context.Context, m *core.StoredMessage) Result {
				got.add(m.ID, id)
				time.Sleep(time.Millisecond) // the listener's work, the scenario: the backlog outlasts the join
				return Success
			}})
		require.NoError(t, err)
		require.NoError(t, p.Start(t.Context()))
		t.Cleanup(func() { _ = p.Close(context.Background()) })
	}
	start("m1")
	require.Eventually(t, func() bool { got.mu.Lock(); defer got.mu.Unlock(); return got.count > 0 }, 10*time.Second, time.Millisecond)
	start("m2")
	require.Eventually(t, func() bool {
		got.mu.Lock()
		defer got.mu.Unlock()
		for _, who := range got.by {
			if who[len(who)-1] == "m2" {
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond, "m2 got its queues although no heartbeat tick came")
	require.Eventually(t, func() bool { return got.has(sent) }, 30*time.Second, 10*time.Millisecond)
}
