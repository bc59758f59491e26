package core

import (
	"fmt"
	"time"
)

// A topic's queue count can change while it is in use (Broker.ResizeTopic).
// Each count is an epoch: from the moment the count changes, a sharding key
// k is written to queue QueueFor(k, N) of the new count N, which may be
// another queue than before, while k's earlier messages wait in its old
// queue. A group that read the new queue at once could deliver k's new
// messages before its old ones. The epoch barrier prevents that:
//
//   - An engine records, for every epoch after the first, where it began in
//     each queue (Epoch.Begin: the queue's next offset at the change). A
//     queue's messages at or above Begin[q] were written in that epoch or a
//     later one, those below it before.
//   - QueueFor is h(k) mod N for one hash h, so a key in queue q of epoch e
//     (count N) was in epoch e−1 (count M) in a queue p with p ≡ h ≡ q
//     modulo gcd(M, N) — q's sources.
//   - Open(q, e), the barrier of queue q in epoch e, holds when for every
//     source p of q the group is done (committed) with p up to Begin_e[p],
//     and Open(p, e−1) holds. A group may take q's messages at or above
//     Begin_e[q] only while Open(q, e).
//
// Why every key keeps its order (docs/consumption.md has the long form):
// by induction on e, Open(q, e) means every message written before epoch e
// by a key of q's epoch e is committed. Such a message a of key k was
// written in epoch e' < e; in epoch e−1 k was in a source p of q. If
// e' = e−1, a is in p below Begin_e[p], so committed; if e' < e−1, k is one
// of p's keys in epoch e−1 and Open(p, e−1) covers a. A message b of k is
// thus delivered after every message of k from an earlier epoch, and after
// those of its own epoch by its queue's order. The recursion matters: an
// epoch that wrote nothing to p leaves p's committed offset at Begin_e[p]
// at once, and only Open(p, e−1) still waits for k's older queue.

// Epoch is one queue count in a topic's history.
type Epoch struct {
	// Queues is the number of queues producers wrote to in this epoch.
	Queues int
	// Begin is, per queue, the first offset that belongs to this epoch (the
	// queue's next offset when the epoch began); nil for a topic's first
	// epoch, which began at the start of every queue. It has an entry for
	// every queue that existed in this epoch or the one before.
	Begin []int64
	// Started is when the epoch began.
	Started time.Time
}

// MaxQueues is the most queues a topic may have on any engine.
const MaxQueues = 1024

// ValidateQueueCount checks a topic's queue count (1 to MaxQueues).
func ValidateQueueCount(n int) error {
	if n < 1 || n > MaxQueues {
		return fmt.Errorf("%w: %d queues, want 1 to %d", ErrInvalidTopic, n, MaxQueues)
	}
	return nil
}

// Barrier holds back the messages of a queue at or above At until the
// queue's epoch Epoch is open for the group.
type Barrier struct {
	At    int64
	Epoch int
}

// Barriers returns the barriers of queue q: one per epoch after the first
// that wrote to q, in epoch order (At never decreases).
func Barriers(epochs []Epoch, q int) []Barrier {
	var out []Barrier
	for e := 1; e < len(epochs); e++ {
		if writes(epochs, q, e) {
			out = append(out, Barrier{At: epochs[e].Begin[q], Epoch: e})
		}
	}
	return out
}

// writes reports whether queue q took writes in epoch e.
func writes(epochs []Epoch, q, e int) bool {
	if q < 0 || q >= epochs[e].Queues {
		return false
	}
	return e == 0 || q < len(epochs[e].Begin)
}

// Gate returns how far a group may read queue q: nothing at or above the
// returned offset may be delivered yet (-1: no limit). done tells where the
// group is in a queue: its committed offset or, never committed, where it
// would start. A limit at or below the group's position means the queue
// waits for its sources.
func Gate(epochs []Epoch, q int, done func(queue int) (int64, error)) (int64, error) {
	g := gate{epochs: epochs, done: done, memo: map[[2]int]bool{}, at: map[int]int64{}}
	for _, b := range Barriers(epochs, q) {
		open, err := g.open(q, b.Epoch)
		if err != nil {
			return 0, err
		}
		if !open {
			return b.At, nil
		}
	}
	return -1, nil
}

type gate struct {
	epochs []Epoch
	done   func(int) (int64, error)
	memo   map[[2]int]bool
	at     map[int]int64
}

// open is Open(q, e): every source p of q in epoch e−1 is done up to
// Begin_e[p], and open(p, e−1).
func (g *gate) open(q, e int) (bool, error) {
	if e == 0 {
		return true, nil
	}
	if v, ok := g.memo[[2]int{q, e}]; ok {
		return v, nil
	}
	cur, prev := g.epochs[e], g.epochs[e-1]
	step := gcd(prev.Queues, cur.Queues)
	ok := true
	for p := q % step; p < prev.Queues && ok; p += step {
		if p >= len(cur.Begin) {
			continue
		}
		off, err := g.position(p)
		if err != nil {
			return false, fmt.Errorf("epoch %d: queue %d: %w", e, p, err)
		}
		if off < cur.Begin[p] {
			ok = false
			break
		}
		if writes(g.epochs, p, e-1) {
			if ok, err = g.open(p, e-1); err != nil {
				return false, err
			}
		}
	}
	g.memo[[2]int{q, e}] = ok
	return ok, nil
}

func (g *gate) position(p int) (int64, error) {
	if off, ok := g.at[p]; ok {
		return off, nil
	}
	off, err := g.done(p)
	if err != nil {
		return 0, err
	}
	g.at[p] = off
	return off, nil
}
func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	if a < 1 {
		return 1
	}
	return a
}
