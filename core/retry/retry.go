package retry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
)

// Names of the system topics and internal groups. The '%' they contain
// cannot appear in a user topic or group, so they never collide with one.
const (
	retryPrefix = "%RETRY%"
	dlqPrefix   = "%DLQ%"
	// ScheduleTopic holds messages waiting for their redelivery time: one
	// queue per schedule level, so deliver-at times never decrease within a
	// queue.
	ScheduleTopic = "%SCHEDULE%"
	// SchedulerGroup is the internal group whose committed offsets on
	// ScheduleTopic record how far each level has been delivered.
	SchedulerGroup = "%SCHEDULER%"
	// RedriveGroup is the internal group whose committed offsets on a
	// dead-letter topic record how far Redrive has got.
	RedriveGroup = "%REDRIVE%"
	// MaxGroupLen is the longest group name ValidateGroup accepts.
	MaxGroupLen = 100
)

// Properties SendBack sets on the messages it stores. They travel with the
// message to the retry and dead-letter topics.
const (
	// PropOriginTopic is the topic the message was first produced to; kept
	// across repeated retries and redrives.
	PropOriginTopic = "retry.origin_topic"
	// PropOriginID is the ID of the message as first stored there; kept
	// across repeated retries and redrives.
	PropOriginID = "retry.origin_id"
	// PropReason is why the last consumption failed (at most MaxReasonLen
	// bytes).
	PropReason = "retry.reason"
	// PropDestination is the topic a scheduled message goes to when due. It
	// exists only in ScheduleTopic.
	PropDestination = "retry.destination"
	// PropShardingKey keeps the message's own sharding key while it waits in
	// ScheduleTopic, whose sharding key selects the schedule level. It exists
	// only in ScheduleTopic.
	PropShardingKey = "retry.sharding_key"
)

// MaxReasonLen bounds PropReason; longer reasons are cut.
const MaxReasonLen = 256

// Log field names.
const (
	fieldGroup     = "group"
	fieldTopic     = "topic"
	fieldID        = "id"
	fieldOriginID  = "origin_id"
	fieldAttempt   = "attempt"
	fieldLevel     = "level"
	fieldDeliverAt = "deliver_at"
	fieldOffset    = "offset"
	fieldCount     = "count"
)

// Attribute names of the hops a Service records (Options.Trace).
const (
	attrGroup   = "group"
	attrAttempt = "attempt"
	attrReason  = "reason"
	attrNextAt  = "next_at"
	attrOutcome = "outcome"
	attrDLQ     = "dlq"
)

// RetryTopic names the topic a group's redelivered messages come back on.
func RetryTopic(group string) string { return retryPrefix + group }

// DLQTopic names a group's dead-letter topic.
func DLQTopic(group string) string { return dlqPrefix + group }

// ValidateGroup reports whether group is a valid consumer group name:
// 1–100 characters of [A-Za-z0-9._-]. The error wraps ErrInvalidGroup.
func ValidateGroup(group string) error {
	if reason := core.NameProblem(group, MaxGroupLen); reason != "" {
		return fmt.Errorf("%w %q: %s", ErrInvalidGroup, group, reason)
	}
	return nil
}

// Outcome says where SendBack put a message.
type Outcome int

const (
	// Scheduled: the message will come back on the group's retry topic
	// after its back-off.
	Scheduled Outcome = iota + 1
	// DeadLettered: the message ran out of attempts and is in the group's
	// dead-letter topic.
	DeadLettered
)

func (o Outcome) String() string {
	switch o {
	case Scheduled:
		return "scheduled"
	case DeadLettered:
		return "dead-lettered"
	default:
		return "Outcome(" + strconv.Itoa(int(o)) + ")"
	}
}

// Service stores failed messages for delayed redelivery, delivers them when
// due, and dead-letters and redrives them. It is safe for concurrent use.
type Service struct {
	b    core.Broker
	opts Options
	log  zerolog.Logger
	// levelKeys[i] is a sharding key that core.QueueFor maps to queue i of
	// ScheduleTopic: the Broker interface picks queues only by key.
	levelKeys []string

	// ensured holds the retry and dead-letter topics known to exist.
	ensured sync.Map

	// redriveMu serialises Redrive, so two calls never move one message twice.
	redriveMu sync.Mutex

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	startOnce sync.Once
	closeOnce sync.Once
}

// New checks opts and creates ScheduleTopic with one queue per schedule
// level. It fails with an error wrapping core.ErrTopicExists when the topic
// exists with another queue count (the schedule's length changed). Call
// Start to begin delivering.
func New(b core.Broker, opts Options) (*Service, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil broker", ErrBadOptions)
	}
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Service{
		b:         b,
		opts:      opts,
		log:       opts.Logger.With().Str("component", "retry").Logger(),
		levelKeys: core.QueueKeys(len(opts.Schedule)),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if _, err := b.CreateTopic(s.ctx, core.TopicConfig{Name: ScheduleTopic, Queues: len(opts.Schedule)}); err != nil {
		s.cancel()
		return nil, fmt.Errorf("create %s with %d queues: %w", ScheduleTopic, len(opts.Schedule), err)
	}
	return s, nil
}

// MaxAttempts returns how many redeliveries a message gets before it is
// dead-lettered.
func (s *Service) MaxAttempts() int { return s.opts.MaxAttempts }

// Schedule returns a copy of the back-off schedule.
func (s *Service) Schedule() []time.Duration { return slices.Clone(s.opts.Schedule) }

// Start starts one scheduler goroutine per schedule level. Calls after the
// first do nothing.
func (s *Service) Start() {
	s.startOnce.Do(func() {
		for level := range s.opts.Schedule {
			s.wg.Go(func() { s.runLevel(s.ctx, level) })
		}
	})
}

// Close stops the schedulers and returns once they have ended. Scheduled
// messages stay stored and are delivered by the next Service. It is
// idempotent and never fails.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		s.startOnce.Do(func() {}) // a later Start starts nothing
		s.cancel()
		s.wg.Wait()
	})
	return nil
}

// SendBack stores a message group failed to consume for redelivery. m may
// come from the group's real topic or from its retry topic. Its next
// attempt is m.ReconsumeCount+1: beyond MaxAttempts it goes to DLQTopic(group)
// (DeadLettered); otherwise it waits in ScheduleTopic for
// Schedule[attempt-1] (the last level repeating) and then comes back on
// RetryTopic(group) with ReconsumeCount = attempt (Scheduled). Keys, tag,
// sharding key, body and properties are kept; PropOriginTopic and
// PropOriginID name the first original.
func (s *Service) SendBack(ctx context.Context, group string, m *core.StoredMessage, reason string) (Outcome, error) {
	if err := ValidateGroup(group); err != nil {
		return 0, err
	}
	if m == nil {
		return 0, fmt.Errorf("send back: %w: nil message", core.ErrInvalidMessage)
	}
	attempt := m.ReconsumeCount + 1
	if attempt > s.opts.MaxAttempts {
		if err := s.DeadLetter(ctx, group, m, reason); err != nil {
			return 0, err
		}
		return DeadLettered, nil
	}
	dest := RetryTopic(group)
	if err := s.ensure(ctx, dest); err != nil {
		return 0, err
	}
	level := min(attempt-1, len(s.opts.Schedule)-1)
	msg := carry(m, reason)
	if m.ShardingKey != "" {
		msg.Properties[PropShardingKey] = m.ShardingKey
	}
	msg.Properties[PropDestination] = dest
	msg.Topic = ScheduleTopic
	msg.ShardingKey = s.levelKeys[level]
	msg.DeliverAt = s.opts.Clock.Now().Add(s.opts.Schedule[level])
	msg.ReconsumeCount = attempt
	res, err := s.b.Produce(ctx, msg)
	if err != nil {
		return 0, fmt.Errorf("schedule retry of %s for group %s: %w", m.ID, group, err)
	}
	s.log.Debug().Str(fieldGroup, group).Str(fieldID, m.ID.String()).Str(fieldOriginID, msg.Properties[PropOriginID]).
		Int(fieldAttempt, attempt).Int(fieldLevel, level).Time(fieldDeliverAt, msg.DeliverAt).
		Int64(fieldOffset, res.QueueOffset).Msg("message scheduled for redelivery")
	if rec := s.opts.Trace; rec.Enabled(trace.TopicOf(m)) {
		rec.Record(trace.Event{ID: trace.IDOf(m), Hop: trace.HopRetry, Actor: group, Attrs: map[string]string{
			attrGroup: group, attrAttempt: strconv.Itoa(attempt), attrReason: msg.Properties[PropReason],
			attrNextAt: msg.DeliverAt.UTC().Format(time.RFC3339Nano), attrOutcome: Scheduled.String(),
		}})
	}
	return Scheduled, nil
}

// DeadLetter moves m straight to DLQTopic(group), keeping its reconsume
// count, whatever the count is. SendBack calls it once attempts run out;
// consumers that keep order (which redeliver in place) call it directly.
func (s *Service) DeadLetter(ctx context.Context, group string, m *core.StoredMessage, reason string) error {
	if err := ValidateGroup(group); err != nil {
		return err
	}
	if m == nil {
		return fmt.Errorf("dead-letter: %w: nil message", core.ErrInvalidMessage)
	}
	dlq := DLQTopic(group)
	if err := s.ensure(ctx, dlq); err != nil {
		return err
	}
	msg := carry(m, reason)
	msg.Topic = dlq
	msg.ReconsumeCount = m.ReconsumeCount
	res, err := s.b.Produce(ctx, msg)
	if err != nil {
		return fmt.Errorf("dead-letter %s for group %s: %w", m.ID, group, err)
	}
	s.log.Warn().Str(fieldGroup, group).Str(fieldID, m.ID.String()).Str(fieldOriginID, msg.Properties[PropOriginID]).
		Str(fieldTopic, msg.Properties[PropOriginTopic]).Int(fieldAttempt, m.ReconsumeCount).
		Int64(fieldOffset, res.QueueOffset).Msg("message dead-lettered")
	if rec := s.opts.Trace; rec.Enabled(trace.TopicOf(m)) {
		rec.Record(trace.Event{ID: trace.IDOf(m), Hop: trace.HopDeadLetter, Actor: group, Attrs: map[string]string{
			attrGroup: group, attrAttempt: strconv.Itoa(m.ReconsumeCount + 1), attrReason: msg.Properties[PropReason], attrDLQ: dlq,
		}})
	}
	return nil
}

// carry copies what travels with m into a new message: sharding key, tag,
// keys, body, born time and properties, plus the origin and reason
// properties. Scheduling-only properties are dropped.
func carry(m *core.StoredMessage, reason string) *core.Message {
	props := make(map[string]string, len(m.Properties)+3)
	maps.Copy(props, m.Properties)
	delete(props, PropDestination)
	delete(props, PropShardingKey)
	if props[PropOriginTopic] == "" {
		props[PropOriginTopic] = m.Topic
	}
	if props[PropOriginID] == "" {
		props[PropOriginID] = m.ID.String()
	}
	if reason != "" {
		props[PropReason] = cut(reason, MaxReasonLen)
	} else {
		delete(props, PropReason)
	}
	return &core.Message{
		ShardingKey: m.ShardingKey,
		Tag:         m.Tag,
		Keys:        slices.Clone(m.Keys),
		Properties:  props,
		Body:        m.Body,
		BornAt:      m.BornAt,
	}
}

// cut shortens s to at most n bytes without splitting a UTF-8 sequence.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// ensure creates a retry or dead-letter topic with one queue, as RocketMQ
// does, unless it is known to exist. One that exists with more queues (it
// was auto-created by someone's produce) is used as it is.
func (s *Service) ensure(ctx context.Context, topic string) error {
	if _, ok := s.ensured.Load(topic); ok {
		return nil
	}
	_, err := s.b.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 1})
	switch {
	case errors.Is(err, core.ErrTopicExists):
		s.log.Info().Str(fieldTopic, topic).Msg("system topic has more than one queue; using it as it is")
	case err != nil:
		return fmt.Errorf("create %s: %w", topic, err)
	}
	s.ensured.Store(topic, true)
	return nil
}
