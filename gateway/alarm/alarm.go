package alarm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Kind names a condition an alarm reports.
type Kind string

// The kinds the node raises (docs/operations.md says what to do about
// each).
const (
	// KindStoreFailed: the store refuses writes (a write or fsync failed;
	// a restart is needed).
	KindStoreFailed Kind = "store_failed"
	// KindDiskUsage: the data folder's filesystem is fuller than its share.
	KindDiskUsage Kind = "disk_usage"
	// KindFsyncSlow: the commit log's fsync p99 over the window is above
	// its bound.
	KindFsyncSlow Kind = "fsync_slow"
	// KindGroupLag: a consumer group's lag on a topic is above its count.
	KindGroupLag Kind = "group_lag"
	// KindGroupLagGrowing: a group's lag on a topic grew all through the
	// period.
	KindGroupLagGrowing Kind = "group_lag_growing"
	// KindDeadLetters: messages arrived in a group's dead-letter topic.
	KindDeadLetters Kind = "dead_letters"
	// KindRetryBacklog: the messages waiting for redelivery grew all
	// through the period.
	KindRetryBacklog Kind = "retry_backlog_growing"
	// KindDelayOverdue: a delayed message is past its time by more than
	// the bound and not delivered.
	KindDelayOverdue Kind = "delay_overdue"
	// KindDisconnectRate: MQTT clients disconnect faster than the bound.
	KindDisconnectRate Kind = "disconnect_rate"
	// KindCertExpiry: a TLS certificate expires within the bound.
	KindCertExpiry Kind = "certificate_expiry"
	// KindKeyExpiry: an HMAC or JWT key expires within the bound.
	KindKeyExpiry Kind = "key_expiry"
	// KindNATSUnreachable: the NATS/JetStream servers do not answer
	// (engine nats).
	KindNATSUnreachable Kind = "nats_unreachable"
	// KindTraceDropping: trace hops are being dropped.
	KindTraceDropping Kind = "trace_dropping"
	// KindPresenceDropping: presence events the core refused (lost).
	KindPresenceDropping Kind = "presence_dropping"
	// KindAnonymous: MQTT clients may connect without credentials on a
	// listener reachable beyond loopback.
	KindAnonymous Kind = "anonymous_access"
)

// Kinds lists every kind, in the order above.
var Kinds = []Kind{KindStoreFailed, KindDiskUsage, KindFsyncSlow, KindGroupLag, KindGroupLagGrowing, KindDeadLetters,
	KindRetryBacklog, KindDelayOverdue, KindDisconnectRate, KindCertExpiry, KindKeyExpiry, KindNATSUnreachable,
	KindTraceDropping, KindPresenceDropping, KindAnonymous}

// Event states.
const (
	StateRaised  = "raised"
	StateCleared = "cleared"
)

// Event is an alarm raised or cleared: the body of a %ALARM% message, a
// webhook's POST body, an entry of GET /api/v1/alarms.
type Event struct {
	Kind    Kind   `json:"kind"`
	Subject string `json:"subject"`
	// State is StateRaised or StateCleared; an active alarm (Active) shows
	// StateRaised.
	State string `json:"state"`
	// Value and Threshold are the condition's figures (the unit is the
	// kind's: a share, seconds, messages, messages per second, days);
	// a cleared event carries the last value seen.
	Value     float64 `json:"value"`
	Threshold float64 `json:"threshold"`
	Message   string  `json:"message"`
	// Since is when the alarm was raised; Time when this event happened
	// (Since again for a raise).
	Since time.Time `json:"since"`
	Time  time.Time `json:"time"`
	Node  string    `json:"node,omitempty"`
}

// key identifies an alarm: one per kind and subject.
func (e *Event) key() string { return string(e.Kind) + "\x00" + e.Subject }

// Reading is one condition a probe watches, as it stands now.
type Reading struct {
	Kind    Kind
	Subject string
	// Active says the condition holds.
	Active           bool
	Value, Threshold float64
	Message          string
}

// Probe reads conditions. Check returns a Reading for each condition it
// watches (inactive ones may be left out); an error leaves that probe's
// alarms as they were. Check is called from one goroutine only, so a probe
// may keep history without a lock.
type Probe interface {
	Check(ctx context.Context, now time.Time) ([]Reading, error)
}

// ProbeFunc adapts a function to Probe.
type ProbeFunc func(ctx context.Context, now time.Time) ([]Reading, error)

// Check implements Probe.
func (f ProbeFunc) Check(ctx context.Context, now time.Time) ([]Reading, error) { return f(ctx, now) }

// Defaults of Options.
const (
	DefaultInterval     = 10 * time.Second
	DefaultClearAfter   = 30 * time.Second
	DefaultRecent       = 200
	DefaultProbeTimeout = 5 * time.Second
)

// Options configure a Monitor.
type Options struct {
	// Interval between evaluations; default DefaultInterval.
	Interval time.Duration
	// ClearAfter is how long a condition must be found false before its
	// alarm clears; default DefaultClearAfter. Negative: at the first
	// evaluation that finds it false.
	ClearAfter time.Duration
	// Probes are evaluated in order, each bounded by ProbeTimeout (default
	// DefaultProbeTimeout).
	Probes       []Probe
	ProbeTimeout time.Duration
	// Disabled kinds are never raised.
	Disabled []Kind
	// Store, if set, stores each evaluation's events (the node: in
	// %ALARM%). An error is logged; the events still reach everything else.
	Store func(ctx context.Context, events []Event) error
	// Restore, if set, returns the latest stored events, oldest first: at
	// Start, alarms of this Node raised and not cleared since are taken up.
	Restore func(ctx context.Context) ([]Event, error)
	// Webhooks receive every event.
	Webhooks []Webhook
	// Recent is how many events are kept for Recent; default DefaultRecent.
	Recent int
	// Node names this node in events.
	Node string
	// Logger gets one line per event; nil: none.
	Logger *zerolog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

func (o *Options) withDefaults() {
	o.Interval = cmp.Or(o.Interval, DefaultInterval)
	o.ClearAfter = cmp.Or(o.ClearAfter, DefaultClearAfter)
	o.ProbeTimeout = cmp.Or(o.ProbeTimeout, DefaultProbeTimeout)
	o.Recent = cmp.Or(o.Recent, DefaultRecent)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		nop := zerolog.Nop()
		o.Logger = &nop
	}
}

func (o *Options) validate() error {
	var errs []error
	if o.Interval < 0 {
		errs = append(errs, fmt.Errorf("interval %s: negative", o.Interval))
	}
	if o.Recent < 0 {
		errs = append(errs, fmt.Errorf("recent %d: negative", o.Recent))
	}
	for _, k := range o.Disabled {
		if !slices.Contains(Kinds, k) {
			errs = append(errs, fmt.Errorf("disabled kind %q: unknown (want one of %s)", k, kindList()))
		}
	}
	for i, w := range o.Webhooks {
		if err := w.validate(); err != nil {
			errs = append(errs, fmt.Errorf("webhook %d: %w", i+1, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return nil
}

func kindList() string {
	s := make([]string, len(Kinds))
	for i, k := range Kinds {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// Log field names.
const (
	fieldKind      = "kind"
	fieldSubject   = "subject"
	fieldValue     = "value"
	fieldThreshold = "threshold"
	fieldSince     = "since"
	fieldProbe     = "probe"
	fieldCount     = "count"
	fieldURL       = "url"
	fieldAttempt   = "attempt"
)

// Monitor evaluates probes and raises and clears alarms.
type Monitor struct {
	opts     Options
	log      zerolog.Logger
	disabled map[Kind]bool
	hooks    []*sender
	metrics  *metrics

	// owned by the evaluating goroutine
	owner map[string]int // alarm key → index of the probe that raised it; -1 restored

	mu     sync.Mutex // guards the fields below
	active map[string]*alarm
	recent []Event // ring: the newest at recent[(next-1) % len]
	next   int
	full   bool

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// alarm is an active alarm.
type alarm struct {
	ev        Event
	lastTrue  time.Time // last evaluation that found the condition true
	lastValue float64
}

// New builds a Monitor; Start starts it.
func New(o Options) (*Monitor, error) {
	o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	m := &Monitor{opts: o, log: *o.Logger, disabled: map[Kind]bool{}, owner: map[string]int{},
		active: map[string]*alarm{}, recent: make([]Event, o.Recent)}
	for _, k := range o.Disabled {
		m.disabled[k] = true
	}
	m.metrics = newMetrics(m)
	for _, w := range o.Webhooks {
		m.hooks = append(m.hooks, newSender(w, m.log, m.metrics))
	}
	return m, nil
}

// Start takes up the restored alarms and starts evaluating, every
// Interval from now, and the webhook senders.
func (m *Monitor) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.restore(ctx)
	for _, h := range m.hooks {
		m.wg.Go(func() { h.run(ctx) })
	}
	m.wg.Go(func() {
		t := time.NewTicker(m.opts.Interval)
		defer t.Stop()
		m.Evaluate(ctx)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				m.Evaluate(ctx)
			}
		}
	})
}

// Close stops the Monitor and returns once its goroutines have ended.
// Safe to call twice, and without Start.
func (m *Monitor) Close() error {
	m.once.Do(func() {
		if m.cancel != nil {
			m.cancel()
		}
		m.wg.Wait()
	})
	return nil
}

func (m *Monitor) restore(ctx context.Context) {
	if m.opts.Restore == nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, m.opts.ProbeTimeout)
	events, err := m.opts.Restore(rctx)
	cancel()
	if err != nil {
		m.log.Warn().Err(err).Msg("alarms raised before the restart not read back: they may be raised again")
		return
	}
	now := m.opts.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range events {
		m.remember(e)
		if e.Node != m.opts.Node {
			continue
		}
		switch e.State {
		case StateRaised:
			m.active[e.key()] = &alarm{ev: e, lastTrue: now, lastValue: e.Value}
			m.owner[e.key()] = -1
		case StateCleared:
			delete(m.active, e.key())
			delete(m.owner, e.key())
		}
	}
}

// Evaluate runs every probe once and raises and clears alarms. The Monitor
// calls it every Interval; a test may call it directly (from one goroutine
// at a time).
func (m *Monitor) Evaluate(ctx context.Context) {
	now := m.opts.Now()
	failed := map[int]bool{}
	found := map[string]Reading{}
	from := map[string]int{}
	for i, p := range m.opts.Probes {
		pctx, cancel := context.WithTimeout(ctx, m.opts.ProbeTimeout)
		rs, err := p.Check(pctx, now)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failed[i] = true
			m.log.Debug().Err(err).Int(fieldProbe, i).Msg("alarm probe failed; its alarms stay as they were")
			continue
		}
		for _, r := range rs {
			if m.disabled[r.Kind] {
				continue
			}
			k := string(r.Kind) + "\x00" + r.Subject
			found[k], from[k] = r, i
		}
	}
	var events []Event
	m.mu.Lock()
	for k, r := range found {
		a, ok := m.active[k]
		switch {
		case r.Active && !ok:
			e := Event{Kind: r.Kind, Subject: r.Subject, State: StateRaised, Value: r.Value, Threshold: r.Threshold,
				Message: r.Message, Since: now, Time: now, Node: m.opts.Node}
			m.active[k] = &alarm{ev: e, lastTrue: now, lastValue: r.Value}
			m.owner[k] = from[k]
			events = append(events, e)
		case r.Active:
			a.lastTrue, a.lastValue = now, r.Value
			a.ev.Value, a.ev.Threshold, a.ev.Message = r.Value, r.Threshold, r.Message
			m.owner[k] = from[k]
		case ok:
			a.lastValue = r.Value
		}
	}
	for k, a := range m.active {
		if r, ok := found[k]; ok && r.Active {
			continue
		}
		if owner, ok := m.owner[k]; ok && failed[owner] {
			continue // its probe could not tell
		}
		if m.opts.ClearAfter > 0 && now.Sub(a.lastTrue) < m.opts.ClearAfter {
			continue
		}
		e := a.ev
		e.State, e.Time, e.Value = StateCleared, now, a.lastValue
		if r, ok := found[k]; ok {
			e.Message = r.Message
		}
		delete(m.active, k)
		delete(m.owner, k)
		events = append(events, e)
	}
	slices.SortFunc(events, func(a, b Event) int { return cmp.Compare(a.key(), b.key()) })
	for _, e := range events {
		m.remember(e)
	}
	m.mu.Unlock()
	if len(events) == 0 {
		return
	}
	m.announce(ctx, events)
}

// announce logs, counts, stores and pushes events.
func (m *Monitor) announce(ctx context.Context, events []Event) {
	for _, e := range events {
		l := m.log.Info()
		msg := "alarm cleared"
		if e.State == StateRaised {
			l, msg = m.log.Warn(), "alarm raised"
		}
		l.Str(fieldKind, string(e.Kind)).Str(fieldSubject, e.Subject).Float64(fieldValue, e.Value).
			Float64(fieldThreshold, e.Threshold).Time(fieldSince, e.Since).Msg(msg + ": " + e.Message)
		m.metrics.event(e)
	}
	for _, h := range m.hooks {
		h.enqueue(events)
	}
	if m.opts.Store != nil {
		// Events already decided are stored even when Close comes now:
		// Close waits for this, bounded by ProbeTimeout, and a restart
		// then knows what was raised.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.opts.ProbeTimeout)
		err := m.opts.Store(sctx, events)
		cancel()
		if err != nil {
			m.log.Error().Err(err).Int(fieldCount, len(events)).Msg("alarm events not stored in " + Topic)
		}
	}
}

// remember appends e to the recent ring; m.mu held.
func (m *Monitor) remember(e Event) {
	if len(m.recent) == 0 {
		return
	}
	m.recent[m.next] = e
	m.next = (m.next + 1) % len(m.recent)
	if m.next == 0 {
		m.full = true
	}
}

// Active returns the active alarms, the oldest first.
func (m *Monitor) Active() []Event {
	m.mu.Lock()
	out := make([]Event, 0, len(m.active))
	for _, a := range m.active {
		out = append(out, a.ev)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Event) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.key(), b.key()))
	})
	return out
}

// Recent returns up to n of the latest events (n ≤ 0: all kept), the
// newest first.
func (m *Monitor) Recent(n int) []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	size := m.next
	if m.full {
		size = len(m.recent)
	}
	if n <= 0 || n > size {
		n = size
	}
	out := make([]Event, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, m.recent[(m.next-i+len(m.recent))%len(m.recent)])
	}
	return out
}
