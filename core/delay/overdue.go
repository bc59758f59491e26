package delay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// Overdue is how late the most overdue copy is: for each level, the copy
// at DelayGroup's committed offset — the next to move on, the earliest of
// its level — is compared with the clock; 0 when none is past its time.
// Copies move on within a poll interval of their time while the service
// runs, so a lateness well beyond that means delivery is stuck (the store
// refuses writes, a level's goroutine is failing).
func (s *Service) Overdue(ctx context.Context) (time.Duration, error) {
	info, err := s.b.Topic(ctx, DelayTopic)
	if errors.Is(err, core.ErrTopicNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("delay overdue: %w", err)
	}
	now := s.opts.Clock.Now()
	var late time.Duration
	for level, r := range info.Ranges {
		from, err := s.b.CommittedOffset(ctx, DelayGroup, DelayTopic, level)
		if errors.Is(err, core.ErrNoCommittedOffset) {
			from, err = r.Min, nil
		}
		if err != nil {
			return 0, fmt.Errorf("delay overdue, level %d: %w", level, err)
		}
		if from >= r.Max {
			continue
		}
		res, err := s.b.Read(ctx, core.ReadRequest{Topic: DelayTopic, Queue: level, Offset: max(from, r.Min), MaxCount: 1})
		if err != nil {
			return 0, fmt.Errorf("delay overdue, level %d: %w", level, err)
		}
		if len(res.Messages) > 0 {
			late = max(late, now.Sub(res.Messages[0].DeliverAt))
		}
	}
	return late, nil
}
