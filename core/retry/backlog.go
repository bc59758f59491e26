package retry

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferrymq/ferrymq/core"
)

// Backlog is how many messages wait in ScheduleTopic for their
// redelivery: stored there and not yet delivered by the schedulers, over
// every level.
func (s *Service) Backlog(ctx context.Context) (int64, error) {
	var total int64
	for level := range s.opts.Schedule {
		from, err := s.b.CommittedOffset(ctx, SchedulerGroup, ScheduleTopic, level)
		if errors.Is(err, core.ErrNoCommittedOffset) {
			from, err = 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("retry backlog, level %d: %w", level, err)
		}
		n, err := s.b.Backlog(ctx, ScheduleTopic, level, from)
		if err != nil {
			return 0, fmt.Errorf("retry backlog, level %d: %w", level, err)
		}
		total += n
	}
	return total, nil
}
