package alarm

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a test's time: the rules' periods are minutes, the tests move
// it instead of waiting.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// gauge is a value a test sets and a probe reads.
type gauge struct{ v atomic.Int64 }

func (g *gauge) read(context.Context) (Values, error) { return Values{"q": float64(g.v.Load())}, nil }

// recorder keeps what Options.Store got.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) store(_ context.Context, es []Event) error {
	r.mu.Lock()
	r.events = append(r.events, es...)
	r.mu.Unlock()
	return nil
}

func (r *recorder) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

func states(es []Event) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = string(e.Kind) + " " + e.Subject + " " + e.State
	}
	return out
}

// value reads a counter.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func newMonitor(t *testing.T, o Options) *Monitor {
	t.Helper()
	m, err := New(o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	return m
}

// One alarm per condition: raised once however many evaluations find it
// true, cleared once after the condition was false for ClearAfter.
func TestRaiseOnceClearOnce(t *testing.T) {
	c, g, rec := newClock(), &gauge{}, &recorder{}
	m := newMonitor(t, Options{Now: c.Now, ClearAfter: 30 * time.Second, Store: rec.store, Node: "n1",
		Probes: []Probe{Above(KindGroupLag, 100, g.read, nil)}})
	ctx := t.Context()
	step := func(v int64) {
		g.v.Store(v)
		m.Evaluate(ctx)
		c.add(10 * time.Second)
	}
	step(10)
	require.Empty(t, rec.all())
	for _, v := range []int64{150, 200, 300, 50, 250} { // 50: false for less than ClearAfter
		step(v)
	}
	require.Equal(t, []string{"group_lag q raised"}, states(rec.all()))
	act := m.Active()
	require.Len(t, act, 1)
	require.Equal(t, 250.0, act[0].Value, "the active alarm shows the value now")
	require.Equal(t, 100.0, act[0].Threshold)
	require.Equal(t, "n1", act[0].Node)
	for range 3 {
		step(20)
	}
	require.Equal(t, []string{"group_lag q raised", "group_lag q cleared"}, states(rec.all()))
	cleared := rec.all()[1]
	require.Equal(t, 20.0, cleared.Value)
	require.Equal(t, rec.all()[0].Since, cleared.Since)
	require.True(t, cleared.Time.After(cleared.Since))
	require.Empty(t, m.Active())
	require.Equal(t, states([]Event{cleared, rec.all()[0]}), states(m.Recent(0)), "recent: the newest first")
}

// A probe that fails leaves its alarms alone: it could not tell.
func TestProbeErrorKeepsItsAlarms(t *testing.T) {
	c, rec := newClock(), &recorder{}
	var fail atomic.Bool
	active := true
	p := ProbeFunc(func(context.Context, time.Time) ([]Reading, error) {
		if fail.Load() {
			return nil, context.DeadlineExceeded
		}
		return []Reading{{Kind: KindNATSUnreachable, Subject: "nats", Active: active}}, nil
	})
	m := newMonitor(t, Options{Now: c.Now, ClearAfter: -1, Store: rec.store, Probes: []Probe{p}})
	m.Evaluate(t.Context())
	fail.Store(true)
	for range 3 {
		c.add(time.Minute)
		m.Evaluate(t.Context())
	}
	require.Len(t, m.Active(), 1)
	fail.Store(false)
	active = false
	m.Evaluate(t.Context())
	require.Equal(t, []string{"nats_unreachable nats raised", "nats_unreachable nats cleared"}, states(rec.all()))
}

func TestDisabledKindsAreNeverRaised(t *testing.T) {
	g, rec := &gauge{}, &recorder{}
	g.v.Store(1000)
	m := newMonitor(t, Options{Store: rec.store, Disabled: []Kind{KindGroupLag}, Probes: []Probe{Above(KindGroupLag, 1, g.read, nil)}})
	m.Evaluate(t.Context())
	require.Empty(t, rec.all())
	_, err := New(Options{Disabled: []Kind{"no_such_kind"}})
	require.ErrorIs(t, err, ErrBadOptions)
}

// run evaluates p at each value, one step apart, and returns whether it was
// active after each.
func run(t *testing.T, p Probe, c *clock, step time.Duration, values []float64, set func(float64)) []bool {
	t.Helper()
	out := make([]bool, len(values))
	for i, v := range values {
		set(v)
		rs, err := p.Check(t.Context(), c.Now())
		require.NoError(t, err)
		for _, r := range rs {
			out[i] = out[i] || r.Active
		}
		c.add(step)
	}
	return out
}

func TestRules(t *testing.T) {
	var v float64
	read := func(context.Context) (Values, error) { return Values{"s": v}, nil }
	set := func(x float64) { v = x }
	t.Run("growing through the whole period", func(t *testing.T) {
		c := newClock()
		p := Growing(KindGroupLagGrowing, 30*time.Second, read, nil)
		got := run(t, p, c, 10*time.Second, []float64{1, 2, 3, 4, 5, 5, 4, 5, 6, 7, 8}, set)
		// Active once 30s of history all grew; a flat step keeps it (no sample
		// below the one before), a fall clears it until 30s of growth again.
		require.Equal(t, []bool{false, false, false, true, true, true, false, false, false, true, true}, got)
	})
	t.Run("rate over the window", func(t *testing.T) {
		c := newClock()
		p := Rate(KindDisconnectRate, 2, 20*time.Second, read, nil)
		got := run(t, p, c, 10*time.Second, []float64{0, 10, 50, 100, 110, 120, 130}, set)
		// 1/s, 2.5/s, 4.5/s, 3/s, 1/s, 1/s
		require.Equal(t, []bool{false, false, true, true, true, false, false}, got)
	})
	t.Run("arrivals until a quiet period", func(t *testing.T) {
		c := newClock()
		p := Arrivals(KindDeadLetters, 25*time.Second, read, nil)
		got := run(t, p, c, 10*time.Second, []float64{7, 7, 8, 8, 8, 8, 9, 3, 3}, set)
		// 7 is the baseline; 8 arrives, quiet after 25s; 9 arrives; the
		// counter restarting (3) is a new baseline, not an arrival.
		require.Equal(t, []bool{false, false, true, true, true, false, true, true, true}, got)
	})
	t.Run("arrivals of a subject that appears later count from 0", func(t *testing.T) {
		c := newClock()
		vs := Values{"old": 5}
		p := Arrivals(KindDeadLetters, time.Minute, func(context.Context) (Values, error) { return vs, nil }, nil)
		rs, err := p.Check(t.Context(), c.Now())
		require.NoError(t, err)
		require.Empty(t, rs, "the first evaluation: baselines")
		vs = Values{"old": 5, "new": 3} // a dead-letter topic created by its first 3 messages
		rs, err = p.Check(t.Context(), c.Now().Add(10*time.Second))
		require.NoError(t, err)
		active := map[string]float64{}
		for _, r := range rs {
			if r.Active {
				active[r.Subject] = r.Value
			}
		}
		require.Equal(t, map[string]float64{"new": 3}, active)
	})
	t.Run("deadline", func(t *testing.T) {
		c := newClock()
		ts := map[string]time.Time{"cert": c.Now().Add(48 * time.Hour)}
		p := Deadline(KindCertExpiry, 72*time.Hour, func(context.Context) (map[string]time.Time, error) { return ts, nil }, nil)
		rs, err := p.Check(t.Context(), c.Now())
		require.NoError(t, err)
		require.True(t, rs[0].Active)
		require.InDelta(t, 2.0, rs[0].Value, 1e-9)
		require.InDelta(t, 3.0, rs[0].Threshold, 1e-9)
		rs, err = p.Check(t.Context(), c.Now().Add(-48*time.Hour))
		require.NoError(t, err)
		require.False(t, rs[0].Active)
	})
	t.Run("quantile above over the window", func(t *testing.T) {
		c := newClock()
		h := Histogram{Bounds: []float64{0.01, 0.1, 1}, Counts: []int64{0, 0, 0, 0}}
		p := QuantileAbove(KindFsyncSlow, "commitlog", 0.99, 0.05, 20*time.Second, 10,
			func(context.Context) (Histogram, error) {
				return Histogram{Bounds: h.Bounds, Counts: append([]int64(nil), h.Counts...)}, nil
			}, nil)
		check := func() Reading {
			rs, err := p.Check(t.Context(), c.Now())
			require.NoError(t, err)
			c.add(10 * time.Second)
			if len(rs) == 0 {
				return Reading{}
			}
			return rs[0]
		}
		require.False(t, check().Active) // no window yet
		h.Counts[0] += 100
		require.False(t, check().Active) // all fast
		h.Counts[0] += 95
		h.Counts[2] += 5
		r := check()
		require.True(t, r.Active, "5 %% at up to 1s: p99 1s")
		require.Equal(t, 1.0, r.Value)
		h.Counts[0] += 3
		require.True(t, check().Active, "the window still holds the slow ones")
		require.False(t, check().Active, "3 fsyncs in the window: fewer than the minimum")
		h.Counts[0] += 200
		r = check()
		require.False(t, r.Active, "the slow ones left the window")
		require.Equal(t, 0.01, r.Value)
	})
	t.Run("condition", func(t *testing.T) {
		now := map[string]string{"tcp": "anonymous"}
		p := Condition(KindAnonymous, func(context.Context) (map[string]string, error) { return now, nil })
		rs, err := p.Check(t.Context(), time.Now())
		require.NoError(t, err)
		require.Equal(t, []Reading{{Kind: KindAnonymous, Subject: "tcp", Active: true, Value: 1, Message: "anonymous"}}, rs)
		now = map[string]string{}
		rs, err = p.Check(t.Context(), time.Now())
		require.NoError(t, err)
		require.Equal(t, []Reading{{Kind: KindAnonymous, Subject: "tcp"}}, rs)
	})
}

// The webhook is a real HTTP server: it fails twice (503), then takes the
// event; a 400 is not retried.
func TestWebhookRetriesUntilAccepted(t *testing.T) {
	var calls atomic.Int32
	got := make(chan Event, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		require.Equal(t, "secret", r.Header.Get("Authorization"))
		require.Equal(t, "application/json", r.Header.Get("Content-Type"))
		if n <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		var e Event
		if err := json.NewDecoder(r.Body).Decode(&e); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		got <- e
	}))
	defer srv.Close()
	g := &gauge{}
	g.v.Store(500)
	m := newMonitor(t, Options{Interval: time.Hour, Probes: []Probe{Above(KindGroupLag, 100, g.read, nil)},
		Webhooks: []Webhook{{URL: srv.URL, Headers: map[string]string{"Authorization": "secret"}, Backoff: 10 * time.Millisecond}}})
	m.Start()
	select {
	case e := <-got:
		require.Equal(t, KindGroupLag, e.Kind)
		require.Equal(t, StateRaised, e.State)
		require.Equal(t, 500.0, e.Value)
	case <-time.After(10 * time.Second):
		t.Fatal("webhook got nothing")
	}
	require.EqualValues(t, 3, calls.Load())
	require.Equal(t, 2.0, value(m.metrics.webhookFailures))
	require.Eventually(t, func() bool { return value(m.metrics.webhookSent) == 1 }, 5*time.Second, 5*time.Millisecond)
}

// A webhook that hangs holds up nothing: evaluations go on, its queue keeps
// the newest events and counts the dropped ones.
func TestWebhookQueueDropsTheOldest(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := newClock()
	var v atomic.Bool
	p := ProbeFunc(func(context.Context, time.Time) ([]Reading, error) {
		return []Reading{{Kind: KindStoreFailed, Subject: "store", Active: v.Load()}}, nil
	})
	m := newMonitor(t, Options{Now: c.Now, ClearAfter: -1, Probes: []Probe{p},
		Webhooks: []Webhook{{URL: srv.URL, Queue: 2, Timeout: time.Hour}}})
	m.Start()
	v.Store(true)
	m.Evaluate(t.Context())
	<-arrived // the first event is being posted
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i < 10; i++ { // 9 more events: cleared, raised, …
			v.Store(i%2 == 0)
			m.Evaluate(t.Context())
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("evaluations blocked behind a hanging webhook")
	}
	// One is being posted, two wait, the rest were dropped.
	require.Eventually(t, func() bool { return value(m.metrics.webhookDropped) == 7 }, 5*time.Second, 5*time.Millisecond)
}

// A restarted node takes up the alarms it had raised, from %ALARM% in a
// real store: one that still holds is not raised again, one that no longer
// holds is cleared.
func TestRestoreFromTheTopic(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(dir, store.Options{})
	require.NoError(t, err)
	log := &Log{B: st}
	c := newClock()
	lag, dl := &gauge{}, &gauge{}
	lag.v.Store(500)
	dl.v.Store(500)
	probes := func() []Probe {
		return []Probe{Above(KindGroupLag, 100, lag.read, nil), Above(KindDelayOverdue, 100, dl.read, nil)}
	}
	m1 := newMonitor(t, Options{Now: c.Now, Node: "n1", ClearAfter: -1, Probes: probes(), Store: log.Store, Restore: log.Restore})
	m1.Start()
	require.Eventually(t, func() bool { return len(m1.Active()) == 2 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, m1.Close())
	require.NoError(t, st.Close())

	st, err = store.Open(dir, store.Options{})
	require.NoError(t, err)
	defer st.Close()
	log = &Log{B: st}
	dl.v.Store(0)
	c.add(time.Minute)
	rec := &recorder{}
	m2 := newMonitor(t, Options{Now: c.Now, Node: "n1", ClearAfter: -1, Probes: probes(), Restore: log.Restore,
		Store: func(ctx context.Context, es []Event) error {
			err := log.Store(ctx, es)
			_ = rec.store(ctx, es)
			return err
		}})
	m2.Start()
	require.Eventually(t, func() bool { return len(rec.all()) > 0 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"delay_overdue q cleared"}, states(rec.all()))
	act := m2.Active()
	require.Len(t, act, 1)
	require.Equal(t, KindGroupLag, act[0].Kind)
	require.Equal(t, newClock().Now(), act[0].Since.UTC(), "raised before the restart, and still since then")

	events, err := log.Restore(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"delay_overdue q raised", "group_lag q raised", "delay_overdue q cleared"}, states(events))
}

func TestHandlerListsActiveAndRecent(t *testing.T) {
	g := &gauge{}
	g.v.Store(500)
	m := newMonitor(t, Options{Probes: []Probe{Above(KindGroupLag, 100, g.read, nil)}})
	m.Evaluate(t.Context())
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "?recent=5")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var l List
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&l))
	require.Len(t, l.Active, 1)
	require.Len(t, l.Recent, 1)
	bad, err := http.Get(srv.URL + "?recent=x")
	require.NoError(t, err)
	bad.Body.Close()
	require.Equal(t, http.StatusBadRequest, bad.StatusCode)

	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	mfs, err := reg.Gather()
	require.NoError(t, err)
	n := 0
	for _, mf := range mfs {
		if mf.GetName() == "ferrymq_alarm_active" {
			n = len(mf.GetMetric())
		}
	}
	require.Equal(t, 1, n)
}

func TestDecodeEvent(t *testing.T) {
	e := Event{Kind: KindDiskUsage, Subject: "data", State: StateRaised, Value: 0.9, Threshold: 0.85, Since: time.Now(), Time: time.Now()}
	b, err := json.Marshal(e)
	require.NoError(t, err)
	got, err := DecodeEvent(b)
	require.NoError(t, err)
	require.Equal(t, e.Subject, got.Subject)
	for _, bad := range []string{``, `{}`, `[1]`, `{"kind":"disk_usage","state":"raised"}`,
		`{"kind":"nope","state":"raised","since":"2026-01-01T00:00:00Z"}`,
		`{"kind":"disk_usage","state":"maybe","since":"2026-01-01T00:00:00Z"}`} {
		_, err := DecodeEvent([]byte(bad))
		require.ErrorIs(t, err, ErrBadEvent, bad)
	}
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"kind":"disk_usage","subject":"data","state":"raised","value":0.9,"threshold":0.85,"since":"2026-12-05T10:00:00Z","time":"2026-12-05T10:00:00Z"}`))
	f.Add([]byte(`{"kind":"store_failed","state":"cleared","since":"2026-12-05T10:00:00Z"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeEvent(b)
		if err != nil {
			return
		}
		if e.State != StateRaised && e.State != StateCleared || e.Since.IsZero() {
			t.Fatalf("accepted %q as %+v", b, e)
		}
	})
}

// Events the broker refuses are stored ahead of the next ones once it
// takes writes again (here: a closed store, then the same folder opened
// again).
func TestLogKeepsRefusedEvents(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(dir, store.Options{})
	require.NoError(t, err)
	log := &Log{B: st}
	at := newClock().Now()
	ev := func(state string) Event {
		return Event{Kind: KindNATSUnreachable, Subject: "nats", State: state, Since: at, Time: at}
	}
	require.NoError(t, log.Store(t.Context(), nil), "creates the topic")
	require.NoError(t, st.Close())
	require.Error(t, log.Store(t.Context(), []Event{ev(StateRaised)}), "a closed store refuses it")

	st, err = store.Open(dir, store.Options{})
	require.NoError(t, err)
	defer st.Close()
	log.B = st
	require.NoError(t, log.Store(t.Context(), []Event{ev(StateCleared)}))
	events, err := log.Restore(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"nats_unreachable nats raised", "nats_unreachable nats cleared"}, states(events))
}

// What the broker refused is spilled to a file at Close, restored from it
// (and not twice if the topic already has it) and stored by the next
// Store, which removes the file.
func TestLogSpillsRefusedEvents(t *testing.T) {
	dir := t.TempDir()
	spill := filepath.Join(dir, "alarms-pending.jsonl")
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{})
	require.NoError(t, err)
	log := &Log{B: st, Spill: spill}
	at := newClock().Now()
	ev := func(state string, d time.Duration) Event {
		return Event{Kind: KindStoreFailed, Subject: "store", State: state, Since: at, Time: at.Add(d)}
	}
	require.NoError(t, log.Store(t.Context(), nil), "creates the topic")
	require.NoError(t, log.Close(), "nothing refused: nothing to spill")
	require.NoFileExists(t, spill)
	require.NoError(t, st.Close())
	require.Error(t, log.Store(t.Context(), []Event{ev(StateRaised, 0)}), "a closed store refuses it")
	require.NoError(t, log.Close())
	require.FileExists(t, spill)

	st, err = store.Open(filepath.Join(dir, "store"), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	log = &Log{B: st, Spill: spill} // the next run
	events, err := log.Restore(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"store_failed store raised"}, states(events), "restored from the spill")
	require.NoError(t, log.Store(t.Context(), []Event{ev(StateCleared, time.Second)}))
	require.NoFileExists(t, spill, "stored: removed")
	events, err = (&Log{B: st, Spill: spill}).Restore(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"store_failed store raised", "store_failed store cleared"}, states(events))

	// A spill whose events the topic already holds (a crash after the
	// store, before the removal) adds nothing; a line that is not an event
	// is skipped.
	line, err := json.Marshal(ev(StateRaised, 0))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(spill, append(append(line, '\n'), "not json\n"...), 0o600))
	events, err = (&Log{B: st, Spill: spill}).Restore(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"store_failed store raised", "store_failed store cleared"}, states(events))
}
