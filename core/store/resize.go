package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// Resizing a topic (core/epoch.go has the why and the proof).
//
// A topic keeps, in topics.meta, its epochs: the queue count of each and,
// for every epoch after the first, the next offset of every queue when it
// began (Begin). A resize takes topicsMu and appendMu, so no produce is
// between picking its queue and appending: the epoch begins exactly at the
// queues' next offsets. It opens the queues a larger count adds, writes
// topics.meta with the new epoch (fsynced and renamed) and only then lets
// produces go on, so no record of the new epoch can be durable while the
// metadata still says the old one: producers wait one metadata write, a
// few milliseconds. Queues beyond a smaller count stay, read-only: groups
// drain them (core.Gate holds their keys' new queues until they have) and
// retention deletes their segments like any other.
//
// A crash can leave topics.meta with an epoch whose Begin is past what the
// commit log kept of a queue: records appended before the resize that were
// not yet durable (FlushAsync, or a sync produce not yet acknowledged). No
// record of that epoch survived then (the log is durable as a prefix, and
// every record of the epoch is after every record before it), so recovery
// lowers Begin to the queue's recovered end (clampEpochs): the next record
// appended there is the epoch's first.
//
// The first resize raises store.meta's format to 2: a binary that reads
// only format 1 would ignore the epochs and write keys to the wrong
// queues. A store never resized stays format 1.

// layout is what producers write to: the queue count in force and the
// epochs behind it. It is never changed, only replaced.
type layout struct {
	queues int
	epochs []core.Epoch
}

// epochMeta is an epoch as topics.meta holds it.
type epochMeta struct {
	Queues  int       `json:"queues"`
	Begin   []int64   `json:"begin,omitempty"`
	Started time.Time `json:"started"`
}

// layoutOf reads a topic's layout from its metadata and checks it: every
// count within the queues on disk, Begin given for every epoch but the
// first and never decreasing from one epoch to the next.
func layoutOf(tm topicMeta) (*layout, error) {
	if len(tm.Epochs) == 0 {
		return &layout{queues: tm.Queues, epochs: []core.Epoch{{Queues: tm.Queues, Started: tm.Created}}}, nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: topic %q: %s", ErrBadMetadata, tm.Name, fmt.Sprintf(format, args...))
	}
	l := &layout{epochs: make([]core.Epoch, len(tm.Epochs))}
	for e, em := range tm.Epochs {
		switch {
		case em.Queues < 1 || em.Queues > tm.Queues:
			return nil, bad("epoch %d writes %d queues of %d", e, em.Queues, tm.Queues)
		case e == 0 && em.Begin != nil:
			return nil, bad("the first epoch has a begin")
		case e > 0 && (len(em.Begin) < max(em.Queues, tm.Epochs[e-1].Queues) || len(em.Begin) > tm.Queues):
			return nil, bad("epoch %d begins in %d queues", e, len(em.Begin))
		}
		if e > 1 {
			for q, b := range tm.Epochs[e-1].Begin {
				if q < len(em.Begin) && em.Begin[q] < b {
					return nil, bad("epoch %d begins queue %d at %d, before epoch %d (%d)", e, q, em.Begin[q], e-1, b)
				}
			}
		}
		l.epochs[e] = core.Epoch{Queues: em.Queues, Begin: em.Begin, Started: em.Started}
	}
	l.queues = l.epochs[len(l.epochs)-1].Queues
	return l, nil
}

// meta is the layout as topics.meta holds it; nil for a topic never
// resized (the format 1 topics.meta entry).
func (l *layout) meta() []epochMeta {
	if len(l.epochs) < 2 {
		return nil
	}
	out := make([]epochMeta, len(l.epochs))
	for e, ep := range l.epochs {
		out[e] = epochMeta{Queues: ep.Queues, Begin: ep.Begin, Started: ep.Started.UTC()}
	}
	return out
}

// ResizeTopic implements core.Broker.
func (s *Store) ResizeTopic(ctx context.Context, name string, queues int) (core.TopicInfo, error) {
	if s.closed.Load() {
		return core.TopicInfo{}, core.ErrClosed
	}
	if err := core.ValidateTopic(name); err != nil {
		return core.TopicInfo{}, err
	}
	if err := core.ValidateQueueCount(queues); err != nil {
		return core.TopicInfo{}, err
	}
	s.deleteMu.Lock() // one resize or delete at a time
	defer s.deleteMu.Unlock()
	t, err := s.topic(name, false, 0)
	if err != nil {
		return core.TopicInfo{}, err
	}
	if t.writeQueues() == queues {
		return s.describe(t), nil
	}
	if err := s.raiseFormat(2); err != nil {
		return core.TopicInfo{}, fmt.Errorf("resize topic %s: %w", name, err)
	}
	have := t.slots()
	qs, err := s.openQueues(name, have, queues)
	if err != nil {
		return core.TopicInfo{}, fmt.Errorf("resize topic %s: %w", name, err)
	}
	closeAdded := func() {
		for _, cq := range qs[len(have):] {
			_ = cq.close()
		}
	}

	s.topicsMu.Lock()
	s.appendMu.Lock()
	if err := s.appendableLocked(t); err != nil {
		s.appendMu.Unlock()
		s.topicsMu.Unlock()
		closeAdded()
		return core.TopicInfo{}, fmt.Errorf("resize topic %s: %w", name, err)
	}
	old := t.lay.Load()
	next := slices.Clone(t.next)
	for q := len(next); q < len(qs); q++ {
		next = append(next, qs[q].max.Load())
	}
	begin := slices.Clone(next)
	lay := &layout{queues: queues, epochs: append(slices.Clip(old.epochs), core.Epoch{
		Queues: queues, Begin: begin, Started: s.opts.Now().UTC(),
	})}
	t.qs.Store(&qs)
	t.lay.Store(lay)
	if err := s.persistTopicsLocked(); err != nil {
		t.qs.Store(&have)
		t.lay.Store(old)
		s.appendMu.Unlock()
		s.topicsMu.Unlock()
		closeAdded()
		return core.TopicInfo{}, fmt.Errorf("resize topic %s: %w", name, err)
	}
	t.next = next
	s.appendMu.Unlock()
	s.topicsMu.Unlock()
	s.log.Info().Str("topic", name).Int("from", old.queues).Int("queues", queues).
		Int("epoch", len(lay.epochs)-1).Msg("topic resized")
	return s.describe(t), nil
}

// raiseFormat makes store.meta name at least format f.
func (s *Store) raiseFormat(f int) error {
	var meta storeMeta
	if _, err := readMeta(s.fs, s.dir, fileStoreMeta, &meta); err != nil {
		return err
	}
	if max(meta.Format, 1) >= f {
		return nil
	}
	meta.Format = f
	return writeMeta(s.fs, s.dir, fileStoreMeta, meta)
}

// clampEpochs lowers every epoch's Begin of t to the queues' recovered
// ends (see the top of this file) and reports whether it changed any.
func clampEpochs(t *topic) bool {
	lay := t.lay.Load()
	changed := false
	epochs := slices.Clone(lay.epochs)
	for e := 1; e < len(epochs); e++ {
		var begin []int64
		for q, b := range epochs[e].Begin {
			if q < len(t.next) && b > t.next[q] {
				if begin == nil {
					begin = slices.Clone(epochs[e].Begin)
				}
				begin[q] = t.next[q]
			}
		}
		if begin != nil {
			epochs[e].Begin = begin
			changed = true
		}
	}
	if changed {
		t.lay.Store(&layout{queues: lay.queues, epochs: epochs})
	}
	return changed
}
