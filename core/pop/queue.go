package pop

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
)

type queueKey struct {
	group, topic string
	queue        int
}

type entryState uint8

const (
	// stateInvisible: handed out; its deadline runs.
	stateInvisible entryState = iota
	// stateExpiring: its deadline passed and the reviver is sending it back.
	stateExpiring
	// stateReady: orderly, its deadline passed; the next orderly Pop of its
	// queue hands it out again.
	stateReady
)

// entry is one message in flight.
type entry struct {
	q       *queueState
	offset  int64
	id      core.MessageID
	orderly bool

	// Guarded by q.mu.
	state   entryState
	gen     uint64 // of the one hand-out whose handle works
	attempt int    // delivery number of the current hand-out, from 1
	// traceID is the ID the message is traced under (trace.IDOf) when its
	// hand-out was traced, else zero: its acked hop needs it.
	traceID core.MessageID

	// Guarded by Service.heapMu (written with q.mu held too).
	deadline time.Time
	idx      int // in Service.deadlines; -1 when not there
}

// queueState is one group's progress through one queue. Every offset in
// [watermark, cursor) has been handed out (or skipped by a tag filter); those
// still in inflight are not done, the others are.
type queueState struct {
	key queueKey

	mu        sync.Mutex
	loaded    bool
	cursor    int64 // next offset to hand out
	watermark int64 // every offset below is done
	committed int64 // what this Service last committed; -1 for nothing
	inflight  map[int64]*entry
	order     []int64 // offsets of inflight from head on, increasing (some may be done)
	head      int
	invisible int // entries invisible or expiring
	ready     int // entries ready
	orderly   int // entries handed out by orderly pops
}

// loadLocked starts the queue at the group's committed offset.
func (s *Service) loadLocked(ctx context.Context, q *queueState) error {
	if q.loaded {
		return nil
	}
	off, err := s.b.CommittedOffset(ctx, q.key.group, q.key.topic, q.key.queue)
	switch {
	case errors.Is(err, core.ErrNoCommittedOffset):
		off, q.committed = 0, -1 // a new group starts at the oldest message
	case err != nil:
		return fmt.Errorf("committed offset of %s on %s/%d: %w", q.key.group, q.key.topic, q.key.queue, err)
	default:
		q.committed = off
	}
	q.cursor, q.watermark, q.loaded = off, off, true
	return nil
}

// take hands out up to n messages of q, of at most *bytesLeft bytes together
// (stored sizes), which it lowers by what it hands out; when first (no
// message of this Pop yet) the first one is handed out whatever its size.
func (s *Service) take(ctx context.Context, q *queueState, req Request, n int, invisible time.Duration, rangeMax int64,
	bytesLeft *int, first bool) ([]Popped, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := s.loadLocked(ctx, q); err != nil {
		return nil, err
	}
	now := s.opts.Now()
	deadline := now.Add(invisible)
	var out []Popped
	if req.Orderly {
		if q.invisible > 0 {
			return nil, nil // locked: an earlier message is in flight
		}
		if q.ready > 0 {
			var err error
			out, err = s.redeliverLocked(ctx, q, n, deadline, bytesLeft, first)
			if err != nil || q.ready > 0 {
				return out, err
			}
			n -= len(out)
		}
	} else if q.orderly > 0 {
		return nil, nil // an orderly popper holds this queue
	}
	if n <= 0 || q.cursor == rangeMax {
		return out, nil
	}
	room := s.opts.MaxInflight - q.spanLocked()
	if room <= 0 {
		return out, nil
	}
	res, held, err := s.gate.Read(ctx, q.key.group, core.ReadRequest{
		Topic: q.key.topic, Queue: q.key.queue, Offset: q.cursor, MaxCount: min(n, room), Tags: req.Tags,
		MaxBytes: max(*bytesLeft, 1),
		Reader:   q.key.group, // a budget wait (cold reads) holds only this queue of this group
	}, nil)
	if err != nil {
		var ce *core.CorruptError
		if errors.As(err, &ce) && ce.QueueOffset >= q.cursor {
			s.log.Error().Err(err).Str(fieldGroup, q.key.group).Str(fieldTopic, q.key.topic).Int(fieldQueue, q.key.queue).
				Int64(fieldOffset, ce.QueueOffset).Msg("corrupt message skipped")
			q.cursor = ce.QueueOffset + 1
			s.advanceLocked(ctx, q)
			return out, nil
		}
		return out, fmt.Errorf("read %s/%d at %d: %w", q.key.topic, q.key.queue, q.cursor, err)
	}
	if held {
		return out, nil // held at an epoch barrier (core.Gate): older queues first
	}
	if res.Clamped && q.cursor < res.Range.Min {
		s.log.Warn().Str(fieldGroup, q.key.group).Str(fieldTopic, q.key.topic).Int(fieldQueue, q.key.queue).
			Int64(fieldOffset, q.cursor).Int64(fieldMin, res.Range.Min).Msg("messages removed by retention before consumption")
	}
	next := res.NextOffset
	for _, m := range res.Messages {
		if _, dup := q.inflight[m.QueueOffset]; dup {
			continue // only after the queue shrank (lost data): keep the one in flight
		}
		if !(first && len(out) == 0) && m.Size > *bytesLeft {
			next = m.QueueOffset // over the Pop's bytes: the next one starts here
			break
		}
		*bytesLeft -= m.Size
		e := &entry{q: q, offset: m.QueueOffset, id: m.ID, orderly: req.Orderly, attempt: m.ReconsumeCount + 1}
		q.inflight[e.offset] = e
		q.order = append(q.order, e.offset)
		q.invisible++
		if e.orderly {
			q.orderly++
		}
		out = append(out, s.handOutLocked(e, m, deadline))
	}
	q.cursor = next
	s.advanceLocked(ctx, q)
	return out, nil
}

// redeliverLocked hands out an orderly queue's ready messages again, in
// offset order, within *bytesLeft as take.
func (s *Service) redeliverLocked(ctx context.Context, q *queueState, n int, deadline time.Time, bytesLeft *int, first bool) ([]Popped, error) {
	var out []Popped
	var err error
	for _, off := range q.order[q.head:] {
		if len(out) >= n || q.ready == 0 {
			break
		}
		e := q.inflight[off]
		if e == nil || e.state != stateReady {
			continue
		}
		m, gerr := s.b.Get(ctx, e.id)
		if errors.Is(gerr, core.ErrMessageNotFound) {
			s.log.Warn().Str(fieldGroup, q.key.group).Str(fieldTopic, q.key.topic).Int(fieldQueue, q.key.queue).
				Int64(fieldOffset, off).Msg("message removed by retention before redelivery")
			q.doneLocked(e)
			continue
		}
		if gerr != nil {
			err = fmt.Errorf("redeliver %s/%d at %d: %w", q.key.topic, q.key.queue, off, gerr)
			break
		}
		if !(first && len(out) == 0) && m.Size > *bytesLeft {
			break // over the Pop's bytes: it stays ready, first next time
		}
		*bytesLeft -= m.Size
		e.state = stateInvisible
		q.ready--
		q.invisible++
		out = append(out, s.handOutLocked(e, m, deadline))
	}
	s.advanceLocked(ctx, q)
	return out, err
}

// handOutLocked starts e's invisibility and issues its handle.
func (s *Service) handOutLocked(e *entry, m *core.StoredMessage, deadline time.Time) Popped {
	e.gen = s.gen.Add(1)
	s.schedule(e, deadline)
	e.traceID = core.MessageID{}
	if rec := s.opts.Trace; rec.Enabled(trace.TopicOf(m)) {
		e.traceID = trace.IDOf(m)
	}
	m.ReconsumeCount = e.attempt - 1
	h := handle{queue: e.q.key.queue, offset: e.offset, gen: e.gen, deadline: deadline.UnixNano(), group: e.q.key.group, topic: e.q.key.topic}
	return Popped{Message: m, Handle: s.sign.encode(h), Attempt: e.attempt, VisibleAt: deadline}
}

// liveLocked returns the entry a handle names if the handle still works
// (its deadline is checked by the caller, under heapMu).
func (q *queueState) liveLocked(h handle) (*entry, error) {
	e := q.inflight[h.offset]
	if e == nil || e.gen != h.gen || e.state != stateInvisible {
		return nil, fmt.Errorf("%w: acknowledged, replaced or expired", ErrHandleExpired)
	}
	return e, nil
}

// doneLocked drops a finished entry; advanceLocked then moves the watermark.
func (q *queueState) doneLocked(e *entry) {
	if q.inflight[e.offset] != e {
		return
	}
	delete(q.inflight, e.offset)
	switch e.state {
	case stateReady:
		q.ready--
	default:
		q.invisible--
	}
	if e.orderly {
		q.orderly--
	}
}

// fullLocked reports whether q may hand out nothing more for now.
func (s *Service) fullLocked(q *queueState) bool {
	return q.spanLocked() >= s.opts.MaxInflight
}

// spanLocked counts the messages handed out from the oldest one not done
// on (done ones after it included): what MaxInflight bounds. Offsets may be
// sparse (the JetStream engine's), so this is not cursor − watermark.
func (q *queueState) spanLocked() int { return len(q.order) - q.head }

// advanceLocked moves the watermark over the done prefix and commits it.
func (s *Service) advanceLocked(ctx context.Context, q *queueState) {
	for q.head < len(q.order) {
		if _, ok := q.inflight[q.order[q.head]]; ok {
			break
		}
		q.head++
	}
	switch {
	case q.head == len(q.order):
		q.order, q.head = q.order[:0], 0
	case q.head >= 1024 && 2*q.head >= len(q.order):
		n := copy(q.order, q.order[q.head:])
		q.order, q.head = q.order[:n], 0
	}
	wm := q.cursor
	if q.head < len(q.order) {
		wm = q.order[q.head]
	}
	q.watermark = wm
	if wm == q.committed {
		return
	}
	// The state has changed already: commit even if the caller gave up.
	if err := s.b.CommitOffset(context.WithoutCancel(ctx), q.key.group, q.key.topic, q.key.queue, wm); err != nil {
		s.log.Error().Err(err).Str(fieldGroup, q.key.group).Str(fieldTopic, q.key.topic).Int(fieldQueue, q.key.queue).
			Int64(fieldOffset, wm).Msg("commit pop offset")
		return
	}
	q.committed = wm
}
