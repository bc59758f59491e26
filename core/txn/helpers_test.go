package txn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every wait of these tests.
const waitFor = 10 * time.Second

// Check schedule of the tests: the clock is fake and moved by hand.
const (
	firstCheck    = 6 * time.Second
	checkInterval = 30 * time.Second
)

// clock is a fake clock shared by the store and the Service, so store
// times and check times agree.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now().Round(0)} } // no monotonic reading: times compare with ==

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// env is a store and a started Service on it, in one directory, that can be
// restarted.
type env struct {
	t    testing.TB
	dir  string
	clk  *clock
	opts Options
	b    *store.Store
	s    *Service
}

// newEnv opens a store and a started Service; opts gets the fake clock, the
// test schedule and a small PollInterval unless set.
func newEnv(t testing.TB, opts Options) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir(), clk: newClock()}
	if opts.FirstCheck == 0 {
		opts.FirstCheck = firstCheck
	}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = checkInterval
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 2 * time.Millisecond
	}
	opts.Now = e.clk.Now
	e.opts = opts
	e.open()
	t.Cleanup(e.close)
	return e
}

func (e *env) open() {
	e.t.Helper()
	b, err := store.Open(e.dir, store.Options{Now: e.clk.Now})
	require.NoError(e.t, err)
	e.b = b
	s, err := New(b, e.opts)
	require.NoError(e.t, err)
	e.s = s
	require.NoError(e.t, s.Start(context.Background()))
}

func (e *env) close() {
	e.t.Helper()
	require.NoError(e.t, e.s.Close())
	require.NoError(e.t, e.b.Close())
}

// restart closes the Service and the store and opens both again.
func (e *env) restart() {
	e.t.Helper()
	e.close()
	e.open()
}

// send stores a half message of group for topic "orders" with every field
// set; i tells messages apart.
func (e *env) send(group string, i int) core.SendResult {
	e.t.Helper()
	res, err := e.s.SendHalf(context.Background(), group, testMessage(i))
	require.NoError(e.t, err)
	return res
}

func testMessage(i int) *core.Message {
	return &core.Message{
		Topic:       "orders",
		ShardingKey: fmt.Sprintf("dev-%d", i),
		Tag:         "tag-a",
		Keys:        []string{fmt.Sprintf("order-%d", i)},
		Properties:  map[string]string{"app.i": fmt.Sprint(i)},
		Body:        []byte(fmt.Sprintf("body-%d", i)),
		BornAt:      time.Unix(1_700_000_000, int64(i)),
	}
}

// visible reads every queue of topic: what its consumers can see.
func (e *env) visible(topic string) []*core.StoredMessage {
	e.t.Helper()
	info, err := e.b.Topic(context.Background(), topic)
	if errors.Is(err, core.ErrTopicNotFound) {
		return nil
	}
	require.NoError(e.t, err)
	var out []*core.StoredMessage
	for q := range info.Queues {
		out = append(out, readQueue(e.t, e.b, topic, q)...)
	}
	return out
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

// ops returns the op records of HalfTopic about id, in order.
func (e *env) ops(id core.MessageID) []string {
	e.t.Helper()
	var out []string
	for _, m := range readQueue(e.t, e.b, HalfTopic, 0) {
		if m.Properties[PropHalfID] == id.String() {
			out = append(out, m.Properties[PropOp])
		}
	}
	return out
}

// pending returns the Service's one pending half.
func (e *env) pending() PendingInfo {
	e.t.Helper()
	p := e.s.Pending()
	require.Len(e.t, p, 1)
	return p[0]
}

// waitChecks waits until the one pending half has had n checks.
func (e *env) waitChecks(n int) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		p := e.s.Pending()
		return len(p) == 1 && p[0].Checks == n
	}, waitFor, time.Millisecond, "waiting for check %d", n)
}

// waitState waits until the half id is in state st.
func (e *env) waitState(id core.MessageID, st State) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		got, err := e.s.State(id)
		return err == nil && got == st
	}, waitFor, time.Millisecond, "waiting for %s", st)
}

// barrier proves the checker has handled every half due now: it sends a
// sentinel half of group, moves the clock to its first check and waits for
// that check. Halves are checked in due order, so a check of an earlier
// due half would have reached p first — expectNone then finds nothing.
func (e *env) barrier(group string, p *probe) {
	e.t.Helper()
	sentinel := e.send(group, 999)
	e.clk.Advance(e.opts.FirstCheck)
	got := p.next(e.t)
	require.Equal(e.t, sentinel.ID, got.ID, "a check came for another half first")
	_, err := e.s.End(context.Background(), sentinel.ID, group, Rollback, true)
	require.NoError(e.t, err)
}

// probe is a Checker that hands every check-back to the test.
type probe struct {
	ch   chan *core.StoredMessage
	fail atomic.Bool // refuse every check, like a producer that is gone
}

func newProbe() *probe { return &probe{ch: make(chan *core.StoredMessage, 256)} }

func (p *probe) CheckTransaction(h *core.StoredMessage) error {
	if p.fail.Load() {
		return errors.New("producer gone")
	}
	select {
	case p.ch <- h:
		return nil
	default:
		return errors.New("probe full")
	}
}

// next waits for the next check-back.
func (p *probe) next(t testing.TB) *core.StoredMessage {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	select {
	case h := <-p.ch:
		return h
	case <-timer.C:
		t.Fatal("no check-back came")
		return nil
	}
}

// expectNone checks that no check-back is waiting.
func (p *probe) expectNone(t testing.TB) {
	t.Helper()
	select {
	case h := <-p.ch:
		t.Fatalf("unexpected check-back of %s", h.ID)
	default:
	}
}
