package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/brokertest"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/query"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/txn"
)

// The services above core.Broker (group, retry, pop, delay, txn, query and
// trace) were written against the embedded engine, whose queue offsets are
// dense. These tests run each of them on the JetStream engine, on a real
// in-process nats-server, over multi-queue topics, whose queue offsets are
// stream sequences shared by the queues: increasing but sparse.

// svcWait bounds every wait of these tests.
const svcWait = 15 * time.Second

// servicesEngine starts a nats-server and an engine on it, and checks at
// the end of the test, before the engine closes, that every goroutine the
// test started after the engine (services, members, poppers) has ended.
func servicesEngine(t *testing.T) *jetstream.Engine {
	t.Helper()
	s := natstest.RunServer(t, natstest.SyncAlways())
	e := openEngine(t, s.URL)
	// Warm up: the NATS client starts some goroutines lazily (publish
	// acknowledgements, request multiplexing); they live as long as the
	// engine and are not the services'.
	ctx := t.Context()
	_, err := e.Produce(ctx, &core.Message{Topic: "warmup", Body: []byte("w")})
	require.NoError(t, err)
	require.NoError(t, e.CommitOffset(ctx, "warmup", "warmup", 0, 0))
	_, err = e.CommittedOffset(ctx, "warmup", "warmup", 0)
	require.NoError(t, err)
	_, err = e.Read(ctx, core.ReadRequest{Topic: "warmup", Queue: 0})
	require.NoError(t, err)
	before := goroutines()
	t.Cleanup(func() {
		assert.EventuallyWithT(t, func(c *assert.CollectT) {
			var leaked []string
			for id, stack := range goroutines() {
				// The in-process server starts goroutines per stream; the
				// goroutine running this check is the poller's own.
				if _, ok := before[id]; !ok && !strings.Contains(stack, "nats-io/nats-server/") && !strings.Contains(stack, goroutinesFunc) {
					leaked = append(leaked, stack)
				}
			}
			if len(leaked) > 0 {
				c.Errorf("%d goroutines started by the test still run:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
			}
		}, 2*time.Second, 20*time.Millisecond, "goroutines left behind")
	})
	return e
}

// goroutinesFunc is in the stack of the goroutine that calls goroutines.
const goroutinesFunc = "jetstream_test.goroutines("

// goroutines returns the stack of every goroutine by its ID.
func goroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, " [")
		if id, ok := strings.CutPrefix(head, "goroutine "); ok {
			out[id] = g
		}
	}
	return out
}

// readTopic reads every message of topic, queue by queue, following
// NextOffset; nil if the topic does not exist.
func readTopic(t *testing.T, b core.Broker, topic string) []*core.StoredMessage {
	t.Helper()
	out, err := readTopicErr(b, topic)
	require.NoError(t, err)
	return out
}

// readTopicErr is readTopic for a poll's condition, which runs on a
// goroutine of its own and must not stop the test.
func readTopicErr(b core.Broker, topic string) ([]*core.StoredMessage, error) {
	return brokertest.ReadTopic(context.Background(), b, topic)
}

// topicHoldsMore reports whether topic holds more than n messages (false
// on a read error: the check after the poll reports that).
func topicHoldsMore(b core.Broker, topic string, n int) bool {
	msgs, err := readTopicErr(b, topic)
	return err == nil && len(msgs) > n
}

// backlogAfterCommit is the number of messages of topic/queue at or after
// group's committed offset (all of them if it never committed).
func backlogAfterCommit(t *testing.T, b core.Broker, grp, topic string, queue int) int64 {
	t.Helper()
	ctx := context.Background()
	from, err := b.CommittedOffset(ctx, grp, topic, queue)
	if errors.Is(err, core.ErrNoCommittedOffset) {
		from = 0
	} else {
		require.NoError(t, err)
	}
	n, err := b.Backlog(ctx, topic, queue, from)
	require.NoError(t, err)
	return n
}

func bodiesOf(msgs []*core.StoredMessage) []string {
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, string(m.Body))
	}
	return out
}

// ---------------------------------------------------------------- group

// gMember is one consumer of a group, driven the way a client is: a
// heartbeat, then a pull of every assigned queue from its own position, a
// commit after each batch, and a release of queues a rebalance took away.
type gMember struct {
	c      *group.Coordinator
	group  string
	id     string
	mode   group.Mode
	topic  string
	pos    map[group.QueueRef]int64
	record func(member string, msgs []*core.StoredMessage)
}

func newMember(c *group.Coordinator, grp, id string, mode group.Mode, topic string, record func(string, []*core.StoredMessage)) *gMember {
	return &gMember{c: c, group: grp, id: id, mode: mode, topic: topic, pos: map[group.QueueRef]int64{}, record: record}
}

func (m *gMember) heartbeat(ctx context.Context) (group.Assignment, error) {
	return m.c.Heartbeat(ctx, group.HeartbeatRequest{Group: m.group, ClientID: m.id, Mode: m.mode,
		Subscriptions: []group.Subscription{{Topic: m.topic}}})
}

// round is one heartbeat and one pull (and commit) per assigned queue.
func (m *gMember) round(ctx context.Context) error {
	a, err := m.heartbeat(ctx)
	if err != nil {
		return err
	}
	for ref := range m.pos {
		if !slices.Contains(a.Queues, ref) {
			if m.mode == group.Clustering {
				if err := m.c.Release(ctx, m.group, m.id, ref); err != nil {
					return err
				}
			}
			delete(m.pos, ref)
		}
	}
	for _, ref := range a.Queues {
		off, ok := m.pos[ref]
		if !ok {
			off = -1
		}
		res, err := m.c.Pull(ctx, group.PullRequest{Group: m.group, ClientID: m.id, Queue: ref, Offset: off, Max: 7})
		if errors.Is(err, group.ErrQueueBusy) || errors.Is(err, group.ErrNotAssigned) {
			continue // the previous holder has not let go yet / taken away meanwhile
		}
		if err != nil {
			return fmt.Errorf("%s pull %s: %w", m.id, ref, err)
		}
		m.record(m.id, res.Messages)
		if len(res.Messages) > 0 || res.NextOffset != off {
			if err := m.c.Commit(ctx, m.group, m.id, ref, res.NextOffset); err != nil {
				return fmt.Errorf("%s commit %s: %w", m.id, ref, err)
			}
		}
		m.pos[ref] = res.NextOffset
	}
	return nil
}

// deliveryLog records deliveries in the order members got them.
type deliveryLog struct {
	mu   sync.Mutex
	msgs []*core.StoredMessage
	who  []string
}

func (l *deliveryLog) record(member string, msgs []*core.StoredMessage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range msgs {
		l.msgs = append(l.msgs, m)
		l.who = append(l.who, member)
	}
}

func (l *deliveryLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.msgs)
}

func (l *deliveryLog) snapshot() ([]*core.StoredMessage, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.msgs), slices.Clone(l.who)
}

// checkKeyOrder checks that msgs hold, per sharding key, the bodies
// "<key>/<n>" with n = next[key], next[key]+1, … in order, and advances next.
func checkKeyOrder(t *testing.T, msgs []*core.StoredMessage, next map[string]int) {
	t.Helper()
	for _, m := range msgs {
		key, n, ok := strings.Cut(string(m.Body), "/")
		require.True(t, ok, "body %q", m.Body)
		require.Equal(t, key, m.ShardingKey)
		require.Equal(t, strconv.Itoa(next[key]), n, "key %s out of order", key)
		next[key]++
	}
}

func sumLag(t *testing.T, lags []group.QueueLag, topic string) (total int64, per map[int]int64) {
	t.Helper()
	per = map[int]int64{}
	for _, l := range lags {
		if l.Queue.Topic == topic {
			total += l.Lag
			per[l.Queue.Queue] = l.Lag
		}
	}
	return total, per
}

// TestServicesGroup: two clustering members of one group on an 8-queue
// topic get every keyed message exactly once, in per-key order, while
// messages are still being produced; after their commits the group's lag
// is 0. A member leaves and the other takes its queues from its commits.
// Two broadcast members each get everything.
func TestServicesGroup(t *testing.T) {
	ctx := t.Context()
	e := servicesEngine(t)
	const topic, grp, queues = "orders", "billing", 8
	_, err := e.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: queues})
	require.NoError(t, err)
	c, err := group.New(e, group.Options{HeartbeatTimeout: 3 * time.Second, CheckInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	c.Start()
	t.Cleanup(func() { _ = c.Close() })

	keys := make([]string, 12)
	for i := range keys {
		keys[i] = "dev-" + strconv.Itoa(i)
	}
	produced := map[string]int{}
	perQueue := map[int]int64{}
	produce := func(n int) {
		t.Helper()
		msgs := make([]*core.Message, 0, n)
		for i := range n {
			k := keys[(i*5)%len(keys)]
			msgs = append(msgs, &core.Message{Topic: topic, ShardingKey: k, Body: fmt.Appendf(nil, "%s/%d", k, produced[k])})
			produced[k]++
			perQueue[core.QueueFor(k, queues)]++
		}
		for len(msgs) > 0 {
			b := msgs[:min(len(msgs), 10)]
			msgs = msgs[len(b):]
			_, err := e.ProduceBatch(ctx, b)
			require.NoError(t, err)
		}
	}

	var log deliveryLog
	a := newMember(c, grp, "A", group.Clustering, topic, log.record)
	b := newMember(c, grp, "B", group.Clustering, topic, log.record)

	// Before anyone consumed, the lag of each queue is its message count.
	produce(60)
	_, err = a.heartbeat(ctx)
	require.NoError(t, err)
	lags, err := c.Lag(ctx, grp, "")
	require.NoError(t, err)
	total, per := sumLag(t, lags, topic)
	require.EqualValues(t, 60, total, "Lag counts messages (Backlog), not offsets")
	for q := range queues {
		require.Equal(t, perQueue[q], per[q], "lag of queue %d", q)
	}

	// Both members consume while the rest is produced.
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, m := range []*gMember{a, b} {
		wg.Go(func() {
			for !stop.Load() {
				if err := m.round(ctx); err != nil {
					t.Errorf("member %s: %v", m.id, err)
					return
				}
				time.Sleep(2 * time.Millisecond) // paces the members' rounds (a client's poll), waits for nothing
			}
		})
	}
	produce(60)
	// assert, not require: the members must be stopped before the test ends.
	ok := assert.Eventually(t, func() bool { return log.len() >= 120 }, svcWait, 5*time.Millisecond)
	assert.Never(t, func() bool { return log.len() > 120 }, 200*time.Millisecond, 5*time.Millisecond, "a message delivered twice")
	stop.Store(true)
	wg.Wait()
	require.True(t, ok, "delivered %d of 120", log.len())

	msgs, who := log.snapshot()
	require.Len(t, msgs, 120, "every message exactly once")
	seen := map[core.MessageID]bool{}
	byMember := map[string]int{}
	for i, m := range msgs {
		require.False(t, seen[m.ID], "message %s (%s) delivered twice", m.ID, m.Body)
		seen[m.ID] = true
		byMember[who[i]]++
	}
	require.Positive(t, byMember["A"], "A consumed")
	require.Positive(t, byMember["B"], "B consumed")
	next := map[string]int{}
	checkKeyOrder(t, msgs, next)
	for k, n := range produced {
		require.Equal(t, n, next[k], "key %s", k)
	}
	t.Logf("clustering: A %d, B %d messages", byMember["A"], byMember["B"])

	for _, m := range []*gMember{a, b} {
		_, err := m.heartbeat(ctx) // still live
		require.NoError(t, err)
	}
	lags, err = c.Lag(ctx, grp, "")
	require.NoError(t, err)
	total, _ = sumLag(t, lags, topic)
	require.Zero(t, total, "all committed: lag 0")
	require.NoError(t, group.CheckLeaseLog(c.LeaseLog()))

	// B leaves: A gets all eight queues and continues from B's commits.
	require.NoError(t, c.Leave(ctx, grp, "B"))
	asg, err := a.heartbeat(ctx)
	require.NoError(t, err)
	require.Len(t, asg.Queues, queues)
	produce(40)
	before := log.len()
	require.Eventually(t, func() bool {
		require.NoError(t, a.round(ctx))
		return log.len() >= before+40
	}, svcWait, time.Millisecond)
	for range 3 { // nothing more comes
		require.NoError(t, a.round(ctx))
	}
	msgs, who = log.snapshot()
	require.Len(t, msgs, before+40)
	for i, m := range msgs[before:] {
		require.Equal(t, "A", who[before+i])
		require.False(t, seen[m.ID], "message %s (%s) delivered again after the rebalance", m.ID, m.Body)
		seen[m.ID] = true
	}
	checkKeyOrder(t, msgs[before:], next)
	lags, err = c.Lag(ctx, grp, "")
	require.NoError(t, err)
	total, _ = sumLag(t, lags, topic)
	require.Zero(t, total)
	require.NoError(t, group.CheckLeaseLog(c.LeaseLog()))

	// Broadcast: each member gets every message, with its own progress.
	const all = 160
	logs := map[string]*deliveryLog{"X": {}, "Y": {}}
	bx := newMember(c, "audit", "X", group.Broadcast, topic, logs["X"].record)
	by := newMember(c, "audit", "Y", group.Broadcast, topic, logs["Y"].record)
	for _, m := range []*gMember{bx, by} {
		asg, err := m.heartbeat(ctx)
		require.NoError(t, err)
		require.Len(t, asg.Queues, queues, "broadcast: every queue")
	}
	require.Eventually(t, func() bool {
		require.NoError(t, bx.round(ctx))
		require.NoError(t, by.round(ctx))
		return logs["X"].len() >= all && logs["Y"].len() >= all
	}, svcWait, time.Millisecond)
	require.NoError(t, bx.round(ctx))
	require.NoError(t, by.round(ctx))
	for id, l := range logs {
		got, _ := l.snapshot()
		require.Len(t, got, all, id)
		ids := map[core.MessageID]bool{}
		for _, m := range got {
			ids[m.ID] = true
		}
		require.Equal(t, seen, ids, "%s got every message once", id)
		nx := map[string]int{}
		checkKeyOrder(t, got, nx)
	}
	for _, id := range []string{"X", "Y"} {
		lags, err := c.Lag(ctx, "audit", id)
		require.NoError(t, err)
		total, _ := sumLag(t, lags, topic)
		require.Zero(t, total, "member %s committed everything", id)
	}
	lags, err = c.Lag(ctx, "audit", "")
	require.NoError(t, err)
	total, _ = sumLag(t, lags, topic)
	require.EqualValues(t, all, total, "the broadcast group's own offsets are never committed")
}

// ---------------------------------------------------------------- retry

// TestServicesRetry: messages a group member sends back come back on the
// group's retry topic after their level's back-off (not before) with the
// next reconsume count, exactly once, through a two-level schedule topic
// whose levels interleave in one stream; past MaxAttempts they go to the
// dead-letter topic, from which Redrive moves them back once.
func TestServicesRetry(t *testing.T) {
	ctx := t.Context()
	e := servicesEngine(t)
	const topic, grp = "invoices", "billing"
	schedule := []time.Duration{300 * time.Millisecond, 600 * time.Millisecond}
	rs, err := retry.New(e, retry.Options{Schedule: schedule, MaxAttempts: 2, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	rs.Start()
	t.Cleanup(func() { _ = rs.Close() })
	c, err := group.New(e, group.Options{CheckInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	c.Start()
	t.Cleanup(func() { _ = c.Close() })
	_, err = e.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 4})
	require.NoError(t, err)
	for i := range 12 {
		k := "k" + strconv.Itoa(i%6)
		_, err := e.Produce(ctx, &core.Message{Topic: topic, ShardingKey: k, Tag: "t", Keys: []string{"inv-" + strconv.Itoa(i)},
			Properties: map[string]string{"app.i": strconv.Itoa(i)}, Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}

	var log deliveryLog
	m := newMember(c, grp, "c1", group.Clustering, topic, log.record)
	require.Eventually(t, func() bool {
		require.NoError(t, m.round(ctx))
		return log.len() >= 12
	}, svcWait, time.Millisecond)
	origs, _ := log.snapshot()
	require.Len(t, origs, 12)
	rref := group.QueueRef{Topic: retry.RetryTopic(grp), Queue: 0}

	sentAt := map[string]time.Time{} // origin ID → last send-back
	sendBack := func(msg *core.StoredMessage, want retry.Outcome) {
		t.Helper()
		origin := msg.ID.String()
		if v := msg.Properties[retry.PropOriginID]; v != "" {
			origin = v
		}
		sentAt[origin] = time.Now()
		out, err := rs.SendBack(ctx, grp, msg, "boom "+origin)
		require.NoError(t, err)
		require.Equal(t, want, out)
	}
	// awaitRetries consumes the retry topic (through the group) until n
	// more messages came back.
	awaitRetries := func(n int) []*core.StoredMessage {
		t.Helper()
		before := log.len()
		require.Eventually(t, func() bool {
			require.NoError(t, m.round(ctx))
			return log.len() >= before+n
		}, svcWait, time.Millisecond)
		got, _ := log.snapshot()
		got = got[before:]
		require.Len(t, got, n)
		for _, r := range got {
			require.Equal(t, rref.Topic, r.Topic)
		}
		return got
	}
	checkCopy := func(r *core.StoredMessage, attempt int) {
		t.Helper()
		origin := r.Properties[retry.PropOriginID]
		i := slices.IndexFunc(origs, func(o *core.StoredMessage) bool { return o.ID.String() == origin })
		require.GreaterOrEqual(t, i, 0, "origin %s", origin)
		o := origs[i]
		require.Equal(t, attempt, r.ReconsumeCount)
		require.Equal(t, o.Body, r.Body)
		require.Equal(t, o.ShardingKey, r.ShardingKey)
		require.Equal(t, o.Keys, r.Keys)
		require.Equal(t, topic, r.Properties[retry.PropOriginTopic])
		require.Equal(t, "boom "+origin, r.Properties[retry.PropReason])
		require.GreaterOrEqual(t, r.StoredAt.Sub(sentAt[origin]), schedule[attempt-1], "redelivered before its back-off")
	}

	// Three messages of different queues fail once: level 0.
	var fail []*core.StoredMessage
	usedQ := map[int]bool{}
	for _, o := range origs {
		if !usedQ[o.Queue] && len(fail) < 3 {
			usedQ[o.Queue] = true
			fail = append(fail, o)
		}
	}
	require.Len(t, fail, 3)
	for _, o := range fail {
		sendBack(o, retry.Scheduled)
	}
	back1 := awaitRetries(3)
	for _, r := range back1 {
		checkCopy(r, 1)
	}
	// They fail again (level 1) while two fresh ones fail (level 0): both
	// levels hold messages, interleaved in the schedule topic's stream.
	for _, r := range back1 {
		sendBack(r, retry.Scheduled)
	}
	var fresh []*core.StoredMessage
	for _, o := range origs {
		if !slices.Contains(fail, o) && len(fresh) < 2 {
			fresh = append(fresh, o)
			sendBack(o, retry.Scheduled)
		}
	}
	back2 := awaitRetries(5)
	var third []*core.StoredMessage
	rc := map[int]int{}
	for _, r := range back2 {
		rc[r.ReconsumeCount]++
		checkCopy(r, r.ReconsumeCount)
		if r.ReconsumeCount == 2 {
			third = append(third, r)
		}
	}
	require.Equal(t, map[int]int{1: 2, 2: 3}, rc)
	// The level-0 ones (sent after the level-1 ones) came back first.
	require.Equal(t, 1, back2[0].ReconsumeCount)
	require.Equal(t, 1, back2[1].ReconsumeCount)

	// Past MaxAttempts: dead-lettered.
	for _, r := range third {
		sendBack(r, retry.DeadLettered)
	}
	dead := readTopic(t, e, retry.DLQTopic(grp))
	require.Len(t, dead, 3)
	var deadOrigins, failOrigins []string
	for _, d := range dead {
		require.Equal(t, 2, d.ReconsumeCount)
		deadOrigins = append(deadOrigins, d.Properties[retry.PropOriginID])
	}
	for _, o := range fail {
		failOrigins = append(failOrigins, o.ID.String())
	}
	require.ElementsMatch(t, failOrigins, deadOrigins)

	// Every level delivered all it held, once; the group is done.
	require.Eventually(t, func() bool {
		for q := range schedule {
			if backlogAfterCommit(t, e, retry.SchedulerGroup, retry.ScheduleTopic, q) != 0 {
				return false
			}
		}
		return true
	}, svcWait, 5*time.Millisecond)
	require.Never(t, func() bool { return topicHoldsMore(e, rref.Topic, 8) }, 2*schedule[1], 20*time.Millisecond,
		"a redelivery after every level was drained")
	require.Len(t, readTopic(t, e, rref.Topic), 8, "3 + 5 redeliveries, no more")
	require.NoError(t, m.round(ctx))
	lags, err := c.Lag(ctx, grp, "")
	require.NoError(t, err)
	for _, l := range lags {
		require.Zero(t, l.Lag, "%s", l.Queue)
	}

	// Redrive moves the dead letters back to their topic, once.
	n, err := rs.Redrive(ctx, grp, 10)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	n, err = rs.Redrive(ctx, grp, 10)
	require.NoError(t, err)
	require.Zero(t, n)
	before := log.len()
	require.Eventually(t, func() bool {
		require.NoError(t, m.round(ctx))
		return log.len() >= before+3
	}, svcWait, time.Millisecond)
	got, _ := log.snapshot()
	for _, r := range got[before:] {
		require.Equal(t, topic, r.Topic)
		require.Zero(t, r.ReconsumeCount)
		require.Contains(t, failOrigins, r.Properties[retry.PropOriginID])
	}
}

// ---------------------------------------------------------------- pop

// TestServicesPop: two poppers drain a 4-queue topic completely, each
// message once; an unacknowledged message comes back (via the retry topic)
// after its invisible time; an acknowledged one never does;
// ChangeInvisibleTime extends the deadline and replaces the handle.
func TestServicesPop(t *testing.T) {
	ctx := t.Context()
	e := servicesEngine(t)
	const topic, grp = "jobs", "workers"
	backoff := 200 * time.Millisecond
	rs, err := retry.New(e, retry.Options{Schedule: []time.Duration{backoff}, MaxAttempts: 3, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	rs.Start()
	t.Cleanup(func() { _ = rs.Close() })
	ps, err := pop.New(e, rs, pop.Options{MinInvisible: 50 * time.Millisecond, DefaultInvisible: 5 * time.Second, MaxPop: 16})
	require.NoError(t, err)
	ps.Start()
	t.Cleanup(func() { _ = ps.Close() })
	_, err = e.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 4})
	require.NoError(t, err)

	const total = 60
	var msgs []*core.Message
	for i := range total {
		k := "dev-" + strconv.Itoa((i*7)%10)
		msgs = append(msgs, &core.Message{Topic: topic, ShardingKey: k, Body: []byte(strconv.Itoa(i))})
	}
	_, err = e.ProduceBatch(ctx, msgs)
	require.NoError(t, err)

	// Two poppers drain the topic, acknowledging at once.
	var mu sync.Mutex
	got := map[core.MessageID]int{}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for !stop.Load() {
				popped, err := ps.Pop(ctx, pop.Request{Group: grp, Topic: topic, Max: 5, Wait: 100 * time.Millisecond})
				if err != nil {
					t.Errorf("pop: %v", err)
					return
				}
				for _, p := range popped {
					if err := ps.Ack(ctx, p.Handle); err != nil {
						t.Errorf("ack %s: %v", p.Message.ID, err)
					}
					mu.Lock()
					got[p.Message.ID]++
					if p.Attempt != 1 {
						t.Errorf("message %s attempt %d", p.Message.ID, p.Attempt)
					}
					mu.Unlock()
				}
			}
		})
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range got {
			n += c
		}
		return n
	}
	// assert, not require: the poppers must be stopped before the test ends.
	assert.Eventually(t, func() bool { return count() >= total }, svcWait, 5*time.Millisecond)
	assert.Never(t, func() bool { return count() > total }, 200*time.Millisecond, 5*time.Millisecond, "a message popped twice")
	stop.Store(true)
	wg.Wait()
	require.Equal(t, total, count())
	require.Len(t, got, total, "each message once")
	drained := func() {
		t.Helper()
		for q := range 4 {
			require.Zero(t, backlogAfterCommit(t, e, grp, topic, q), "queue %d: committed offset leaves messages behind", q)
		}
	}
	drained()
	none, err := ps.Pop(ctx, pop.Request{Group: grp, Topic: topic, Wait: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, none)

	// Not acknowledged: back after the invisible time and the back-off.
	sent, err := e.Produce(ctx, &core.Message{Topic: topic, ShardingKey: "dev-x", Body: []byte("hang")})
	require.NoError(t, err)
	invisible := 300 * time.Millisecond
	first := pop1(t, ps, pop.Request{Group: grp, Topic: topic, Invisible: invisible, Wait: time.Second})
	require.Equal(t, sent.ID, first.Message.ID)
	require.Equal(t, 1, first.Attempt)
	none, err = ps.Pop(ctx, pop.Request{Group: grp, Topic: topic, Wait: 150 * time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, none, "invisible")
	again := pop1(t, ps, pop.Request{Group: grp, Topic: topic, Invisible: invisible, Wait: svcWait})
	took := time.Since(first.VisibleAt.Add(-invisible))
	require.GreaterOrEqual(t, took, invisible+backoff, "back before its invisible time and back-off")
	require.Equal(t, 2, again.Attempt)
	require.Equal(t, 1, again.Message.ReconsumeCount)
	require.Equal(t, retry.RetryTopic(grp), again.Message.Topic)
	require.Equal(t, sent.ID.String(), again.Message.Properties[retry.PropOriginID])
	require.Equal(t, "hang", string(again.Message.Body))
	require.ErrorIs(t, ps.Ack(ctx, first.Handle), pop.ErrHandleExpired)
	require.NoError(t, ps.Ack(ctx, again.Handle))
	require.ErrorIs(t, ps.Ack(ctx, again.Handle), pop.ErrHandleExpired, "acked twice")
	none, err = ps.Pop(ctx, pop.Request{Group: grp, Topic: topic, Wait: invisible + backoff + 400*time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, none, "acknowledged: gone")

	// ChangeInvisibleTime pushes the deadline out.
	_, err = e.Produce(ctx, &core.Message{Topic: topic, ShardingKey: "dev-y", Body: []byte("slow")})
	require.NoError(t, err)
	slow := pop1(t, ps, pop.Request{Group: grp, Topic: topic, Invisible: 200 * time.Millisecond, Wait: time.Second})
	require.Equal(t, "slow", string(slow.Message.Body))
	h2, err := ps.ChangeInvisibleTime(ctx, slow.Handle, 3*time.Second)
	require.NoError(t, err)
	none, err = ps.Pop(ctx, pop.Request{Group: grp, Topic: topic, Wait: 200*time.Millisecond + backoff + 300*time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, none, "the longer invisible time holds")
	require.ErrorIs(t, ps.Ack(ctx, slow.Handle), pop.ErrHandleExpired, "the old handle is replaced")
	require.NoError(t, ps.Ack(ctx, h2))

	drained()
	require.Zero(t, backlogAfterCommit(t, e, grp, retry.RetryTopic(grp), 0))
}

func pop1(t *testing.T, s *pop.Service, req pop.Request) pop.Popped {
	t.Helper()
	got, err := s.Pop(t.Context(), req)
	require.NoError(t, err)
	require.Len(t, got, 1)
	return got[0]
}

// ---------------------------------------------------------------- delay

// TestServicesDelay: messages delayed 1–3 s through delay.Service.Broker()
// reach their 4-queue topic at their due time, not before, exactly once,
// after passing through the levels of a 4-queue delay topic (one stream);
// undelayed ones pass at once; a cancelled one never arrives.
func TestServicesDelay(t *testing.T) {
	ctx := t.Context()
	e := servicesEngine(t)
	svc, err := delay.New(e, t.TempDir(), delay.Options{Tick: 250 * time.Millisecond, MaxHold: time.Second, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	svc.Start()
	t.Cleanup(func() { _ = svc.Close() })
	require.Equal(t, []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second}, svc.Levels())
	b := svc.Broker()
	const topic = "later"
	_, err = e.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 4})
	require.NoError(t, err)

	start := time.Now()
	due := map[core.MessageID]time.Time{}
	keyOf := map[core.MessageID]string{}
	delayed := func(i int) *core.Message {
		d := time.Second + time.Duration(i%5)*500*time.Millisecond
		k := "dev-" + strconv.Itoa(i%4)
		return &core.Message{Topic: topic, ShardingKey: k, Keys: []string{"job-" + strconv.Itoa(i)}, Body: []byte("d" + strconv.Itoa(i)),
			Properties: map[string]string{"i": strconv.Itoa(i)}, DeliverAt: start.Add(d)}
	}
	note := func(m *core.Message, r core.SendResult) {
		t.Helper()
		require.Equal(t, topic, r.Topic)
		require.Equal(t, -1, r.Queue)
		require.EqualValues(t, -1, r.QueueOffset)
		due[r.ID] = m.DeliverAt
		keyOf[r.ID] = m.ShardingKey
	}
	var batch []*core.Message
	for i := range 10 {
		batch = append(batch, delayed(i))
	}
	batch = append(batch, &core.Message{Topic: topic, ShardingKey: "now-0", Body: []byte("now-0")})
	res, err := b.ProduceBatch(ctx, batch)
	require.NoError(t, err)
	for i, r := range res[:10] {
		note(batch[i], r)
	}
	for i := 10; i < 19; i++ {
		m := delayed(i)
		r, err := b.Produce(ctx, m)
		require.NoError(t, err)
		note(m, r)
	}
	type asyncResult struct {
		res []core.SendResult
		err error
	}
	asyncDone := make(chan asyncResult, 1)
	async := []*core.Message{delayed(19), {Topic: topic, ShardingKey: "now-1", Body: []byte("now-1")}}
	b.ProduceAsync(async, func(res []core.SendResult, err error) { asyncDone <- asyncResult{res, err} })
	ar := <-asyncDone
	require.NoError(t, ar.err)
	note(async[0], ar.res[0])
	_, err = b.Produce(ctx, &core.Message{Topic: topic, ShardingKey: "now-2", Body: []byte("now-2")})
	require.NoError(t, err)

	// One is cancelled while it waits.
	victim, err := b.Produce(ctx, &core.Message{Topic: topic, ShardingKey: "dev-9", Body: []byte("cancelled"), DeliverAt: start.Add(2500 * time.Millisecond)})
	require.NoError(t, err)
	p, err := svc.Lookup(ctx, victim.ID)
	require.NoError(t, err)
	require.Equal(t, topic, p.Topic)
	require.False(t, p.Cancelled)
	p, err = svc.Cancel(ctx, victim.ID)
	require.NoError(t, err)
	require.True(t, p.Cancelled)
	_, err = svc.Cancel(ctx, victim.ID)
	require.ErrorIs(t, err, delay.ErrAlreadyCancelled)

	// The undelayed ones are there at once; of the delayed ones only those
	// already due (none unless the setup was slow).
	now := readTopic(t, e, topic)
	readAt := time.Now()
	var undelayed []string
	for _, m := range now {
		if v := m.Properties[delay.PropID]; v != "" {
			id, err := core.ParseMessageID(v)
			require.NoError(t, err)
			require.False(t, due[id].After(readAt), "%s arrived %v early", m.Body, due[id].Sub(readAt))
			continue
		}
		undelayed = append(undelayed, string(m.Body))
	}
	require.ElementsMatch(t, []string{"now-0", "now-1", "now-2"}, undelayed)
	t.Logf("setup took %v; %d delayed messages already there", readAt.Sub(start), len(now)-len(undelayed))

	delivered := func() []*core.StoredMessage {
		var out []*core.StoredMessage
		for _, m := range readTopic(t, e, topic) {
			if m.Properties[delay.PropID] != "" {
				out = append(out, m)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(delivered()) >= len(due) }, svcWait, 20*time.Millisecond)
	// Until past every due time, the cancelled one's too, nothing more comes.
	require.Never(t, func() bool { return topicHoldsMore(e, topic, len(due)+3) }, time.Until(start.Add(3*time.Second+800*time.Millisecond)),
		20*time.Millisecond, "a delayed message delivered twice, or the cancelled one delivered")

	got := delivered()
	require.Len(t, got, len(due), "exactly once each")
	all := readTopic(t, e, topic)
	require.Len(t, all, len(due)+3, "the cancelled message never arrives")
	seen := map[core.MessageID]bool{}
	var worst time.Duration
	for _, m := range got {
		id, err := core.ParseMessageID(m.Properties[delay.PropID])
		require.NoError(t, err)
		d, ok := due[id]
		require.True(t, ok, "unknown delayed message %s", id)
		require.False(t, seen[id], "%s delivered twice", id)
		seen[id] = true
		require.False(t, m.StoredAt.Before(d), "%s (%s) stored %v before its due time", id, m.Body, d.Sub(m.StoredAt))
		require.True(t, m.DeliverAt.Equal(d))
		require.Equal(t, keyOf[id], m.ShardingKey)
		require.Equal(t, core.QueueFor(keyOf[id], 4), m.Queue)
		require.NotContains(t, m.Properties, delay.PropTopic)
		late := m.StoredAt.Sub(d)
		require.Less(t, late, time.Second, "%s late by %v", id, late)
		worst = max(worst, late)
	}
	t.Logf("delayed delivery: %d messages, worst lateness %v", len(got), worst)

	for id := range due {
		_, err := svc.Lookup(ctx, id)
		require.ErrorIs(t, err, delay.ErrAlreadyDue)
		break
	}
	require.Eventually(t, func() bool {
		st, err := svc.Stats(ctx)
		require.NoError(t, err)
		return st.Delivered == int64(len(due)) && st.Dropped == 1 && !slices.ContainsFunc(st.Waiting, func(n int64) bool { return n != 0 })
	}, svcWait, 20*time.Millisecond)
}

// ---------------------------------------------------------------- txn

// txnChecker queues check-backs for the test to answer.
type txnChecker struct{ ch chan *core.StoredMessage }

func (c *txnChecker) CheckTransaction(h *core.StoredMessage) error {
	select {
	case c.ch <- h:
		return nil
	default:
		return errors.New("checker full")
	}
}

func (c *txnChecker) next(t *testing.T) (*core.StoredMessage, time.Time) {
	t.Helper()
	select {
	case h := <-c.ch:
		return h, time.Now()
	case <-time.After(svcWait):
		t.Fatal("no check-back")
		return nil, time.Time{}
	}
}

// TestServicesTxn: a committed half becomes visible in its 4-queue topic, a
// rolled-back one never does, a pending one is checked back after
// FirstCheck and resolved by the answer; a half pending across a restart is
// recovered and checked back.
func TestServicesTxn(t *testing.T) {
	ctx := t.Context()
	e := servicesEngine(t)
	const topic, pg = "payments", "pay-svc"
	opts := txn.Options{FirstCheck: 400 * time.Millisecond, CheckInterval: 400 * time.Millisecond, MaxChecks: 5, PollInterval: 20 * time.Millisecond}
	ts, err := txn.New(e, opts)
	require.NoError(t, err)
	require.NoError(t, ts.Start(ctx))
	t.Cleanup(func() { _ = ts.Close() })
	chk := &txnChecker{ch: make(chan *core.StoredMessage, 64)}
	t.Cleanup(ts.Register(pg, chk))
	_, err = e.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 4})
	require.NoError(t, err)

	msg := func(body, key string) *core.Message {
		return &core.Message{Topic: topic, ShardingKey: key, Keys: []string{"pay-" + body}, Tag: "t",
			Properties: map[string]string{"app": body, "txn.forged": "x"}, Body: []byte(body)}
	}
	ha, err := ts.SendHalf(ctx, pg, msg("a", "acct-1"))
	require.NoError(t, err)
	require.Equal(t, topic, ha.Topic)
	require.Equal(t, -1, ha.Queue)
	hb, err := ts.SendHalf(ctx, pg, msg("b", "acct-2"))
	require.NoError(t, err)
	hc, err := ts.SendHalf(ctx, pg, msg("c", "acct-3"))
	require.NoError(t, err)
	require.Empty(t, readTopic(t, e, topic), "halves are invisible")

	ra, err := ts.End(ctx, ha.ID, pg, txn.Commit, false)
	require.NoError(t, err)
	require.Equal(t, topic, ra.Topic)
	require.Equal(t, core.QueueFor("acct-1", 4), ra.Queue)
	m, err := e.Get(ctx, ra.ID)
	require.NoError(t, err)
	require.Equal(t, "a", string(m.Body))
	require.Equal(t, "acct-1", m.ShardingKey)
	require.Equal(t, []string{"pay-a"}, m.Keys)
	require.Equal(t, map[string]string{"app": "a", txn.PropHalfID: ha.ID.String()}, m.Properties)

	_, err = ts.End(ctx, hb.ID, pg, txn.Rollback, false)
	require.NoError(t, err)
	_, err = ts.End(ctx, hb.ID, pg, txn.Commit, false)
	require.ErrorIs(t, err, txn.ErrResolved)
	for id, want := range map[core.MessageID]txn.State{ha.ID: txn.StateCommitted, hb.ID: txn.StateRolledBack, hc.ID: txn.StatePending} {
		st, err := ts.State(id)
		require.NoError(t, err)
		require.Equal(t, want, st)
	}

	// c is checked back after FirstCheck; the answer commits it.
	h, at := chk.next(t)
	require.Equal(t, hc.ID, h.ID)
	require.GreaterOrEqual(t, at.Sub(hc.StoredAt), opts.FirstCheck, "checked back early")
	rc, err := ts.End(ctx, h.ID, "", txn.Commit, true)
	require.NoError(t, err)
	require.Equal(t, core.QueueFor("acct-3", 4), rc.Queue)
	require.Never(t, func() bool { return len(chk.ch) > 0 }, opts.FirstCheck+opts.CheckInterval, 10*time.Millisecond,
		"a resolved half was checked back")
	require.Empty(t, chk.ch, "resolved halves are not checked")
	require.ElementsMatch(t, []string{"a", "c"}, bodiesOf(readTopic(t, e, topic)))
	require.Empty(t, ts.Pending())
	st := ts.Stats()
	require.Equal(t, txn.Stats{Committed: 2, RolledBack: 1, Checks: 1}, st)

	// A half pending across a restart is recovered and checked back.
	hd, err := ts.SendHalf(ctx, pg, msg("d", "acct-4"))
	require.NoError(t, err)
	require.NoError(t, ts.Close())
	ts2, err := txn.New(e, opts)
	require.NoError(t, err)
	require.NoError(t, ts2.Start(ctx))
	t.Cleanup(func() { _ = ts2.Close() })
	pend := ts2.Pending()
	require.Len(t, pend, 1)
	require.Equal(t, hd.ID, pend[0].ID)
	stA, err := ts2.State(ha.ID)
	require.NoError(t, err)
	require.Equal(t, txn.StateCommitted, stA)
	_, err = ts2.End(ctx, hb.ID, pg, txn.Commit, false)
	require.ErrorIs(t, err, txn.ErrResolved)
	chk2 := &txnChecker{ch: make(chan *core.StoredMessage, 64)}
	t.Cleanup(ts2.Register(pg, chk2))
	h, _ = chk2.next(t)
	require.Equal(t, hd.ID, h.ID)
	_, err = ts2.End(ctx, h.ID, pg, txn.Rollback, true)
	require.NoError(t, err)
	std, err := ts2.State(hd.ID)
	require.NoError(t, err)
	require.Equal(t, txn.StateRolledBack, std)
	require.ElementsMatch(t, []string{"a", "c"}, bodiesOf(readTopic(t, e, topic)))
}

// ---------------------------------------------------------------- query, trace

// TestServicesQueryTrace: queries by key, index key, client and time range
// over a 4-queue topic return the right messages in store order, paged;
// the hops a traced message meets (group delivery and commit) are found by
// trace.Lookup in the 4-queue trace topic.
func TestServicesQueryTrace(t *testing.T) {
	ctx := t.Context()
	e := servicesEngine(t)
	rec, err := trace.New(e, trace.Options{Topics: []string{"tel"}})
	require.NoError(t, err)
	rec.Start()
	t.Cleanup(func() { _ = rec.Close() })
	_, err = e.CreateTopic(ctx, core.TopicConfig{Name: "tel", Queues: 4})
	require.NoError(t, err)
	var stored []*core.StoredMessage
	for i := range 30 {
		c := "car-" + strconv.Itoa(i%3)
		r, err := e.Produce(ctx, &core.Message{Topic: "tel", ShardingKey: c, Keys: []string{"order-" + strconv.Itoa(i)},
			Properties: map[string]string{query.PropClientID: c}, Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
		m, err := e.Get(ctx, r.ID)
		require.NoError(t, err)
		stored = append(stored, m)
	}
	for i := range 5 {
		_, err := e.Produce(ctx, &core.Message{Topic: "other", ShardingKey: "car-0", Properties: map[string]string{query.PropClientID: "car-0"},
			Body: []byte("o" + strconv.Itoa(i))})
		require.NoError(t, err)
	}
	queues := map[int]bool{}
	for _, m := range stored {
		queues[m.Queue] = true
	}
	require.Len(t, queues, 3, "three keys on three queues")

	pages := func(req query.Request) [][]string {
		t.Helper()
		var out [][]string
		for range 100 {
			res, err := query.Run(ctx, e, req)
			require.NoError(t, err)
			out = append(out, bodiesOf(res.Messages))
			if res.Next == "" {
				return out
			}
			req.Cursor = res.Next
		}
		t.Fatal("cursor never ended")
		return nil
	}
	require.Equal(t, [][]string{{"1", "4", "7", "10"}, {"13", "16", "19", "22"}, {"25", "28"}}, pages(query.Request{Topic: "tel", Key: "car-1", Max: 4}))
	require.Equal(t, [][]string{{"7"}}, pages(query.Request{Topic: "tel", Key: "order-7"}), "index keys too")
	require.Equal(t, [][]string{{"0", "3", "6", "9", "12", "15", "18", "21", "24", "27", "o0", "o1", "o2", "o3", "o4"}},
		pages(query.Request{ClientID: "car-0", Max: 100}))
	require.Equal(t, [][]string{{"12", "15", "18"}},
		pages(query.Request{Topic: "tel", Key: "car-0", Begin: stored[10].StoredAt, End: stored[20].StoredAt}))
	require.Equal(t, [][]string{{"5", "6", "7", "8", "9"}, {"10", "11", "12", "13", "14"}, {"15", "16"}},
		pages(query.Request{Topic: "tel", Begin: stored[5].StoredAt, End: stored[16].StoredAt, Max: 5}), "time range merges the queues")
	require.Equal(t, [][]string{{"28", "29"}}, pages(query.Request{Topic: "tel", Begin: stored[28].StoredAt}))

	// Trace: a group member consumes one queue and commits.
	c, err := group.New(e, group.Options{CheckInterval: 50 * time.Millisecond, Trace: rec})
	require.NoError(t, err)
	c.Start()
	t.Cleanup(func() { _ = c.Close() })
	target := stored[7]
	var untouched *core.StoredMessage
	for _, m := range stored {
		if m.Queue != target.Queue {
			untouched = m
			break
		}
	}
	rec.Record(trace.Event{ID: target.ID, Hop: trace.HopStored, At: target.StoredAt, Actor: "test"})
	_, err = c.Heartbeat(ctx, group.HeartbeatRequest{Group: "ops", ClientID: "m1", Subscriptions: []group.Subscription{{Topic: "tel"}}})
	require.NoError(t, err)
	ref := group.QueueRef{Topic: "tel", Queue: target.Queue}
	res, err := c.Pull(ctx, group.PullRequest{Group: "ops", ClientID: "m1", Queue: ref, Offset: -1, Max: 100})
	require.NoError(t, err)
	require.Len(t, res.Messages, 10)
	require.NoError(t, c.Commit(ctx, "ops", "m1", ref, res.NextOffset))
	require.NoError(t, rec.Close()) // writes everything
	evs, err := trace.Lookup(ctx, e, target.ID, 0)
	require.NoError(t, err)
	var hops []string
	for _, ev := range evs {
		hops = append(hops, ev.Hop)
	}
	require.Equal(t, []string{trace.HopStored, trace.HopDelivered, trace.HopCommitted}, hops)
	require.Equal(t, strconv.FormatInt(target.QueueOffset, 10), evs[1].Attrs["offset"])
	require.Equal(t, strconv.FormatInt(res.NextOffset, 10), evs[2].Attrs["committed"])
	for _, m := range res.Messages {
		evs, err := trace.Lookup(ctx, e, m.ID, 0)
		require.NoError(t, err)
		require.GreaterOrEqual(t, len(evs), 2, "message %s", m.Body)
	}
	none, err := trace.Lookup(ctx, e, untouched.ID, 0)
	require.NoError(t, err)
	require.Empty(t, none)
}

// TestServicesPopMaxInflight: pop.Options.MaxInflight bounds a queue's
// in-flight span, and "a queue at the bound hands out nothing more until
// its oldest message is acknowledged or expires" — so acknowledging the
// oldest must let more out, as on the embedded engine
// (core/pop TestMaxInflightBoundsAQueue), even when other queues' messages
// sit between this queue's offsets.
func TestServicesPopMaxInflight(t *testing.T) {
	ctx := t.Context()
	e := servicesEngine(t)
	rs, err := retry.New(e, retry.Options{Schedule: []time.Duration{time.Second}, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	rs.Start()
	t.Cleanup(func() { _ = rs.Close() })
	ps, err := pop.New(e, rs, pop.Options{MinInvisible: 50 * time.Millisecond, MaxInflight: 4})
	require.NoError(t, err)
	ps.Start()
	t.Cleanup(func() { _ = ps.Close() })
	const topic = "bounded"
	_, err = e.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 4})
	require.NoError(t, err)
	// Ten messages of queue 0, each followed by one of every other queue.
	keys := core.QueueKeys(4)
	for i := range 10 {
		for q, k := range keys {
			tag := "other"
			if q == 0 {
				tag = "mine"
			}
			_, err := e.Produce(ctx, &core.Message{Topic: topic, ShardingKey: k, Tag: tag, Body: fmt.Appendf(nil, "%d/%d", q, i)})
			require.NoError(t, err)
		}
	}
	req := pop.Request{Group: "g", Topic: topic, Tags: []string{"mine"}, Max: 10, Invisible: time.Minute}
	got, err := ps.Pop(ctx, req)
	require.NoError(t, err)
	require.Equal(t, []string{"0/0", "0/1", "0/2", "0/3"}, bodiesOfPopped(got), "MaxInflight 4")
	more, err := ps.Pop(ctx, req)
	require.NoError(t, err)
	require.Empty(t, more, "at the bound")
	require.NoError(t, ps.Ack(ctx, got[1].Handle))
	more, err = ps.Pop(ctx, req)
	require.NoError(t, err)
	require.Empty(t, more, "the bound spans from the oldest message not done")
	require.NoError(t, ps.Ack(ctx, got[0].Handle))
	more, err = ps.Pop(ctx, req)
	require.NoError(t, err)
	// Fails on the JetStream engine: core/pop measures the span as
	// cursor − watermark in queue offsets, which here also count the
	// messages of the three other queues (see the report).
	require.Equal(t, []string{"0/4", "0/5"}, bodiesOfPopped(more), "the oldest acknowledged: two more")
}

func bodiesOfPopped(ps []pop.Popped) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, string(p.Message.Body))
	}
	return out
}
