package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

func (s *Store) retentionLoop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.RetentionInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if _, err := s.RunRetention(); err != nil {
				s.log.Error().Err(err).Msg("retention")
			}
		case <-ctx.Done():
			return
		}
	}
}

// RunRetention deletes whole segments that are past the retention age or
// above the disk ceiling, oldest first, never the active one; consume-queue
// and index files that only point into deleted segments follow. It runs
// every RetentionInterval by itself; calling it is for tests and operators.
// It returns the number of segments deleted.
func (s *Store) RunRetention() (int, error) {
	if s.closed.Load() {
		return 0, nil
	}
	deleted := 0
	cutoff := s.opts.Now().Add(-s.opts.Retention).UnixNano()
	for {
		segs := s.cl.segmentList()
		if len(segs) < 2 {
			break
		}
		expired, err := s.segmentOlderThan(segs[1][0], cutoff)
		if err != nil {
			return deleted, err
		}
		over := s.opts.MaxDiskBytes > 0 && s.cl.diskBytes() > s.opts.MaxDiskBytes
		if !expired && !over {
			break
		}
		seg, err := s.cl.removeOldest()
		if err != nil {
			return deleted, err
		}
		if seg == nil {
			break
		}
		deleted++
		s.log.Info().Str("segment", segmentName(seg.base)).Bool("expired", expired).Bool("over_ceiling", over).
			Msg("segment deleted by retention")
	}
	if deleted == 0 {
		return 0, nil
	}
	logMin, _ := s.cl.bounds()
	var errs []error
	for _, t := range s.topicList() {
		for _, cq := range t.slots() {
			if err := s.raiseMin(cq, logMin); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := s.idx.dropBefore(logMin); err != nil {
		errs = append(errs, err)
	}
	return deleted, errors.Join(errs...)
}

// segmentOlderThan reports whether every record before nextBase is older
// than cutoff: the first record of the following segment is, since store
// times never decrease along the log.
func (s *Store) segmentOlderThan(nextBase, cutoff int64) (bool, error) {
	limit := s.confirmed.Load()
	if nextBase+offStoredAt+8 > limit {
		return false, nil
	}
	at, err := s.storedAtOf(nextBase, limit)
	if err != nil {
		return false, fmt.Errorf("read store time at %d: %w", nextBase, err)
	}
	return at < cutoff, nil
}
