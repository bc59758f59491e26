package session

import (
	"context"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// The bucket writer. The engine's write-through calls come under its
// session locks and must not wait for a network round trip, so a bucket
// store queues every write and a few workers publish them. Writes are
// queued in lanes — one per session, one per retained topic — and a lane
// has at most one write in flight: a session's writes reach the stream in
// the order they were made (each is fenced by the session's owner record,
// and a replicated stream refuses a second expected-sequence check on the
// same subject while one is being proposed), while different sessions'
// writes go in parallel.

// sessionLane and retainedLane name the lanes.
func sessionLane(id string) string     { return "s" + id }
func retainedLane(topic string) string { return "r" + topic }

// kvWrite is one queued write.
type kvWrite struct {
	lane  string
	id    string // the session; "" for a retained message
	what  string // for the logs
	subj  string
	value []byte
	del   bool
	fence uint64 // the owner revision the write is made under; 0: not fenced
	// lazy: the session's claim is queued ahead of it (claim); the fence
	// is the revision that claim wrote, read when the write is made.
	lazy bool
	// claim creates the session's owner record (a clean start with a
	// session expiry: Claim did not know it would be stored).
	claim bool

	// release deletes the session's owner record at its turn, unless the
	// session was stored again meanwhile (a clean start deletes the old
	// session, then stores the new one).
	release bool
	// barrier gets, when the lane reaches it (flush), nil; or, with check,
	// the first error of a write of the lane since its previous checked
	// barrier (nil: every one made).
	barrier chan error
	check   bool
	// topic and m: a retained message's write (m nil: its delete), for
	// the ack's bookkeeping.
	topic string
	m     *engine.Message
}

type lane struct {
	name  string
	items []*kvWrite
	busy  bool
}

type kvWriter struct {
	mu      sync.Mutex
	cond    *sync.Cond
	lanes   map[string]*lane
	ready   []*lane
	queued  int // writes queued or in flight
	max     int
	closing bool // no new writes
	stopped bool // workers exit
	drained chan struct{}
	// failed holds, per lane, the first write that failed or was refused
	// since the lane's last barrier: a flush reports it.
	failed map[string]error
}

func newKVWriter(max int) *kvWriter {
	w := &kvWriter{lanes: map[string]*lane{}, max: max}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// enqueue queues it at the end of its lane.
func (w *kvWriter) enqueue(it *kvWrite) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.closing:
		w.failLocked(it.lane, ErrClosed)
		return ErrClosed
	case w.queued >= w.max && it.barrier == nil:
		w.failLocked(it.lane, ErrBacklog)
		return ErrBacklog
	}
	l := w.lanes[it.lane]
	if l == nil {
		l = &lane{name: it.lane}
		w.lanes[it.lane] = l
	}
	l.items = append(l.items, it)
	w.queued++
	if !l.busy && len(l.items) == 1 {
		w.ready = append(w.ready, l)
		w.cond.Signal()
	}
	return nil
}

// next waits for a lane with a write to make and takes its first; false
// once the writer stopped.
func (w *kvWriter) next() (*lane, *kvWrite, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.ready) == 0 && !w.stopped {
		w.cond.Wait()
	}
	if w.stopped {
		return nil, nil, false
	}
	l := w.ready[0]
	w.ready[0] = nil
	w.ready = w.ready[1:]
	l.busy = true
	return l, l.items[0], true
}

// done ends the write in flight on l.
func (w *kvWriter) done(l *lane) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l.items[0] = nil
	l.items = l.items[1:]
	l.busy = false
	w.queued--
	if len(l.items) > 0 {
		w.ready = append(w.ready, l)
		w.cond.Signal()
	} else {
		delete(w.lanes, l.name)
	}
	if w.closing && w.queued == 0 && w.drained != nil {
		close(w.drained)
		w.drained = nil
	}
}

// flush waits until every write queued on lane name before the call was
// made has been tried (or ctx ends).
func (w *kvWriter) flush(ctx context.Context, name string) error {
	return w.barrier(ctx, name, false)
}

// flushChecked is flush that also returns the first error of those
// writes, or of a write refused, since the lane's previous checked flush.
func (w *kvWriter) flushChecked(ctx context.Context, name string) error {
	return w.barrier(ctx, name, true)
}

func (w *kvWriter) barrier(ctx context.Context, name string, check bool) error {
	ch := make(chan error, 1)
	if err := w.enqueue(&kvWrite{lane: name, barrier: ch, check: check}); err != nil {
		return err
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fail records a failed write of lane, for its next flush.
func (w *kvWriter) fail(lane string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failLocked(lane, err)
}

func (w *kvWriter) failLocked(lane string, err error) {
	if w.failed == nil {
		w.failed = map[string]error{}
	}
	if w.failed[lane] == nil {
		w.failed[lane] = err
	}
}

// takeFailed returns and forgets lane's recorded failure (a barrier).
func (w *kvWriter) takeFailed(lane string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.failed[lane]
	delete(w.failed, lane)
	return err
}

func (w *kvWriter) backlog() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.queued
}

// shutdown refuses new writes, gives those queued until timeout to be
// made, then stops the workers; it returns how many were left unmade.
func (w *kvWriter) shutdown(timeout time.Duration) int {
	w.mu.Lock()
	w.closing = true
	var wait chan struct{}
	if w.queued > 0 {
		wait = make(chan struct{})
		w.drained = wait
	}
	w.mu.Unlock()
	if wait != nil {
		t := time.NewTimer(timeout)
		select {
		case <-wait:
		case <-t.C:
		}
		t.Stop()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.cond.Broadcast()
	left := 0
	for _, l := range w.lanes {
		for _, it := range l.items {
			if it.barrier == nil {
				left++
			}
		}
	}
	return left
}
