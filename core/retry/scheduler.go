package retry

import (
	"context"
	"maps"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/follow"
)

// schedulerBatch is how many scheduled messages a level reads at once.
const schedulerBatch = 64

// runLevel delivers one schedule level: it reads the level's queue of
// ScheduleTopic from SchedulerGroup's committed offset, waits for the head's
// deliver-at time, produces every due message to its destination and then
// commits past it. Deliver-at times never decrease within a level, so the
// head is always the next one due; a head already due (after a restart)
// goes at once.
func (s *Service) runLevel(ctx context.Context, level int) {
	log := s.log.With().Int(fieldLevel, level).Logger()
	q := follow.Queue{Broker: s.b, Topic: ScheduleTopic, Queue: level, Group: SchedulerGroup, Batch: schedulerBatch,
		Poll: s.opts.PollInterval, Log: log, Name: "scheduled messages"}
	q.Run(ctx, func(ctx context.Context, timer *time.Timer, msgs []*core.StoredMessage) (int64, bool) {
		return s.deliver(ctx, log, timer, level, msgs)
	})
}

// deliver produces msgs (one level's, in queue order) to their destinations
// as they fall due. It returns the offset after the last one delivered and
// false once ctx is done.
func (s *Service) deliver(ctx context.Context, log zerolog.Logger, timer *time.Timer, level int, msgs []*core.StoredMessage) (int64, bool) {
	next := msgs[0].QueueOffset
	for len(msgs) > 0 {
		if wait := s.opts.Clock.Until(msgs[0].DeliverAt); wait > 0 {
			if !follow.Pause(ctx, timer, nil, wait) {
				return next, false
			}
			continue // re-check the clock
		}
		now := s.opts.Clock.Now()
		due := 0
		for due < len(msgs) && !msgs[due].DeliverAt.After(now) {
			due++
		}
		if due == 0 {
			continue // the clock went back between the two readings
		}
		out := make([]*core.Message, 0, due)
		for _, m := range msgs[:due] {
			if d := m.Properties[PropDestination]; d == "" {
				log.Error().Str(fieldID, m.ID.String()).Int64(fieldOffset, m.QueueOffset).
					Msg("scheduled message without destination skipped")
				continue
			}
			out = append(out, unschedule(m))
		}
		if len(out) > 0 {
			if _, err := s.b.ProduceBatch(ctx, out); err != nil {
				if ctx.Err() != nil {
					return next, false
				}
				log.Error().Err(err).Int(fieldCount, len(out)).Msg("deliver scheduled messages")
				// Re-read from the first undelivered one after a pause.
				return next, follow.Pause(ctx, timer, nil, s.opts.PollInterval)
			}
		}
		for _, m := range out {
			log.Debug().Str(fieldTopic, m.Topic).Str(fieldOriginID, m.Properties[PropOriginID]).
				Int(fieldAttempt, m.ReconsumeCount).Msg("message redelivered")
		}
		next = msgs[due-1].QueueOffset + 1
		msgs = msgs[due:]
	}
	return next, true
}

// unschedule turns a message of ScheduleTopic back into the one its
// destination gets: its own sharding key restored, scheduling properties and
// deliver-at dropped, everything else (reconsume count included) kept.
func unschedule(m *core.StoredMessage) *core.Message {
	props := maps.Clone(m.Properties)
	dest := props[PropDestination]
	key := props[PropShardingKey]
	delete(props, PropDestination)
	delete(props, PropShardingKey)
	return &core.Message{
		Topic:          dest,
		ShardingKey:    key,
		Tag:            m.Tag,
		Keys:           m.Keys,
		Properties:     props,
		Body:           m.Body,
		BornAt:         m.BornAt,
		ReconsumeCount: m.ReconsumeCount,
	}
}
