package server

import (
	"context"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/wire"
)

// holder parks long polls that found nothing, without a goroutine each (as
// RocketMQ's PullRequestHoldService does): one goroutine retries every
// parked request when the engine announces new messages, and answers it
// with its empty result at its deadline.
type holder struct {
	b    core.Broker
	mu   sync.Mutex
	held []*held
	kick chan struct{}
}

type held struct {
	c        *conn
	f        wire.Frame
	deadline time.Time
	// try retries the request; ok means payload is the answer now.
	try   func(ctx context.Context) (payload []byte, ok bool, err error)
	empty []byte // the answer at the deadline
}

func newHolder(b core.Broker) *holder {
	return &holder{b: b, kick: make(chan struct{}, 1)}
}

func (h *holder) park(p *held) {
	h.mu.Lock()
	h.held = append(h.held, p)
	h.mu.Unlock()
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

func (h *holder) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	arrived := h.b.Arrivals("")
	for {
		h.mu.Lock()
		batch := h.held
		h.held = nil
		h.mu.Unlock()

		next := time.Time{}
		var keep []*held
		for _, p := range batch {
			if p.c.ctx.Err() != nil {
				continue // the connection is gone
			}
			payload, ok, err := p.try(p.c.ctx)
			switch {
			case err != nil:
				p.c.fail(p.f, err)
			case ok:
				p.c.reply(p.f, payload)
			case !time.Now().Before(p.deadline):
				p.c.reply(p.f, p.empty)
			default:
				keep = append(keep, p)
				if next.IsZero() || p.deadline.Before(next) {
					next = p.deadline
				}
			}
		}
		h.mu.Lock()
		h.held = append(keep, h.held...)
		h.mu.Unlock()

		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-arrived:
			arrived = h.b.Arrivals("")
		case <-h.kick:
		case <-timer.C:
		case <-ctx.Done():
			return
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}
