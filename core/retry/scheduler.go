package retry

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
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
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()

	var offset int64
	for {
		o, err := s.b.CommittedOffset(ctx, SchedulerGroup, ScheduleTopic, level)
		if err == nil || errors.Is(err, core.ErrNoCommittedOffset) {
			offset = o
			break
		}
		log.Error().Err(err).Msg("read scheduler offset")
		if !pause(ctx, timer, nil, s.opts.PollInterval) {
			return
		}
	}

	for {
		arrivals := s.b.Arrivals(ScheduleTopic) // before the read: no arrival is missed
		res, err := s.b.Read(ctx, core.ReadRequest{Topic: ScheduleTopic, Queue: level, Offset: offset, MaxCount: schedulerBatch})
		if err != nil {
			var ce *core.CorruptError
			if errors.As(err, &ce) && ce.QueueOffset >= offset {
				log.Error().Err(err).Int64(fieldOffset, ce.QueueOffset).Msg("corrupt scheduled message skipped")
				offset = ce.QueueOffset + 1
				s.commit(ctx, log, level, offset)
				continue
			}
			if ctx.Err() != nil {
				return
			}
			log.Error().Err(err).Int64(fieldOffset, offset).Msg("read scheduled messages")
			if !pause(ctx, timer, nil, s.opts.PollInterval) {
				return
			}
			continue
		}
		if res.Clamped && offset < res.Range.Min {
			log.Warn().Int64(fieldOffset, offset).Int64("min_offset", res.Range.Min).
				Msg("scheduled messages removed by retention before delivery")
		}
		if len(res.Messages) == 0 {
			if res.NextOffset != offset {
				offset = res.NextOffset
				s.commit(ctx, log, level, offset)
			}
			if !pause(ctx, timer, arrivals, s.opts.PollInterval) {
				return
			}
			continue
		}
		next, ok := s.deliver(ctx, log, timer, level, res.Messages)
		if next > offset {
			offset = next
			s.commit(ctx, log, level, offset)
		}
		if !ok {
			return
		}
	}
}

// deliver produces msgs (one level's, in queue order) to their destinations
// as they fall due. It returns the offset after the last one delivered and
// false once ctx is done.
func (s *Service) deliver(ctx context.Context, log zerolog.Logger, timer *time.Timer, level int, msgs []*core.StoredMessage) (int64, bool) {
	next := msgs[0].QueueOffset
	for len(msgs) > 0 {
		if wait := msgs[0].DeliverAt.Sub(s.opts.Now()); wait > 0 {
			if !pause(ctx, timer, nil, wait) {
				return next, false
			}
			continue // re-check the clock
		}
		now := s.opts.Now()
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
				return next, pause(ctx, timer, nil, s.opts.PollInterval)
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

func (s *Service) commit(ctx context.Context, log zerolog.Logger, level int, offset int64) {
	if err := s.b.CommitOffset(ctx, SchedulerGroup, ScheduleTopic, level, offset); err != nil && ctx.Err() == nil {
		log.Error().Err(err).Int64(fieldOffset, offset).Msg("commit scheduler offset")
	}
}

// pause waits for d, for wake (if not nil) or for ctx; it returns false once
// ctx is done.
func pause(ctx context.Context, timer *time.Timer, wake <-chan struct{}, d time.Duration) bool {
	timer.Reset(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
		return true
	case <-timer.C:
		return true
	}
}
