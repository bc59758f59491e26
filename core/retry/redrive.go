package retry

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/ferrymq/ferrymq/core"
)

// redriveBatch bounds how many dead letters Redrive moves per produce.
const redriveBatch = 256

// Redrive moves up to max of group's dead-lettered messages back to the
// topic they were first produced to (PropOriginTopic), oldest first within
// each queue of the dead-letter topic, with ReconsumeCount reset to 0. Its
// progress is the committed offset of RedriveGroup on the dead-letter topic,
// so a message is redriven once even across restarts (at-least-once: a
// crash between produce and commit redrives it again). The dead letters stay
// readable in the dead-letter topic. It returns how many messages it moved;
// a group without dead letters moves none.
func (s *Service) Redrive(ctx context.Context, group string, max int) (int, error) {
	if err := ValidateGroup(group); err != nil {
		return 0, err
	}
	if max < 1 {
		return 0, fmt.Errorf("%w: got %d", ErrInvalidMax, max)
	}
	s.redriveMu.Lock()
	defer s.redriveMu.Unlock()

	dlq := DLQTopic(group)
	info, err := s.b.Topic(ctx, dlq)
	if errors.Is(err, core.ErrTopicNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("redrive %s: %w", dlq, err)
	}
	moved := 0
	for q := 0; q < len(info.Ranges) && moved < max; q++ {
		n, err := s.redriveQueue(ctx, group, dlq, q, max-moved)
		moved += n
		if err != nil {
			return moved, err
		}
	}
	if moved > 0 {
		s.log.Info().Str(fieldGroup, group).Int(fieldCount, moved).Msg("dead letters redriven")
	}
	return moved, nil
}

func (s *Service) redriveQueue(ctx context.Context, group, dlq string, queue, max int) (int, error) {
	off, err := s.b.CommittedOffset(ctx, RedriveGroup, dlq, queue)
	if err != nil && !errors.Is(err, core.ErrNoCommittedOffset) {
		return 0, fmt.Errorf("redrive %s/%d: %w", dlq, queue, err)
	}
	moved := 0
	for moved < max {
		res, err := s.b.Read(ctx, core.ReadRequest{Topic: dlq, Queue: queue, Offset: off, MaxCount: min(max-moved, redriveBatch)})
		if err != nil {
			var ce *core.CorruptError
			if !errors.As(err, &ce) || ce.QueueOffset < off {
				return moved, fmt.Errorf("redrive %s/%d at %d: %w", dlq, queue, off, err)
			}
			s.log.Error().Err(err).Str(fieldTopic, dlq).Int64(fieldOffset, ce.QueueOffset).Msg("corrupt dead letter skipped")
			res.NextOffset = ce.QueueOffset + 1
		}
		if res.NextOffset == off {
			return moved, nil
		}
		out := make([]*core.Message, 0, len(res.Messages))
		for _, m := range res.Messages {
			origin := m.Properties[PropOriginTopic]
			if origin == "" {
				s.log.Warn().Str(fieldTopic, dlq).Str(fieldID, m.ID.String()).Msg("dead letter without origin topic not redriven")
				continue
			}
			props := maps.Clone(m.Properties)
			delete(props, PropReason)
			out = append(out, &core.Message{
				Topic:       origin,
				ShardingKey: m.ShardingKey,
				Tag:         m.Tag,
				Keys:        m.Keys,
				Properties:  props,
				Body:        m.Body,
				BornAt:      m.BornAt,
			})
		}
		if len(out) > 0 {
			if _, err := s.b.ProduceBatch(ctx, out); err != nil {
				return moved, fmt.Errorf("redrive %s/%d: %w", dlq, queue, err)
			}
		}
		off = res.NextOffset
		if err := s.b.CommitOffset(ctx, RedriveGroup, dlq, queue, off); err != nil {
			return moved + len(out), fmt.Errorf("redrive %s/%d: commit %d: %w", dlq, queue, off, err)
		}
		moved += len(out)
	}
	return moved, nil
}
