package txn

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unique"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
)

// Names of the system topic and internal group. The '%' they contain cannot
// appear in a user topic or group, so they never collide with one.
const (
	// HalfTopic holds half messages and the op records that resolve them,
	// in one queue, so recovery reads them in the order they were written.
	HalfTopic = "%HALF%"
	// TxnGroup is the internal group whose committed offset on HalfTopic is
	// the queue offset of the oldest unresolved half (or the queue's end):
	// recovery starts reading there.
	TxnGroup = "%TXN%"
	// MaxGroupLen is the longest producer group name ValidateGroup accepts.
	MaxGroupLen = 100
)

// Properties of the records in HalfTopic and of committed messages. Every
// property name starting with "txn." is reserved: SendHalf drops those a
// producer sets.
const (
	propPrefix = "txn."
	// PropGroup is the producer group of a half message (and of an op
	// record).
	PropGroup = "txn.group"
	// PropTopic is the real topic a half message goes to on commit.
	PropTopic = "txn.topic"
	// PropShardingKey keeps a half message's sharding key; it is restored
	// on commit.
	PropShardingKey = "txn.sharding_key"
	// PropHalfID is, on an op record, the ID (32 hex characters) of the half
	// it is about; on a committed message, the ID of its half, for tracing.
	PropHalfID = "txn.half_id"
	// PropOp marks an op record: OpCommit, OpRollback, OpCheck or OpDiscard.
	PropOp = "txn.op"
	// PropChecks is, on OpCheck and OpDiscard records, how many checks had
	// been sent for the half.
	PropChecks = "txn.checks"
)

// Op record kinds (values of PropOp). These strings are part of the stored
// format: recovery reads them back.
const (
	OpCommit   = "commit"
	OpRollback = "rollback"
	OpCheck    = "check"
	OpDiscard  = "discard"
)

// Log field names.
const (
	fieldGroup  = "group"
	fieldTopic  = "topic"
	fieldID     = "id"
	fieldChecks = "checks"
	fieldOffset = "offset"
	fieldCount  = "count"
	fieldAction = "action"
	fieldCheck  = "from_check"
)

// Action is a producer's answer for a transaction.
type Action int

const (
	// Commit delivers the half message to its real topic.
	Commit Action = iota + 1
	// Rollback discards it.
	Rollback
	// Unknown means the producer does not know the outcome yet: the half
	// stays pending and is checked again.
	Unknown
)

func (a Action) String() string {
	switch a {
	case Commit:
		return "commit"
	case Rollback:
		return "rollback"
	case Unknown:
		return "unknown"
	default:
		return "Action(" + strconv.Itoa(int(a)) + ")"
	}
}

// State is where a half message stands.
type State string

const (
	StatePending    State = "pending"
	StateCommitted  State = "committed"
	StateRolledBack State = "rolled-back"
	StateDiscarded  State = "discarded"
)

// opState maps a resolving op record to the state it leaves its half in.
var opState = map[string]State{
	OpCommit:   StateCommitted,
	OpRollback: StateRolledBack,
	OpDiscard:  StateDiscarded,
}

// Checker is how the Service reaches one producer of a group; the wire
// server implements it per connection. CheckTransaction must not block: it
// queues a push of the half to the producer, which answers later with End
// (fromCheck set). An error means the producer is gone; the next registered
// one is tried.
type Checker interface {
	CheckTransaction(half *core.StoredMessage) error
}

// PendingInfo describes one unresolved half.
type PendingInfo struct {
	ID        core.MessageID
	Group     string
	Topic     string
	StoredAt  time.Time
	Checks    int
	NextCheck time.Time
	// Waiting is set while the half is due for a check but no producer of
	// its group is registered.
	Waiting bool
}

// ValidateGroup reports whether group is a valid producer group name: 1–100
// characters of [A-Za-z0-9._-]. The error wraps ErrInvalidGroup.
func ValidateGroup(group string) error {
	if reason := core.NameProblem(group, MaxGroupLen); reason != "" {
		return fmt.Errorf("%w %q: %s", ErrInvalidGroup, group, reason)
	}
	return nil
}

// Service runs two-phase transactional messages on a broker. It is safe for
// concurrent use.
type Service struct {
	b    core.Broker
	opts Options
	log  zerolog.Logger

	// wake makes the checker look again at once (capacity 1).
	wake chan struct{}

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	startMu   sync.Mutex // serialises Start
	closeOnce sync.Once

	// committed is TxnGroup's offset as last committed. Owned by Start, then
	// by the checker goroutine.
	committed int64

	// mu guards the fields below. It is never held across a broker call or
	// a Checker call.
	mu       sync.Mutex
	started  bool
	closed   bool
	halves   map[core.MessageID]*half
	byCheck  halfHeap // halves waiting for their next check
	byOffset halfHeap // every pending half: the oldest bounds TxnGroup's offset
	// parked holds, per group, halves due for a check while no Checker of
	// the group is registered; Register moves them back to byCheck.
	parked   map[unique.Handle[string]][]*half
	warned   map[unique.Handle[string]]bool // "no producer" logged since the last Register
	checkers map[unique.Handle[string]]*checkerSet
	regSeq   uint64
	recent   recentSet
	// inflight holds, per SendHalf in progress, the tail when it began: its
	// half lands at or above it, so TxnGroup's offset must not pass it.
	inflight    map[uint64]int64
	inflightSeq uint64
	// tail is one past the highest HalfTopic queue offset seen.
	tail int64
	// resolved counts resolutions since Start by state; checks counts
	// check-backs sent.
	resolved map[State]int64
	checks   int64
}

// Stats counts what the service did since it started.
type Stats struct {
	// Pending is the number of unresolved halves now.
	Pending int
	// Committed, RolledBack and Discarded count resolutions since Start
	// (not those recovered from the log).
	Committed, RolledBack, Discarded int64
	// Checks counts check-backs sent since Start.
	Checks int64
}

// Stats returns the service's counters.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Pending: len(s.halves), Committed: s.resolved[StateCommitted], RolledBack: s.resolved[StateRolledBack],
		Discarded: s.resolved[StateDiscarded], Checks: s.checks}
}

// New checks opts and creates HalfTopic with one queue. Call Start to
// recover pending halves and begin checking.
func New(b core.Broker, opts Options) (*Service, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil broker", ErrBadOptions)
	}
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Service{
		b:        b,
		opts:     opts,
		log:      opts.Logger.With().Str("component", "txn").Logger(),
		wake:     make(chan struct{}, 1),
		halves:   make(map[core.MessageID]*half),
		byCheck:  byNextCheck(),
		byOffset: byOffset(),
		parked:   make(map[unique.Handle[string]][]*half),
		warned:   make(map[unique.Handle[string]]bool),
		checkers: make(map[unique.Handle[string]]*checkerSet),
		recent:   newRecentSet(),
		inflight: make(map[uint64]int64),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if _, err := b.CreateTopic(s.ctx, core.TopicConfig{Name: HalfTopic, Queues: 1}); err != nil {
		s.cancel()
		return nil, fmt.Errorf("create %s with 1 queue: %w", HalfTopic, err)
	}
	return s, nil
}

// Start recovers the pending halves from HalfTopic (from TxnGroup's
// committed offset on) and starts the checker goroutine. If recovery fails
// Start returns the error and may be called again; calls after a successful
// one do nothing.
func (s *Service) Start(ctx context.Context) error {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	s.mu.Lock()
	started, closed := s.started, s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case started:
		return nil
	}
	rec, err := s.recover(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.installLocked(rec)
	s.started = true
	s.wg.Go(func() { s.run(s.ctx) })
	return nil
}

// Close stops the checker and returns once it has ended. Pending halves stay
// stored and are recovered by the next Service. It is idempotent and never
// fails.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		started := s.started
		s.mu.Unlock()
		s.cancel()
		s.wg.Wait()
		if started {
			// Ends that finished after the checker's last round.
			s.commitProgress(context.WithoutCancel(s.ctx))
		}
	})
	return nil
}

// Register adds c as a producer of group: checks of the group's halves go
// round-robin to its registered Checkers. Call the returned function (any
// number of times) when the producer goes away.
func (s *Service) Register(group string, c Checker) (unregister func()) {
	if c == nil {
		return func() {}
	}
	g := unique.Make(group)
	s.mu.Lock()
	s.regSeq++
	id := s.regSeq
	cs := s.checkers[g]
	if cs == nil {
		cs = &checkerSet{}
		s.checkers[g] = cs
	}
	cs.regs = append(cs.regs, registration{id: id, c: c})
	delete(s.warned, g)
	for _, h := range s.parked[g] {
		h.parkIdx = -1
		s.byCheck.add(h)
	}
	delete(s.parked, g)
	s.mu.Unlock()
	s.kick()

	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			cs := s.checkers[g]
			if cs == nil {
				return
			}
			cs.regs = slices.DeleteFunc(cs.regs, func(r registration) bool { return r.id == id })
			if len(cs.regs) == 0 {
				delete(s.checkers, g)
			} else {
				cs.next %= len(cs.regs)
			}
		})
	}
}

// SendHalf stores a copy of m as a half message of group: invisible to
// consumers until End commits it. m.Topic is the real topic; sharding key,
// tag, keys, body, properties, born and deliver-at times are kept
// (properties named "txn.…" are dropped). It returns once the half is
// durable under the broker's flush policy, with the half's ID and store
// time, Topic set to the real topic and Queue and QueueOffset -1 (the
// message is not placed yet). A SendHalf that fails may still have stored
// the half; if it is checked back, answer Rollback.
func (s *Service) SendHalf(ctx context.Context, group string, m *core.Message) (core.SendResult, error) {
	if err := ValidateGroup(group); err != nil {
		return core.SendResult{}, err
	}
	if m == nil {
		return core.SendResult{}, fmt.Errorf("send half: %w: nil message", core.ErrInvalidMessage)
	}
	if err := core.ValidateTopic(m.Topic); err != nil {
		return core.SendResult{}, fmt.Errorf("send half: %w", err)
	}
	s.mu.Lock()
	if err := s.runningLocked(); err != nil {
		s.mu.Unlock()
		return core.SendResult{}, err
	}
	if n := len(s.halves) + len(s.inflight); n >= s.opts.MaxPending {
		s.mu.Unlock()
		return core.SendResult{}, fmt.Errorf("%w: %d unresolved, limit %d", ErrTooManyPending, n, s.opts.MaxPending)
	}
	s.inflightSeq++
	token := s.inflightSeq
	s.inflight[token] = s.tail
	s.mu.Unlock()

	res, err := s.b.Produce(ctx, halfMessage(group, m))

	s.mu.Lock()
	delete(s.inflight, token)
	if err != nil {
		s.mu.Unlock()
		return core.SendResult{}, fmt.Errorf("store half for %s: %w", m.Topic, err)
	}
	h := &half{
		id:        res.ID,
		group:     unique.Make(group),
		topic:     unique.Make(m.Topic),
		offset:    res.QueueOffset,
		storedAt:  res.StoredAt.UnixNano(),
		nextCheck: res.StoredAt.Add(s.opts.FirstCheck).UnixNano(),
		checkIdx:  -1, offsetIdx: -1, parkIdx: -1,
	}
	s.addLocked(h)
	s.seenLocked(res.QueueOffset)
	first := s.byCheck.top() == h
	s.mu.Unlock()
	if first {
		s.kick()
	}
	s.log.Debug().Str(fieldGroup, group).Str(fieldTopic, m.Topic).Str(fieldID, res.ID.String()).
		Int64(fieldOffset, res.QueueOffset).Msg("half message stored")
	return core.SendResult{
		ID:              res.ID,
		Topic:           m.Topic,
		Queue:           -1,
		QueueOffset:     -1,
		CommitLogOffset: res.CommitLogOffset,
		StoredAt:        res.StoredAt,
	}, nil
}

// halfMessage is the record SendHalf stores for m.
func halfMessage(group string, m *core.Message) *core.Message {
	props := make(map[string]string, len(m.Properties)+3)
	for k, v := range m.Properties {
		if !strings.HasPrefix(k, propPrefix) {
			props[k] = v
		}
	}
	props[PropGroup] = group
	props[PropTopic] = m.Topic
	if m.ShardingKey != "" {
		props[PropShardingKey] = m.ShardingKey
	}
	return &core.Message{
		Topic:       HalfTopic,
		ShardingKey: m.ShardingKey,
		Tag:         m.Tag,
		Keys:        slices.Clone(m.Keys),
		Properties:  props,
		Body:        m.Body,
		DeliverAt:   m.DeliverAt,
		BornAt:      m.BornAt,
	}
}

// committedMessage turns a stored half back into the message its real topic
// gets: sharding key restored, "txn." properties dropped but PropHalfID.
func committedMessage(h *core.StoredMessage) *core.Message {
	props := make(map[string]string, len(h.Properties))
	for k, v := range h.Properties {
		if !strings.HasPrefix(k, propPrefix) {
			props[k] = v
		}
	}
	props[PropHalfID] = h.ID.String()
	key := h.ShardingKey
	if k := h.Properties[PropShardingKey]; k != "" {
		key = k
	}
	return &core.Message{
		Topic:       h.Properties[PropTopic],
		ShardingKey: key,
		Tag:         h.Tag,
		Keys:        h.Keys,
		Properties:  props,
		Body:        h.Body,
		DeliverAt:   h.DeliverAt,
		BornAt:      h.BornAt,
	}
}

// opMessage is an op record about h. Resolving records carry the half's ID
// as an index key, so the outcome of a half no longer in memory can be
// found with FindByKey.
func opMessage(op string, h *half, checks int) *core.Message {
	id := h.id.String()
	props := map[string]string{PropOp: op, PropHalfID: id, PropGroup: h.group.Value()}
	if op == OpCheck || op == OpDiscard {
		props[PropChecks] = strconv.Itoa(checks)
	}
	m := &core.Message{Topic: HalfTopic, Properties: props}
	if op != OpCheck {
		m.Keys = []string{id}
	}
	return m
}

// End resolves the half id of group (any group if empty) with a producer's
// answer; fromCheck says it answers a check-back.
//
// Commit stores the real message and the commit op record in one
// ProduceBatch, the message first, and returns the message's SendResult. It
// carries the half's sharding key, tag, keys, body, properties, born and
// deliver-at times, and PropHalfID. Rollback stores the rollback op record
// and returns a zero SendResult. Unknown stores nothing: the half stays
// pending and is checked again on schedule.
//
// End fails with ErrNotFound for an ID that is no half message, ErrResolved
// for one already resolved or being resolved (of concurrent Ends one wins),
// and ErrGroupMismatch for another group's half. On any other error the half
// stays pending; a commit may still have delivered the message, in which
// case a later commit delivers it twice.
func (s *Service) End(ctx context.Context, id core.MessageID, group string, a Action, fromCheck bool) (core.SendResult, error) {
	if a != Commit && a != Rollback && a != Unknown {
		return core.SendResult{}, fmt.Errorf("%w: %v", ErrInvalidAction, a)
	}
	s.mu.Lock()
	if err := s.runningLocked(); err != nil {
		s.mu.Unlock()
		return core.SendResult{}, err
	}
	h := s.halves[id]
	if h == nil {
		r, ok := s.recent.m[id]
		s.mu.Unlock()
		if ok {
			if group != "" && group != r.group.Value() {
				return core.SendResult{}, fmt.Errorf("%w: half %s is of group %s, not %s", ErrGroupMismatch, id, r.group.Value(), group)
			}
			return core.SendResult{}, fmt.Errorf("%w: half %s is %s", ErrResolved, id, r.state)
		}
		return core.SendResult{}, s.endStale(ctx, id, group)
	}
	if g := h.group.Value(); group != "" && group != g {
		s.mu.Unlock()
		return core.SendResult{}, fmt.Errorf("%w: half %s is of group %s, not %s", ErrGroupMismatch, id, g, group)
	}
	if h.resolving {
		s.mu.Unlock()
		return core.SendResult{}, fmt.Errorf("%w: half %s is being resolved", ErrResolved, id)
	}
	if a == Unknown {
		s.mu.Unlock()
		s.log.Debug().Str(fieldID, id.String()).Bool(fieldCheck, fromCheck).Msg("transaction outcome unknown")
		return core.SendResult{}, nil
	}
	h.resolving = true
	s.mu.Unlock()

	var (
		res   core.SendResult
		state State
		err   error
	)
	if a == Commit {
		state = StateCommitted
		res, err = s.commit(ctx, h)
	} else {
		state = StateRolledBack
		var r core.SendResult
		r, err = s.b.Produce(ctx, opMessage(OpRollback, h, 0))
		if err != nil {
			err = fmt.Errorf("roll back %s: %w", id, err)
		} else {
			s.mu.Lock()
			s.seenLocked(r.QueueOffset)
			s.mu.Unlock()
		}
	}
	s.mu.Lock()
	if err != nil {
		h.resolving = false
		s.mu.Unlock()
		return core.SendResult{}, err
	}
	s.resolveLocked(h, state)
	s.mu.Unlock()
	s.log.Debug().Str(fieldGroup, h.group.Value()).Str(fieldTopic, h.topic.Value()).Str(fieldID, id.String()).
		Stringer(fieldAction, a).Bool(fieldCheck, fromCheck).Msg("transaction ended")
	return res, nil
}

// commit produces h's real message and its commit op record in one batch,
// the message first: a batch torn between them keeps the message and loses
// the op, so the half is checked again and committed twice — never lost.
func (s *Service) commit(ctx context.Context, h *half) (core.SendResult, error) {
	m, err := s.b.Get(ctx, h.id)
	if err != nil {
		return core.SendResult{}, fmt.Errorf("commit %s: read half: %w", h.id, err)
	}
	res, err := s.b.ProduceBatch(ctx, []*core.Message{committedMessage(m), opMessage(OpCommit, h, 0)})
	if err != nil {
		return core.SendResult{}, fmt.Errorf("commit %s to %s: %w", h.id, h.topic.Value(), err)
	}
	s.mu.Lock()
	s.seenLocked(res[1].QueueOffset)
	s.mu.Unlock()
	return res[0], nil
}

// endStale answers End for an ID not in memory: ErrResolved if it names a
// half message in HalfTopic (which is then resolved: pending ones are all
// in memory), ErrNotFound otherwise.
func (s *Service) endStale(ctx context.Context, id core.MessageID, group string) error {
	m, err := s.b.Get(ctx, id)
	if errors.Is(err, core.ErrMessageNotFound) {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return fmt.Errorf("look up %s: %w", id, err)
	}
	if m.Topic != HalfTopic || m.Properties[PropOp] != "" || m.Properties[PropTopic] == "" {
		return fmt.Errorf("%w: %s is no half message", ErrNotFound, id)
	}
	if g := m.Properties[PropGroup]; group != "" && group != g {
		return fmt.Errorf("%w: half %s is of group %s, not %s", ErrGroupMismatch, id, g, group)
	}
	if st, err := s.storedState(ctx, id); err == nil {
		return fmt.Errorf("%w: half %s is %s", ErrResolved, id, st)
	}
	return fmt.Errorf("%w: half %s is no longer pending", ErrResolved, id)
}

// storedState finds the op record that resolved id, through its index key.
func (s *Service) storedState(ctx context.Context, id core.MessageID) (State, error) {
	key := id.String()
	ops, err := s.b.FindByKey(ctx, HalfTopic, key, core.KeyQuery{Max: 8})
	if err != nil {
		return "", err
	}
	for _, m := range ops {
		if st, ok := opState[m.Properties[PropOp]]; ok && m.Properties[PropHalfID] == key {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w: %s", ErrNotFound, id)
}

// Pending returns the unresolved halves, oldest first.
func (s *Service) Pending() []PendingInfo {
	s.mu.Lock()
	out := make([]PendingInfo, 0, len(s.halves))
	offsets := make(map[core.MessageID]int64, len(s.halves))
	for _, h := range s.halves {
		out = append(out, h.info())
		offsets[h.id] = h.offset
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b PendingInfo) int {
		return cmp.Or(a.StoredAt.Compare(b.StoredAt), cmp.Compare(offsets[a.ID], offsets[b.ID]))
	})
	return out
}

// State returns where the half id stands: pending, or how it was resolved.
// Resolutions are remembered for the last 10,000 halves and otherwise looked
// up in the broker while it keeps the op record. ErrNotFound when unknown.
func (s *Service) State(id core.MessageID) (State, error) {
	s.mu.Lock()
	if s.halves[id] != nil {
		s.mu.Unlock()
		return StatePending, nil
	}
	r, ok := s.recent.m[id]
	s.mu.Unlock()
	if ok {
		return r.state, nil
	}
	return s.storedState(context.WithoutCancel(s.ctx), id)
}

// runningLocked reports why the Service cannot take SendHalf or End.
func (s *Service) runningLocked() error {
	switch {
	case s.closed:
		return ErrClosed
	case !s.started:
		return ErrNotStarted
	}
	return nil
}

// addLocked makes h pending.
func (s *Service) addLocked(h *half) {
	s.halves[h.id] = h
	s.byCheck.add(h)
	s.byOffset.add(h)
}

// resolveLocked forgets the pending half h and remembers its state.
func (s *Service) resolveLocked(h *half, state State) {
	delete(s.halves, h.id)
	s.byCheck.remove(h)
	s.byOffset.remove(h)
	s.unparkLocked(h)
	s.recent.add(h.id, resolution{state: state, group: h.group})
	if s.resolved == nil {
		s.resolved = map[State]int64{}
	}
	s.resolved[state]++
}

// parkLocked puts h in its group's list of halves waiting for a producer.
func (s *Service) parkLocked(h *half) {
	list := s.parked[h.group]
	h.parkIdx = len(list)
	s.parked[h.group] = append(list, h)
}

func (s *Service) unparkLocked(h *half) {
	i := h.parkIdx
	if i < 0 {
		return
	}
	list := s.parked[h.group]
	last := len(list) - 1
	list[i] = list[last]
	list[i].parkIdx = i
	list[last] = nil
	if last == 0 {
		delete(s.parked, h.group)
	} else {
		s.parked[h.group] = list[:last]
	}
	h.parkIdx = -1
}

// seenLocked records that HalfTopic holds a record at queue offset off.
func (s *Service) seenLocked(off int64) {
	s.tail = max(s.tail, off+1)
}

// kick makes the checker look again.
func (s *Service) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func unixTime(ns int64) time.Time { return time.Unix(0, ns) }
