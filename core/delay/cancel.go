package delay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// Pending describes a delayed message not yet delivered.
type Pending struct {
	// ID is the ID its producer got.
	ID    core.MessageID
	Topic string
	Due   time.Time
	// Level is the level its newest copy waits in, Exit when it comes out.
	Level int
	Exit  time.Time
	// Copy is the newest stored copy, with the waiting properties.
	Copy *core.StoredMessage
	// Cancelled is set for a message cancelled whose copy is still stored.
	Cancelled bool
}

// Lookup finds the delayed message the producer got id for: its newest
// waiting copy. It fails with an error wrapping core.ErrMessageNotFound when
// no copy is stored (never delayed here, or gone with retention),
// ErrAlreadyDue once the message was delivered (its newest copy came out of
// its level, or id is the delivered message's) and ErrNotDelayed for the ID
// of a message that is not a delayed one. A cancelled message is found,
// marked Cancelled, as long as its copies are stored.
func (s *Service) Lookup(ctx context.Context, id core.MessageID) (Pending, error) {
	first, err := s.b.Get(ctx, id)
	if err != nil && !errors.Is(err, core.ErrMessageNotFound) {
		return Pending{}, err
	}
	if first != nil && first.Topic != DelayTopic {
		if v := first.Properties[PropID]; v != "" {
			return Pending{}, fmt.Errorf("%w: %s was delivered to %s as %s", ErrAlreadyDue, v, first.Topic, id)
		}
		return Pending{}, fmt.Errorf("%w: %s is a message of topic %s", ErrNotDelayed, id, first.Topic)
	}
	if first != nil {
		w, err := parseWaiting(first)
		if err != nil {
			return Pending{}, err
		}
		if w.id != id { // a later copy's ID: look for the original's
			return s.Lookup(ctx, w.id)
		}
	}
	// Later copies carry the original ID as an index key; a copy waits at
	// most MaxHold, so the newest one is that recent, unless the server was
	// down meanwhile.
	newest, err := s.newestCopy(ctx, id, first)
	if err != nil {
		return Pending{}, err
	}
	if newest == nil {
		return Pending{}, fmt.Errorf("delayed message %s: %w", id, core.ErrMessageNotFound)
	}
	// Copies stay stored after they move on: a copy its level committed
	// past has come out. Its successor, if any, was stored (and indexed)
	// before that commit, so a search made after reading the commit finds
	// it; with none, the message was delivered or dropped.
	moved := false
	for {
		from, err := s.b.CommittedOffset(ctx, DelayGroup, DelayTopic, newest.Queue)
		if errors.Is(err, core.ErrNoCommittedOffset) {
			from, err = 0, nil
		}
		if err != nil {
			return Pending{}, err
		}
		if newest.QueueOffset >= from {
			break
		}
		again, err := s.newestCopy(ctx, id, newest)
		if err != nil {
			return Pending{}, err
		}
		if again == newest {
			moved = true
			break
		}
		newest = again
	}
	w, err := parseWaiting(newest)
	if err != nil {
		return Pending{}, err
	}
	p := Pending{ID: id, Topic: w.topic, Due: w.due, Level: newest.Queue, Exit: newest.DeliverAt, Copy: newest}
	s.mu.Lock()
	_, p.Cancelled = s.cancelled[id]
	s.mu.Unlock()
	// A copy that moved on before its due time moved to another level (the
	// index may not show the successor yet): still pending. At or after it,
	// the message was delivered.
	if moved && !p.Cancelled && !w.due.After(s.opts.Clock.Now()) {
		return Pending{}, fmt.Errorf("%w: %s was delivered to %s (due %s)", ErrAlreadyDue, id, w.topic, w.due.UTC().Format(time.RFC3339))
	}
	return p, nil
}

// newestCopy returns the newest stored copy of the delayed message id:
// known, if not nil, or one found by the index key later copies carry.
func (s *Service) newestCopy(ctx context.Context, id core.MessageID, known *core.StoredMessage) (*core.StoredMessage, error) {
	copies, err := s.b.FindByKey(ctx, DelayTopic, id.String(), core.KeyQuery{Max: 1 << 10})
	if err != nil && !errors.Is(err, core.ErrMessageNotFound) {
		return nil, err
	}
	newest := known
	for _, c := range copies {
		if newest == nil || c.CommitLogOffset > newest.CommitLogOffset {
			newest = c
		}
	}
	return newest, nil
}

// Cancel cancels the delayed message the producer got id for, so that it is
// never delivered. The cancellation is fsynced before Cancel returns.
// Errors: core.ErrMessageNotFound (unknown ID), ErrNotDelayed,
// ErrAlreadyDue (delivered or being delivered), ErrAlreadyCancelled,
// ErrCancelLog.
func (s *Service) Cancel(ctx context.Context, id core.MessageID) (Pending, error) {
	p, err := s.Lookup(ctx, id)
	if err != nil {
		return Pending{}, fmt.Errorf("cancel %s: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.cancelled[id]; ok {
		return p, fmt.Errorf("cancel %s: %w", id, ErrAlreadyCancelled)
	}
	if _, ok := s.firing[id]; ok || !p.Due.After(s.opts.Clock.Now()) {
		return p, fmt.Errorf("cancel %s: %w: it was due at %s", id, ErrAlreadyDue, p.Due.UTC().Format(time.RFC3339))
	}
	// Under mu, so no level delivers it between the record and the map.
	if err := s.cancels.append(cancelEntry{id: id, due: p.Due.UnixNano()}); err != nil {
		return p, fmt.Errorf("cancel %s: %w", id, err)
	}
	s.cancelled[id] = p.Due
	p.Cancelled = true
	s.log.Info().Str(fieldID, id.String()).Str(fieldTopic, p.Topic).Time(fieldDue, p.Due).Msg("delayed message cancelled")
	return p, nil
}

// ListRequest pages through pending messages.
type ListRequest struct {
	// Topic, when set, keeps only messages for that topic.
	Topic string
	// Cursor continues a previous page (ListResult.Next); zero starts.
	Cursor Cursor
	// Max bounds the page; 0 means 100, at most 1,000.
	Max int
}

// Cursor is a position in the levels: level, then queue offset.
type Cursor struct {
	Level  int
	Offset int64
}

// ListResult is one page of pending messages, in level order (finest first)
// then in exit order within a level: roughly soonest due first, not sorted.
type ListResult struct {
	Pending []Pending
	// Next continues the listing; Done is set when there is nothing more.
	Next Cursor
	Done bool
}

// maxListScan bounds how many copies one List call reads.
const maxListScan = 20_000

// List returns pending messages: the copies not yet moved on in each level,
// cancelled ones left out. Work per call is bounded: a page may hold fewer
// than Max entries without being the last.
func (s *Service) List(ctx context.Context, req ListRequest) (ListResult, error) {
	limit := req.Max
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	cur := req.Cursor
	var out ListResult
	scanned := 0
	for cur.Level < len(s.holds) {
		if len(out.Pending) >= limit || scanned >= maxListScan {
			out.Next = cur
			return out, nil
		}
		from, err := s.b.CommittedOffset(ctx, DelayGroup, DelayTopic, cur.Level)
		if err != nil && !errors.Is(err, core.ErrNoCommittedOffset) {
			return out, err
		}
		res, err := s.b.Read(ctx, core.ReadRequest{Topic: DelayTopic, Queue: cur.Level, Offset: max(cur.Offset, from), MaxCount: min(256, limit-len(out.Pending))})
		if err != nil {
			return out, fmt.Errorf("read level %d: %w", cur.Level, err)
		}
		if len(res.Messages) == 0 {
			cur = Cursor{Level: cur.Level + 1}
			continue
		}
		scanned += len(res.Messages)
		cur.Offset = res.NextOffset
		s.mu.Lock()
		for _, m := range res.Messages {
			w, err := parseWaiting(m)
			if err != nil {
				continue
			}
			if _, ok := s.cancelled[w.id]; ok || (req.Topic != "" && req.Topic != w.topic) {
				continue
			}
			out.Pending = append(out.Pending, Pending{ID: w.id, Topic: w.topic, Due: w.due, Level: cur.Level, Exit: m.DeliverAt, Copy: m})
		}
		s.mu.Unlock()
	}
	out.Done = true
	out.Next = cur
	return out, nil
}

// SortByDue orders pending messages by due time, then ID.
func SortByDue(p []Pending) {
	slices.SortFunc(p, func(a, b Pending) int {
		if c := a.Due.Compare(b.Due); c != 0 {
			return c
		}
		return slices.Compare(a.ID[:], b.ID[:])
	})
}
