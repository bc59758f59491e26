package jetstream

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// arrivals turns "topic T has new messages" notices into closed channels.
// Every node publishes a notice (core NATS, not stored) on fmqa.<tok(T)>
// after its produces to T are acknowledged, and every node listens to all
// of them, so consumers anywhere wake up. Direct gets may be answered by a
// replica that trails the acknowledgement by a moment, so each notice wakes
// waiters twice: at once and again trailWake later.
type arrivals struct {
	nc  *nats.Conn
	sub *nats.Subscription

	mu     sync.Mutex
	chans  map[string]chan struct{} // by topic token; "" is every topic
	trail  map[string]struct{}      // tokens to wake again
	sent   map[string]time.Time     // when a notice for the token last went out
	unsent map[string]struct{}      // notices held back by coalescing, sent by the ticker
}

// coalesce bounds the notices one node sends per topic: at most one per
// coalesce, the rest folded into the next tick (a busy topic would
// otherwise send every node a notice per produce).
const coalesce = 2 * time.Millisecond

const trailWake = 20 * time.Millisecond

func newArrivals(nc *nats.Conn, ctx context.Context, wg *sync.WaitGroup) (*arrivals, error) {
	a := &arrivals{nc: nc, chans: map[string]chan struct{}{}, trail: map[string]struct{}{},
		sent: map[string]time.Time{}, unsent: map[string]struct{}{}}
	sub, err := nc.Subscribe(arrivalPrefix+"*", func(m *nats.Msg) {
		a.fire(m.Subject[len(arrivalPrefix):], true)
	})
	if err != nil {
		return nil, fmt.Errorf("jetstream: arrivals subscription: %w", err)
	}
	a.sub = sub
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { _ = sub.Unsubscribe() }()
		t := time.NewTicker(trailWake)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				a.mu.Lock()
				toks := make([]string, 0, len(a.trail))
				for tok := range a.trail {
					toks = append(toks, tok)
				}
				clear(a.trail)
				held := make([]string, 0, len(a.unsent))
				for tok := range a.unsent {
					held = append(held, tok)
				}
				clear(a.unsent)
				clear(a.sent)
				a.mu.Unlock()
				for _, tok := range toks {
					a.fire(tok, false)
				}
				for _, tok := range held {
					_ = a.nc.Publish(arrivalPrefix+tok, nil)
				}
			}
		}
	}()
	return a, nil
}

// wait returns a channel closed at the next notice for tok ("" any).
func (a *arrivals) wait(tok string) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.chans[tok]
	if c == nil {
		c = make(chan struct{})
		a.chans[tok] = c
	}
	return c
}

func (a *arrivals) fire(tok string, again bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range [2]string{tok, ""} {
		if c := a.chans[k]; c != nil {
			close(c)
			delete(a.chans, k)
		}
	}
	if again {
		a.trail[tok] = struct{}{}
	}
}

// notify tells every node that tok has new messages.
func (a *arrivals) notify(tok string) {
	a.fire(tok, true)
	now := time.Now()
	a.mu.Lock()
	if now.Sub(a.sent[tok]) < coalesce {
		a.unsent[tok] = struct{}{}
		a.mu.Unlock()
		return
	}
	a.sent[tok] = now
	a.mu.Unlock()
	_ = a.nc.Publish(arrivalPrefix+tok, nil)
}
