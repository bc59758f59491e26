package server

import (
	"context"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/wire"
)

// holder parks long polls that found nothing, without a goroutine each (as
// RocketMQ's PullRequestHoldService does); a streaming group pull stays
// parked between its answers. Parked requests are grouped by
// the topic they wait for and the consumer group that reads; one goroutine
// per such bucket retries its requests when the engine announces messages
// of that topic, and answers each with its empty result at its deadline. A
// bucket's goroutine ends when nothing waits on it any more, so a write to
// one topic never makes the server re-check polls of the others. A read may
// wait for its group's budget (the embedded store budgets reads from behind
// its tail cache, core.ReadRequest.Reader): that holds up the polls of its
// own bucket only, never another group's at the tail of the same topic.
type holder struct {
	b   core.Broker
	ctx context.Context
	wg  *sync.WaitGroup // the server's: Shutdown waits for every bucket

	mu       sync.Mutex
	buckets  map[bucketKey]*bucket
	draining bool // Shutdown: answer every parked poll now, park nothing more
}

// bucketKey names a bucket: the topic its polls wait for ("" = any topic)
// and the group that reads ("" for plain pulls).
type bucketKey struct{ topic, group string }

// bucket is the parked requests of one bucketKey.
type bucket struct {
	bucketKey
	held []*held
	kick chan struct{}
}

type held struct {
	c        *conn
	f        wire.Frame
	deadline time.Time
	// try retries the request; ok means payload is the answer now, a
	// buffer of its own that the connection's writer recycles once
	// written (answerBuf).
	try   func(ctx context.Context) (payload []byte, ok bool, err error)
	empty []byte // the answer at the deadline
	// more is set for a streaming pull and asked after each answer: goesOn
	// keeps the poll parked (the answer goes out flagged FlagMore), with
	// its deadline moved on by wait and empty as its answer at it; again
	// means it has more to send already.
	more func() (empty []byte, goesOn, again bool)
	wait time.Duration
	// idle, if set, says cheaply that a try now would find nothing (its
	// queue ends where the poll stands): an arrival of the topic on
	// another queue then skips it.
	idle func() bool
}

func newHolder(ctx context.Context, b core.Broker, wg *sync.WaitGroup) *holder {
	return &holder{b: b, ctx: ctx, wg: wg, buckets: map[bucketKey]*bucket{}}
}

// park hands p to the goroutine of topic ("" when it may be answered by a
// message of any topic) and group ("" for a plain pull).
func (h *holder) park(topic, group string, p *held) {
	key := bucketKey{topic, group}
	h.mu.Lock()
	if h.draining {
		h.mu.Unlock()
		p.c.reply(p.f, p.empty)
		return
	}
	bk := h.buckets[key]
	if bk == nil {
		if h.ctx.Err() != nil {
			h.mu.Unlock()
			return // shutting down: the connection is about to close
		}
		bk = &bucket{bucketKey: key, kick: make(chan struct{}, 1)}
		h.buckets[key] = bk
		h.wg.Add(1)
		go h.run(bk)
	}
	bk.held = append(bk.held, p)
	h.mu.Unlock()
	select {
	case bk.kick <- struct{}{}:
	default:
	}
}

func (h *holder) run(bk *bucket) {
	defer h.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// kept are the polls tried since the last arrival that found nothing.
	// A kick (a new park) tries only the new polls: at one message per
	// poll, each answered poll parks again at once, and retrying every
	// queue's poll of the topic then doubled the empty reads per message.
	// An arrival, or a deadline, tries them all.
	var kept []*held
	var prev <-chan struct{} // the arrivals the kept polls were tried after
	all := true
	for {
		arrived := h.b.Arrivals(bk.topic) // before the tries: no arrival is missed
		if prev != nil {
			select {
			case <-prev: // came after the kept polls' last try, however we woke
				all = true
			default:
			}
		}
		prev = arrived
		h.mu.Lock()
		batch := bk.held
		bk.held = nil
		h.mu.Unlock()
		if all {
			batch, kept = append(kept, batch...), nil
		}

		now := time.Now()
		again := false
		for _, p := range batch {
			if p.c.ctx.Err() != nil {
				continue // the connection is gone
			}
			if p.idle != nil && now.Before(p.deadline) && p.idle() {
				kept = append(kept, p)
				continue
			}
			payload, ok, err := p.try(p.c.ctx)
			switch {
			case err != nil:
				p.c.fail(p.f, err)
			case ok && p.more != nil:
				if empty, goesOn, more := p.more(); goesOn && p.c.reserve() {
					p.c.replyMore(p.f, payload, true) // try's answers are fresh: the writer's
					p.empty, p.deadline = empty, now.Add(p.wait)
					kept = append(kept, p)
					again = again || more
					continue
				}
				p.c.replyWith(p.f, payload, true) // its last answer
			case ok:
				p.c.replyWith(p.f, payload, true)
			case !now.Before(p.deadline):
				p.c.reply(p.f, p.empty)
			default:
				kept = append(kept, p)
			}
		}
		next := time.Time{}
		for _, p := range kept {
			if next.IsZero() || p.deadline.Before(next) {
				next = p.deadline
			}
		}
		h.mu.Lock()
		if h.draining {
			for _, p := range append(kept, bk.held...) {
				p.c.reply(p.f, p.empty)
			}
			kept, bk.held = nil, nil
		}
		if len(kept) == 0 && len(bk.held) == 0 {
			delete(h.buckets, bk.bucketKey) // a later park starts a new bucket
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()

		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		if again {
			all = true // a stream has more to send already: try again at once
			continue
		}
		timer.Reset(wait)
		all = false
		select {
		case <-arrived:
			all = true
		case <-bk.kick:
		case <-timer.C:
			all = true // a deadline: answer the expired ones
		case <-h.ctx.Done():
			return
		}
		timer.Stop()
	}
}

// drain answers every parked poll with its empty result at once, and every
// later one as soon as it is parked (server shutdown).
func (h *holder) drain() {
	h.mu.Lock()
	h.draining = true
	for _, bk := range h.buckets {
		select {
		case bk.kick <- struct{}{}:
		default:
		}
	}
	h.mu.Unlock()
}
