package client

import (
	"fmt"
	"sync"
	"time"
)

// BreakerState is where a node's circuit breaker stands.
type BreakerState int

// The states of a breaker.
const (
	// BreakerClosed: the node takes traffic.
	BreakerClosed BreakerState = iota
	// BreakerOpen: the node failed too often in the window; it is isolated
	// until its pause ends.
	BreakerOpen
	// BreakerHalfOpen: the pause ended; one call probes the node. It
	// closes the breaker if it succeeds, opens it again (for twice the
	// pause, up to MaxOpenFor) if it fails.
	BreakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("BreakerState(%d)", int(s))
}

// BreakerOptions configure the circuit breaker each node of a Cluster has.
// A zero field means its default.
type BreakerOptions struct {
	// Window is how far back failures count; default 10 s, kept in ten
	// buckets.
	Window time.Duration
	// MinCalls is how many calls the window must hold before the breaker
	// may open; default 5.
	MinCalls int
	// FailureRatio opens the breaker: the share of the window's calls that
	// failed (connection lost or refused, timed out, the store failed, the
	// server shutting down or overloaded); default 0.5.
	FailureRatio float64
	// OpenFor is the first pause of an open breaker before it probes;
	// default 2 s. Each failed probe doubles it, up to MaxOpenFor (default
	// 30 s); a successful probe resets it.
	OpenFor, MaxOpenFor time.Duration
}

func (o BreakerOptions) withDefaults() BreakerOptions {
	if o.Window <= 0 {
		o.Window = 10 * time.Second
	}
	if o.MinCalls <= 0 {
		o.MinCalls = 5
	}
	if o.FailureRatio <= 0 || o.FailureRatio > 1 {
		o.FailureRatio = 0.5
	}
	if o.OpenFor <= 0 {
		o.OpenFor = 2 * time.Second
	}
	if o.MaxOpenFor < o.OpenFor {
		o.MaxOpenFor = max(30*time.Second, o.OpenFor)
	}
	return o
}

// breakerBuckets is how many buckets a window is kept in.
const breakerBuckets = 10

// breaker is one node's circuit breaker: counts of successes and failures
// in a sliding window of buckets, and the state machine above. Safe for
// concurrent use.
type breaker struct {
	o   BreakerOptions
	now func() time.Time

	mu      sync.Mutex
	state   BreakerState
	buckets [breakerBuckets]struct {
		slot     int64 // which bucket-long slot of time it counts
		ok, fail int
	}
	until   time.Time     // open: when the pause ends
	pause   time.Duration // the current pause
	probing bool          // half-open: the probe is out
}

func newBreaker(o BreakerOptions, now func() time.Time) *breaker {
	o = o.withDefaults()
	return &breaker{o: o, now: now, pause: o.OpenFor}
}

// allow reports whether a call may go to the node now; probe is true for
// the one call a half-open breaker lets through (its outcome must be
// recorded with probe set). changed is the transition allow made (open →
// half-open), if any.
func (b *breaker) allow() (ok, probe bool, changed *transition) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true, false, nil
	case BreakerOpen:
		if b.now().Before(b.until) {
			return false, false, nil
		}
		b.state, b.probing = BreakerHalfOpen, true
		return true, true, &transition{BreakerOpen, BreakerHalfOpen}
	default: // half-open
		if b.probing {
			return false, false, nil
		}
		b.probing = true
		return true, true, nil
	}
}

// transition is a change of state.
type transition struct{ from, to BreakerState }

// record counts a call's outcome and returns the transition it caused, if
// any.
func (b *breaker) record(ok, probe bool) *transition {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if probe && b.state == BreakerHalfOpen {
		b.probing = false
		if ok {
			b.state, b.pause = BreakerClosed, b.o.OpenFor
			b.buckets = [breakerBuckets]struct {
				slot     int64
				ok, fail int
			}{}
			return &transition{BreakerHalfOpen, BreakerClosed}
		}
		b.pause = min(2*b.pause, b.o.MaxOpenFor)
		b.state, b.until = BreakerOpen, now.Add(b.pause)
		return &transition{BreakerHalfOpen, BreakerOpen}
	}
	width := b.o.Window / breakerBuckets
	slot := now.UnixNano() / int64(width)
	bk := &b.buckets[slot%breakerBuckets]
	if bk.slot != slot {
		bk.slot, bk.ok, bk.fail = slot, 0, 0
	}
	if ok {
		bk.ok++
		return nil
	}
	bk.fail++
	if b.state != BreakerClosed {
		return nil
	}
	var calls, fails int
	for _, x := range b.buckets {
		if slot-x.slot < breakerBuckets {
			calls += x.ok + x.fail
			fails += x.fail
		}
	}
	if calls >= b.o.MinCalls && float64(fails) >= b.o.FailureRatio*float64(calls) {
		b.state, b.until = BreakerOpen, now.Add(b.pause)
		return &transition{BreakerClosed, BreakerOpen}
	}
	return nil
}

// snapshot returns the state and the window's counts.
func (b *breaker) snapshot() (BreakerState, int, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	slot := b.now().UnixNano() / int64(b.o.Window/breakerBuckets)
	var calls, fails int
	for _, x := range b.buckets {
		if slot-x.slot < breakerBuckets {
			calls += x.ok + x.fail
			fails += x.fail
		}
	}
	return b.state, calls, fails
}
