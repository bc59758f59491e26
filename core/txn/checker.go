package txn

import (
	"context"
	"errors"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// checkBatch bounds how many due halves the checker takes at once.
const checkBatch = 256

// run is the checker goroutine. It takes the halves whose next check is due
// (earliest first), checks, parks or discards each, commits TxnGroup's
// progress, and sleeps until the next check is due, a new half or Checker
// arrives, or PollInterval passes.
func (s *Service) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	due := make([]*half, 0, checkBatch)
	for {
		now := s.opts.Now().UnixNano()
		wait := s.opts.PollInterval
		due = due[:0]
		s.mu.Lock()
		for len(due) < checkBatch {
			h := s.byCheck.top()
			if h == nil {
				break
			}
			if h.nextCheck > now {
				wait = min(wait, time.Duration(h.nextCheck-now))
				break
			}
			due = append(due, s.byCheck.pop())
		}
		s.mu.Unlock()
		for i, h := range due {
			if ctx.Err() != nil {
				s.requeue(due[i:], now)
				return
			}
			s.check(ctx, h, now)
		}
		s.commitProgress(ctx)
		if len(due) > 0 {
			continue
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// requeue puts back halves taken for checking but not checked.
func (s *Service) requeue(hs []*half, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range hs {
		s.retryLocked(h, now)
	}
}

// retryLocked puts h, taken out of byCheck, back for a check after
// PollInterval — unless it was resolved meanwhile.
func (s *Service) retryLocked(h *half, now int64) {
	if s.halves[h.id] != h {
		return
	}
	h.nextCheck = now + int64(s.opts.PollInterval)
	s.byCheck.add(h)
}

// check handles one due half h, which the caller took out of byCheck: with
// its checks used up it is discarded; with no Checker of its group it is
// parked until one registers (not counted as a check); otherwise one
// Checker is asked, the check is recorded, and the next one scheduled.
func (s *Service) check(ctx context.Context, h *half, now int64) {
	s.mu.Lock()
	if s.halves[h.id] != h {
		s.mu.Unlock()
		return
	}
	if h.resolving { // an End is writing its outcome: look again later
		s.retryLocked(h, now)
		s.mu.Unlock()
		return
	}
	if h.checks >= s.opts.MaxChecks {
		h.resolving = true
		s.mu.Unlock()
		s.discard(ctx, h, now, "checks exhausted")
		return
	}
	cs := s.checkers[h.group]
	if cs == nil {
		s.parkLocked(h)
		warn := !s.warned[h.group]
		s.warned[h.group] = true
		s.mu.Unlock()
		ev := s.log.Debug()
		if warn {
			ev = s.log.Warn()
		}
		ev.Str(fieldGroup, h.group.Value()).Str(fieldID, h.id.String()).
			Msg("no producer of the group connected: check-backs wait")
		return
	}
	checkers := cs.rotation()
	checks := h.checks
	s.mu.Unlock()

	m, err := s.b.Get(ctx, h.id)
	if errors.Is(err, core.ErrMessageNotFound) {
		if s.claim(h) {
			s.discard(ctx, h, now, "half message removed by retention")
		}
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error().Err(err).Str(fieldID, h.id.String()).Msg("read half message for check-back")
		}
		s.requeue([]*half{h}, now)
		return
	}
	sent := false
	for _, c := range checkers {
		if err := c.CheckTransaction(m); err != nil {
			s.log.Debug().Err(err).Str(fieldGroup, h.group.Value()).Str(fieldID, h.id.String()).
				Msg("producer refused check-back")
			continue
		}
		sent = true
		break
	}
	if !sent {
		s.requeue([]*half{h}, now)
		return
	}
	checks++
	res, err := s.b.Produce(ctx, opMessage(OpCheck, h, checks))
	if err != nil && ctx.Err() == nil {
		// The check was sent; only a restart would forget it was.
		s.log.Error().Err(err).Str(fieldID, h.id.String()).Int(fieldChecks, checks).Msg("record check-back")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		s.seenLocked(res.QueueOffset)
	}
	h.checks = checks
	s.checks++
	if s.halves[h.id] == h {
		// From the clock now, not the round's start: the check took time,
		// and a half a Register brought back may have been taken with a
		// reading older than its due time.
		h.nextCheck = max(now, s.opts.Now().UnixNano()) + int64(s.opts.CheckInterval)
		s.byCheck.add(h)
	}
	s.log.Debug().Str(fieldGroup, h.group.Value()).Str(fieldID, h.id.String()).Int(fieldChecks, checks).
		Msg("check-back sent")
}

// claim marks h, taken out of byCheck, as being resolved by the checker;
// false if an End got there first (h is then requeued if still pending).
func (s *Service) claim(h *half) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halves[h.id] != h {
		return false
	}
	if h.resolving {
		s.retryLocked(h, s.opts.Now().UnixNano())
		return false
	}
	h.resolving = true
	return true
}

// discard writes h's discard op record; h is marked resolving and out of
// byCheck. On failure h is checked again after PollInterval.
func (s *Service) discard(ctx context.Context, h *half, now int64, reason string) {
	res, err := s.b.Produce(ctx, opMessage(OpDiscard, h, h.checks))
	s.mu.Lock()
	if err != nil {
		h.resolving = false
		s.retryLocked(h, now)
		s.mu.Unlock()
		if ctx.Err() == nil {
			s.log.Error().Err(err).Str(fieldID, h.id.String()).Msg("record discarded half")
		}
		return
	}
	s.seenLocked(res.QueueOffset)
	s.resolveLocked(h, StateDiscarded)
	checks := h.checks
	s.mu.Unlock()
	s.log.Error().Str(fieldGroup, h.group.Value()).Str(fieldID, h.id.String()).Str(fieldTopic, h.topic.Value()).
		Int(fieldChecks, checks).Str("reason", reason).Msg("transaction discarded without an outcome")
}

// commitProgress moves TxnGroup's committed offset up to the oldest pending
// half, or to the end of what this Service has seen when none is pending.
// A SendHalf in progress holds it at the tail from when it began, since its
// half may land at any offset from there.
func (s *Service) commitProgress(ctx context.Context) {
	s.mu.Lock()
	bound := s.tail
	if h := s.byOffset.top(); h != nil {
		bound = min(bound, h.offset)
	}
	for _, floor := range s.inflight {
		bound = min(bound, floor)
	}
	s.mu.Unlock()
	if bound <= s.committed {
		return
	}
	if err := s.b.CommitOffset(ctx, TxnGroup, HalfTopic, 0, bound); err != nil {
		if ctx.Err() == nil && !errors.Is(err, core.ErrClosed) {
			s.log.Error().Err(err).Int64(fieldOffset, bound).Msg("commit transaction progress")
		}
		return
	}
	s.committed = bound
}
