package pop

import (
	"container/heap"
	"context"
	"errors"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/retry"
)

// deadlineHeap orders in-flight entries by deadline; each entry knows its
// index, so an ack removes it and a change of invisible time moves it.
type deadlineHeap []*entry

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *deadlineHeap) Push(x any) {
	e := x.(*entry)
	e.idx = len(*h)
	*h = append(*h, e)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.idx = -1
	return e
}

func (h *deadlineHeap) remove(e *entry) {
	if e.idx >= 0 {
		heap.Remove(h, e.idx)
	}
}

func (h *deadlineHeap) move(e *entry, deadline time.Time) {
	e.deadline = deadline
	heap.Fix(h, e.idx)
}

// schedule starts e's deadline.
func (s *Service) schedule(e *entry, deadline time.Time) {
	s.heapMu.Lock()
	e.deadline = deadline
	heap.Push(&s.deadlines, e)
	top := e.idx == 0
	s.heapMu.Unlock()
	if top {
		s.kick()
	}
}

// reviveBatch bounds how many expired entries the reviver takes at once.
const reviveBatch = 256

// revive handles entries whose deadline passed. It sleeps on a timer set to
// the earliest deadline, or until that deadline moves earlier.
func (s *Service) revive(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		now := s.opts.Now()
		var due []*entry
		wait := time.Duration(-1)
		s.heapMu.Lock()
		for len(s.deadlines) > 0 && !now.Before(s.deadlines[0].deadline) && len(due) < reviveBatch {
			due = append(due, heap.Pop(&s.deadlines).(*entry))
		}
		if len(s.deadlines) > 0 {
			wait = s.deadlines[0].deadline.Sub(now)
		}
		s.heapMu.Unlock()
		if len(due) > 0 {
			for _, e := range due {
				if ctx.Err() != nil {
					return
				}
				s.expire(ctx, e)
			}
			continue
		}
		var fire <-chan time.Time
		if wait > 0 {
			timer.Reset(wait)
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-fire:
		}
		timer.Stop()
	}
}

// expire handles one entry whose deadline passed (it is out of the heap, so
// no handle for it works any more). An orderly entry with attempts left
// becomes ready for redelivery in place; any other is sent back through the
// retry service — to the retry topic, or to the dead-letter topic once its
// attempts are used up — and then counts as done.
func (s *Service) expire(ctx context.Context, e *entry) {
	q := e.q
	q.mu.Lock()
	if q.inflight[e.offset] != e || e.state != stateInvisible {
		q.mu.Unlock()
		return
	}
	e.gen = s.gen.Add(1)
	if e.orderly && e.attempt <= s.r.MaxAttempts() {
		e.state = stateReady
		e.attempt++
		q.invisible--
		q.ready++
		q.mu.Unlock()
		s.log.Debug().Str(fieldGroup, q.key.group).Str(fieldTopic, q.key.topic).Int(fieldQueue, q.key.queue).
			Int64(fieldOffset, e.offset).Int(fieldAttempt, e.attempt).Msg("orderly message visible again")
		s.signal()
		return
	}
	e.state = stateExpiring
	attempt := e.attempt
	q.mu.Unlock()

	out, err := s.sendBack(ctx, q.key.group, e.id, attempt)

	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error().Err(err).Str(fieldGroup, q.key.group).Str(fieldTopic, q.key.topic).Int(fieldQueue, q.key.queue).
				Int64(fieldOffset, e.offset).Msg("send back expired message; will try again")
		}
		e.state = stateInvisible
		s.schedule(e, s.opts.Now().Add(s.opts.RetryInterval))
		return
	}
	full := s.fullLocked(q)
	q.doneLocked(e)
	s.advanceLocked(ctx, q)
	s.log.Info().Str(fieldGroup, q.key.group).Str(fieldTopic, q.key.topic).Int(fieldQueue, q.key.queue).
		Int64(fieldOffset, e.offset).Int(fieldAttempt, attempt).Stringer(fieldOutcome, out).Msg("invisible time expired")
	if full || e.orderly {
		s.signal()
	}
}

// sendBack hands an expired message to the retry service with the number of
// deliveries it had.
func (s *Service) sendBack(ctx context.Context, group string, id core.MessageID, attempt int) (retry.Outcome, error) {
	m, err := s.b.Get(ctx, id)
	if errors.Is(err, core.ErrMessageNotFound) {
		s.log.Warn().Str(fieldGroup, group).Str("id", id.String()).Msg("expired message removed by retention; dropped")
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	m.ReconsumeCount = attempt - 1
	return s.r.SendBack(ctx, group, m, ReasonExpired)
}
