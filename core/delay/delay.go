package delay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
)

// Names of the system topic and internal group. The '%' they contain cannot
// appear in a user topic or group.
const (
	// DelayTopic holds every copy of a delayed message while it waits: one
	// queue per level.
	DelayTopic = "%DELAY%"
	// DelayGroup is the internal group whose committed offsets on DelayTopic
	// record how far each level has moved its copies on.
	DelayGroup = "%DELAYER%"
)

// Properties a waiting copy carries. All but PropID are removed when the
// message is delivered.
const (
	// PropTopic is the topic the message is delivered to.
	PropTopic = "delay.topic"
	// PropDue is the deliver-at time (RFC 3339 with nanoseconds, UTC).
	PropDue = "delay.due"
	// PropShardingKey keeps the message's own sharding key while it waits;
	// DelayTopic's sharding key selects the level.
	PropShardingKey = "delay.sharding_key"
	// PropID is the ID the producer got for the message (the first copy's).
	// Later copies and the delivered message carry it; the delivered
	// message keeps it so that it can be traced back.
	PropID = "delay.id"
)

// Log field names.
const (
	fieldID     = "id"
	fieldTopic  = "topic"
	fieldDue    = "due"
	fieldLevel  = "level"
	fieldOffset = "offset"
	fieldCount  = "count"
)

// Service delays messages: its Broker stores a message with a future
// deliver-at time in DelayTopic and the service delivers it to its topic
// when due. It is safe for concurrent use.
type Service struct {
	b     core.Broker
	opts  Options
	log   zerolog.Logger
	keys  []string        // level → sharding key of its queue in DelayTopic
	holds []time.Duration // level → hold; 0 for level 0

	// topics holds the real topics known to exist.
	topics sync.Map

	// mu guards cancelled, firing and the cancel log, and orders Cancel
	// against delivery: a level marks a message firing under mu before it
	// delivers it, and Cancel refuses a firing message.
	mu        sync.Mutex
	cancels   cancelStore
	cancelled map[core.MessageID]time.Time // original ID → due
	firing    map[core.MessageID]struct{}

	scheduled, delivered, moved, dropped, failed atomic.Int64

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	startOnce sync.Once
	closeOnce sync.Once
}

// New checks opts, creates DelayTopic with one queue per level and opens
// the cancel log in dir. It fails with an error wrapping core.ErrTopicExists
// when DelayTopic exists with another queue count (Tick or MaxHold changed
// while copies wait). Call Start to begin delivering, Close to stop.
func New(b core.Broker, dir string, opts Options) (*Service, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil broker", ErrBadOptions)
	}
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	n := levelCount(opts.Tick, opts.MaxHold)
	s := &Service{
		b:         b,
		opts:      opts,
		log:       opts.Logger.With().Str("component", "delay").Logger(),
		keys:      core.QueueKeys(n),
		holds:     make([]time.Duration, n),
		cancelled: map[core.MessageID]time.Time{},
		firing:    map[core.MessageID]struct{}{},
	}
	for l := 1; l < n; l++ {
		s.holds[l] = opts.Tick << (l - 1)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if _, err := b.CreateTopic(s.ctx, core.TopicConfig{Name: DelayTopic, Queues: n}); err != nil {
		s.cancel()
		return nil, fmt.Errorf("create %s with %d queues: %w", DelayTopic, n, err)
	}
	now := opts.Clock.Now()
	keep := func(e cancelEntry) bool { return e.dueTime().Add(opts.CancelKeep).After(now) }
	if opts.Cancels != nil {
		all, err := opts.Cancels.Load(s.ctx)
		if err != nil {
			s.cancel()
			return nil, fmt.Errorf("%w: load: %w", ErrCancelLog, err)
		}
		for id, due := range all {
			if keep(cancelEntry{id: id, due: due.UnixNano()}) {
				s.cancelled[id] = due
			}
		}
		s.cancels = sharedCancels{opts.Cancels}
		return s, nil
	}
	log, live, damaged, err := openCancelLog(dir, keep)
	if err != nil {
		s.cancel()
		return nil, err
	}
	if damaged > 0 {
		s.log.Error().Int(fieldCount, damaged).Msg("damaged cancel records skipped")
	}
	s.cancels = log
	for _, e := range live {
		s.cancelled[e.id] = e.dueTime()
	}
	return s, nil
}

// Levels returns the hold of each level: level 0 holds a message for the
// last fraction of a tick, level l ≥ 1 for Tick·2^(l−1).
func (s *Service) Levels() []time.Duration { return slices.Clone(s.holds) }

// MaxDelay is the furthest ahead a message may be scheduled.
func (s *Service) MaxDelay() time.Duration { return s.opts.MaxDelay }

// Start starts one goroutine per level. Calls after the first do nothing.
func (s *Service) Start() {
	s.startOnce.Do(func() {
		for level := range s.holds {
			s.wg.Go(func() { s.runLevel(s.ctx, level) })
		}
	})
}

// Close stops the levels, returns once they have ended and closes the
// cancel log. Waiting copies stay stored and move on with the next Service.
// It is idempotent.
func (s *Service) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.startOnce.Do(func() {})
		s.cancel()
		s.wg.Wait()
		s.mu.Lock()
		err = s.cancels.close()
		s.mu.Unlock()
	})
	return err
}

// route says where a message due at due goes at now: delivered (deliver),
// or into level with the copy's exit time. A level l ≥ 1 is the largest
// whose hold is at most the time left, so a copy never leaves a level after
// the due time, and what is left afterwards is less than the hold: a
// message is copied at most once per level it passes (about log2 of its
// delay in ticks), plus once per MaxHold beyond that.
func (s *Service) route(due, now time.Time) (level int, exit time.Time, deliver bool) {
	left := due.Sub(now)
	if left <= 0 {
		return 0, time.Time{}, true
	}
	if left < s.opts.Tick {
		return 0, due, false
	}
	l := min(bits.Len64(uint64(left/s.opts.Tick)), len(s.holds)-1)
	return l, now.Add(s.holds[l]), false
}

// delayed reports whether m asks for delayed delivery the service handles.
func delayed(m *core.Message) bool {
	return m != nil && !m.DeliverAt.IsZero() && (m.Topic == "" || m.Topic[0] != '%')
}

// schedule returns msgs with every delayed message replaced by its first
// waiting copy, and which ones were replaced; msgs itself when none is.
func (s *Service) schedule(ctx context.Context, msgs []*core.Message) ([]*core.Message, []bool, error) {
	var out []*core.Message
	var was []bool
	now := s.opts.Clock.Now()
	for i, m := range msgs {
		if !delayed(m) {
			if out != nil {
				out = append(out, m)
			}
			continue
		}
		if err := core.ValidateTopic(m.Topic); err != nil {
			return nil, nil, err
		}
		left := m.DeliverAt.Sub(now)
		switch {
		case left > s.opts.MaxDelay:
			return nil, nil, fmt.Errorf("%w: %s is %v ahead; the most is %v", ErrDelayTooLong,
				m.DeliverAt.UTC().Format(time.RFC3339), left.Round(time.Second), s.opts.MaxDelay)
		case left < -s.opts.PastTolerance:
			return nil, nil, fmt.Errorf("%w: %s is %v ago (a negative delay)", ErrDeliverAtPast,
				m.DeliverAt.UTC().Format(time.RFC3339), (-left).Round(time.Second))
		}
		if err := s.ensureTopic(ctx, m.Topic); err != nil {
			return nil, nil, err
		}
		if out == nil {
			out = append(make([]*core.Message, 0, len(msgs)), msgs[:i]...)
			was = make([]bool, len(msgs))
		}
		level, exit, deliver := s.route(m.DeliverAt, now)
		if deliver {
			out = append(out, m) // due already: stored in its topic at once
			continue
		}
		out = append(out, s.firstCopy(m, level, exit))
		was[i] = true
	}
	if out == nil {
		return msgs, nil, nil
	}
	return out, was, nil
}

// ensureTopic makes sure a delayed message's topic exists now, so that a
// bad topic is refused at produce time rather than found out when due.
func (s *Service) ensureTopic(ctx context.Context, topic string) error {
	if _, ok := s.topics.Load(topic); ok {
		return nil
	}
	_, err := s.b.Topic(ctx, topic)
	if errors.Is(err, core.ErrTopicNotFound) && !s.opts.DisableAutoCreate {
		_, err = s.b.CreateTopic(ctx, core.TopicConfig{Name: topic})
		if errors.Is(err, core.ErrTopicExists) {
			err = nil // created meanwhile with another queue count: it exists
		}
	}
	if err != nil {
		return fmt.Errorf("delayed message for topic %s: %w", topic, err)
	}
	s.topics.Store(topic, struct{}{})
	return nil
}

// firstCopy is the copy of a produced message that waits in level.
func (s *Service) firstCopy(m *core.Message, level int, exit time.Time) *core.Message {
	c := *m
	c.Properties = make(map[string]string, len(m.Properties)+3)
	maps.Copy(c.Properties, m.Properties)
	c.Properties[PropTopic] = m.Topic
	c.Properties[PropDue] = m.DeliverAt.UTC().Format(time.RFC3339Nano)
	delete(c.Properties, PropShardingKey)
	delete(c.Properties, PropID)
	if m.ShardingKey != "" {
		c.Properties[PropShardingKey] = m.ShardingKey
	}
	c.Topic = DelayTopic
	c.ShardingKey = s.keys[level]
	c.DeliverAt = exit
	s.scheduled.Add(1)
	return &c
}

// fixResults names the real topic in the results of replaced messages; their
// queue and queue offset are -1: they are known only at delivery.
func fixResults(res []core.SendResult, msgs []*core.Message, was []bool) {
	for i := range res {
		if i < len(was) && was[i] {
			res[i].Topic = msgs[i].Topic
			res[i].Queue = -1
			res[i].QueueOffset = -1
		}
	}
}

// Broker returns b (the broker New was given) with delayed delivery: a
// message whose DeliverAt is set and whose topic is a user topic is stored
// in DelayTopic and delivered to its topic when due. Its SendResult has the
// real topic, queue −1 and queue offset −1, and the ID that Cancel takes.
// Messages to system topics ('%…') pass unchanged. Every other method is
// b's; Close closes b.
func (s *Service) Broker() core.Broker { return &broker{Broker: s.b, s: s} }

type broker struct {
	core.Broker
	s *Service
}

// QueueHead implements core.QueueHeads when the engine does (ok false
// otherwise): delayed messages change no queue's head until they are due.
func (b *broker) QueueHead(topic string, queue int) (int64, bool) {
	if h, ok := b.Broker.(core.QueueHeads); ok {
		return h.QueueHead(topic, queue)
	}
	return 0, false
}

func (b *broker) Produce(ctx context.Context, m *core.Message) (core.SendResult, error) {
	if !delayed(m) {
		return b.Broker.Produce(ctx, m)
	}
	res, err := b.ProduceBatch(ctx, []*core.Message{m})
	if err != nil {
		return core.SendResult{}, err
	}
	return res[0], nil
}

func (b *broker) ProduceBatch(ctx context.Context, msgs []*core.Message) ([]core.SendResult, error) {
	out, was, err := b.s.schedule(ctx, msgs)
	if err != nil {
		return nil, err
	}
	res, err := b.Broker.ProduceBatch(ctx, out)
	if err != nil {
		return nil, err
	}
	fixResults(res, msgs, was)
	return res, nil
}

func (b *broker) ProduceAsync(msgs []*core.Message, done func([]core.SendResult, error)) {
	out, was, err := b.s.schedule(context.Background(), msgs)
	if err != nil {
		done(nil, err)
		return
	}
	if was == nil {
		b.Broker.ProduceAsync(msgs, done)
		return
	}
	b.Broker.ProduceAsync(out, func(res []core.SendResult, err error) {
		if err == nil {
			fixResults(res, msgs, was)
		}
		done(res, err)
	})
}

// Stats counts what the service did since it was created.
type Stats struct {
	// Scheduled is how many delayed messages were accepted.
	Scheduled int64
	// Delivered is how many were stored in their topic when due.
	Delivered int64
	// Moved is how many copies moved from one level to the next.
	Moved int64
	// Dropped is how many copies were dropped because their message was
	// cancelled.
	Dropped int64
	// Failed is how many due messages could not be delivered for good (their
	// topic is gone, or they no longer fit the store's limits).
	Failed int64
	// Cancelled is how many cancellations are remembered.
	Cancelled int
	// Waiting is the number of stored copies not yet moved on, per level:
	// about the number of pending messages (cancelled ones included until
	// their copy comes up).
	Waiting []int64
}

// Stats returns the counters and the waiting copies per level.
func (s *Service) Stats(ctx context.Context) (Stats, error) {
	st := Stats{
		Scheduled: s.scheduled.Load(), Delivered: s.delivered.Load(), Moved: s.moved.Load(),
		Dropped: s.dropped.Load(), Failed: s.failed.Load(),
	}
	s.mu.Lock()
	st.Cancelled = len(s.cancelled)
	s.mu.Unlock()
	info, err := s.b.Topic(ctx, DelayTopic)
	if err != nil {
		return st, fmt.Errorf("describe %s: %w", DelayTopic, err)
	}
	st.Waiting = make([]int64, len(info.Ranges))
	for q, r := range info.Ranges {
		from, err := s.b.CommittedOffset(ctx, DelayGroup, DelayTopic, q)
		if err != nil && !errors.Is(err, core.ErrNoCommittedOffset) {
			return st, err
		}
		if st.Waiting[q], err = s.b.Backlog(ctx, DelayTopic, q, max(from, r.Min)); err != nil {
			return st, err
		}
	}
	return st, nil
}
