package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
)

// worker consumes one queue. Its run goroutine pulls and commits; listener
// goroutines report completions to it.
type worker struct {
	p       *PushConsumer
	ref     group.QueueRef
	prev    *worker // a worker of an earlier assignment still finishing this queue
	ctx     context.Context
	cancel  context.CancelFunc
	aborted atomic.Bool
	done    chan struct{}
	wake    chan struct{}
	tick    *time.Ticker // commit interval; owned by run

	mu         sync.Mutex
	gen        uint64  // bumped by a reset; older completions are ignored
	inflight   []int64 // offsets handed out, ascending; done ones are popped from the front
	finished   map[int64]bool
	next       int64 // next offset to pull
	committed  int64
	lastCommit time.Time
}

func (p *PushConsumer) newWorker(ref group.QueueRef, prev *worker) *worker {
	ctx, cancel := context.WithCancel(p.pullCtx)
	return &worker{p: p, ref: ref, prev: prev, ctx: ctx, cancel: cancel, done: make(chan struct{}),
		wake: make(chan struct{}, 1), finished: map[int64]bool{}, next: -1, committed: -1}
}

func (w *worker) stop()          { w.cancel() }
func (w *worker) stopping() bool { return w.ctx.Err() != nil }

func (w *worker) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// watermarkLocked is the offset below which everything is done.
func (w *worker) watermarkLocked() int64 {
	for len(w.inflight) > 0 && w.finished[w.inflight[0]] {
		delete(w.finished, w.inflight[0])
		w.inflight = w.inflight[1:]
	}
	if len(w.inflight) > 0 {
		return w.inflight[0]
	}
	return w.next
}

func (w *worker) pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watermarkLocked()
	return len(w.inflight)
}

// truncate forgets offsets from off on: they were pulled but will not be
// handled here.
func (w *worker) truncate(off int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, o := range w.inflight {
		if o >= off {
			w.inflight = w.inflight[:i]
			break
		}
	}
	w.next = off
}

func (w *worker) complete(gen uint64, off int64) {
	w.mu.Lock()
	if gen == w.gen {
		w.finished[off] = true
	}
	w.mu.Unlock()
	w.signal()
}

// busyRetry bounds the wait before pulling a queue whose previous holder
// still has it: the holder releases it the moment it has finished.
const busyRetry = 50 * time.Millisecond

// pause waits d, or less if ctx ends; it reports whether ctx is still live.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (w *worker) run() {
	defer w.p.wg.Done()
	defer close(w.done)
	if w.prev != nil {
		// Always wait, even if this worker is already stopped: its done
		// channel promises the queue is free of every earlier worker.
		<-w.prev.done
		w.prev = nil
	}
	o := &w.p.opts
	log := w.p.log.With().Str("queue", w.ref.String()).Logger()
	w.tick = time.NewTicker(o.CommitInterval)
	defer w.tick.Stop()
	for w.ctx.Err() == nil {
		if n := w.pending(); n >= o.MaxInflightPerQueue {
			select {
			case <-w.wake:
			case <-w.tick.C:
			case <-w.ctx.Done():
			}
			w.maybeCommit(false)
			continue
		}
		w.mu.Lock()
		offset := w.next
		room := o.MaxInflightPerQueue - len(w.inflight)
		w.mu.Unlock()
		res, err := w.p.coord.Pull(w.ctx, group.PullRequest{Group: o.Group, ClientID: o.ClientID, Queue: w.ref,
			Offset: offset, Max: min(o.PullBatch, room), Wait: o.PollWait})
		if err != nil {
			if w.ctx.Err() != nil {
				break
			}
			switch {
			case errors.Is(err, group.ErrQueueBusy):
				// The previous holder is finishing and releases the queue
				// as soon as it is done (it heard of the reassignment from
				// its own pull): ask again soon.
				pause(w.ctx, min(o.HeartbeatInterval/4, busyRetry))
			case errors.Is(err, group.ErrNotAssigned), errors.Is(err, group.ErrUnknownMember):
				// Reassigned (or the coordinator forgot us): a heartbeat now
				// stops this worker and hands the queue over, instead of
				// leaving it idle until the next tick.
				if errors.Is(err, group.ErrUnknownMember) {
					w.forgetCommitted()
				}
				w.p.rebalanceNow()
				pause(w.ctx, o.HeartbeatInterval/2)
			default:
				log.Warn().Err(err).Msg("pull failed")
				w.forgetCommitted()
				pause(w.ctx, o.HeartbeatInterval/2)
			}
			continue
		}
		w.mu.Lock()
		if res.Reset {
			w.gen++
			w.inflight, w.finished = nil, map[int64]bool{}
			w.committed = res.Offset
		}
		gen := w.gen
		for _, m := range res.Messages {
			w.inflight = append(w.inflight, m.QueueOffset)
		}
		w.next = res.NextOffset
		w.mu.Unlock()

		if o.Orderly {
			for _, m := range res.Messages {
				if w.ctx.Err() != nil {
					// Stopping (the queue was reassigned): leave the rest to
					// the next holder, which starts at the committed offset.
					w.truncate(m.QueueOffset)
					break
				}
				if !w.consumeOrderly(m) {
					return // aborted
				}
				w.complete(gen, m.QueueOffset)
				w.maybeCommit(false)
			}
		} else {
			msgs := res.Messages
			run := (len(msgs) + o.ConsumeGoroutines - 1) / o.ConsumeGoroutines
			for len(msgs) > 0 {
				k := min(run, len(msgs))
				if !w.dispatch(gen, msgs[:k]) {
					return // aborted
				}
				msgs = msgs[k:]
			}
		}
		w.maybeCommit(len(res.Messages) == 0)
	}
	if w.aborted.Load() || w.p.runCtx.Err() != nil && w.pending() > 0 {
		return // a crash, or Close gave up waiting: commit nothing more
	}
	// Stopping: let running listeners finish, commit, hand the queue back.
	for w.pending() > 0 {
		select {
		case <-w.wake:
		case <-w.p.runCtx.Done():
			return
		}
	}
	w.maybeCommit(true)
	if o.Mode == group.Clustering {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := w.p.coord.Release(ctx, o.Group, o.ClientID, w.ref); err != nil {
			log.Warn().Err(err).Msg("release failed")
		}
		cancel()
	}
}

// forgetCommitted makes the next commit go out even if the watermark did
// not move: the connection broke or the coordinator forgot this member —
// the server may have restarted and lost the last commits (they persist at
// its checkpoint). A queue that takes no new messages would otherwise stay
// behind there for good, and a resized topic's barrier waiting for it
// (core.Gate) with it.
func (w *worker) forgetCommitted() {
	w.mu.Lock()
	w.committed = -1
	w.mu.Unlock()
}

// maybeCommit commits the watermark if it moved and the commit interval
// passed (or force).
func (w *worker) maybeCommit(force bool) {
	w.mu.Lock()
	wm := w.watermarkLocked()
	due := force || time.Since(w.lastCommit) >= w.p.opts.CommitInterval
	if wm <= w.committed || wm < 0 || !due {
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), 5*time.Second)
	defer cancel()
	if err := w.p.coord.Commit(ctx, w.p.opts.Group, w.p.opts.ClientID, w.ref, wm); err != nil {
		w.p.log.Warn().Err(err).Str("queue", w.ref.String()).Int64("offset", wm).Msg("commit failed")
		return
	}
	w.mu.Lock()
	if wm > w.committed {
		w.committed = wm
	}
	w.lastCommit = time.Now()
	w.mu.Unlock()
}

// dispatch hands msgs to a listener goroutine. It returns false if the
// consumer was aborted while waiting for one.
func (w *worker) dispatch(gen uint64, msgs []*core.StoredMessage) bool {
	for {
		select {
		case w.p.tasks <- task{w: w, gen: gen, msgs: msgs}:
			return true
		case <-w.p.runCtx.Done():
			return false
		case <-w.tick.C:
			// All listeners are busy: commit what they finished meanwhile,
			// so a crash now costs at most CommitInterval of redelivery.
			w.maybeCommit(false)
		}
	}
}

// consumeConcurrently handles one message of a concurrent listener; it
// reports whether the message is done (false only when aborted).
func (w *worker) consumeConcurrently(m *core.StoredMessage) bool {
	p := w.p
	o := &p.opts
	for attempt := 1; ; attempt++ {
		if p.call(m) == Success {
			return true
		}
		if p.runCtx.Err() != nil {
			return false
		}
		if o.Mode == group.Clustering {
			_, err := p.retry.SendBack(p.runCtx, o.Group, m, "listener asked to retry")
			if err == nil {
				return true
			}
			p.log.Warn().Err(err).Str("id", m.ID.String()).Msg("send back failed; retrying locally")
		} else if attempt >= o.MaxReconsume {
			p.log.Error().Str("id", m.ID.String()).Int("attempts", attempt).Msg("broadcast message dropped after its last attempt")
			return true
		}
		if !pause(p.runCtx, o.SuspendTime) {
			return false
		}
	}
}

// consumeOrderly retries m in place until it succeeds or runs out of
// attempts (then it is dead-lettered). It returns false if aborted.
func (w *worker) consumeOrderly(m *core.StoredMessage) bool {
	p := w.p
	o := &p.opts
	for attempt := 1; ; attempt++ {
		if p.call(m) == Success {
			return true
		}
		if p.runCtx.Err() != nil {
			return false
		}
		if attempt >= o.MaxReconsume {
			cp := *m
			cp.ReconsumeCount = m.ReconsumeCount + attempt
			if err := p.retry.DeadLetter(p.runCtx, o.Group, &cp, fmt.Sprintf("orderly listener failed %d times", attempt)); err != nil {
				p.log.Error().Err(err).Str("id", m.ID.String()).Msg("dead-letter failed; retrying in place")
			} else {
				return true
			}
		}
		if !pause(p.runCtx, o.SuspendTime) {
			return false
		}
	}
}

// call runs the listener once; a call longer than ConsumeTimeout or a panic
// counts as Retry.
func (p *PushConsumer) call(m *core.StoredMessage) (r Result) {
	start := time.Now()
	defer func() {
		if v := recover(); v != nil {
			p.log.Error().Str("id", m.ID.String()).Interface("panic", v).Msg("listener panicked; message will be retried")
			r = Retry
		}
	}()
	r = p.opts.Listener(p.runCtx, present(m))
	if p.runCtx.Err() != nil || time.Since(start) > p.opts.ConsumeTimeout {
		return Retry
	}
	return r
}

// present shows the listener a redelivered message under the topic it was
// first produced to, as RocketMQ does; the queue and offset stay those of
// the retry topic it came from.
func present(m *core.StoredMessage) *core.StoredMessage {
	origin := m.Properties[retry.PropOriginTopic]
	if origin == "" || m.Topic == origin {
		return m
	}
	cp := *m
	cp.Topic = origin
	return &cp
}
