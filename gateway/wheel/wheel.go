// Package wheel is a hashed timing wheel: many timers of coarse resolution
// (keepalive deadlines of a million connections) for the cost of one slice
// slot each, advanced by one goroutine of the caller's.
//
// An item sits in the slot of its deadline's tick. When the wheel reaches
// that slot the caller's function is given the deadline the item was added
// with (so it can tell a stale entry) and decides what the item's deadline
// is now:
// a connection that was active since is simply put back at its new
// deadline, so a busy connection is touched once per keepalive period, not
// once per packet; an item whose deadline lies more than one turn of the
// wheel ahead waits in its slot and is put back on each turn. There is no
// removal: an item that no longer needs a timer answers 0 when its slot
// comes.
//
// A Wheel is safe for concurrent use; the function passed to Advance runs
// without the wheel's lock held and may Add.
package wheel

import (
	"sync"
	"time"
)

// Wheel holds items by deadline (unix nanoseconds).
type Wheel[T any] struct {
	tick  int64 // nanoseconds per slot
	mask  int64
	mu    sync.Mutex
	slots [][]entry[T]
	next  int64 // the tick number Advance looks at next
	n     int
	spare []entry[T]
}

type entry[T any] struct {
	item     T
	deadline int64
}

// New returns a wheel of slots slots (rounded up to a power of two) of tick
// each, starting at now.
func New[T any](tick time.Duration, slots int, now time.Time) *Wheel[T] {
	size := 1
	for size < slots {
		size <<= 1
	}
	w := &Wheel[T]{tick: int64(tick), mask: int64(size - 1), slots: make([][]entry[T], size)}
	w.next = now.UnixNano() / w.tick
	return w
}

// Add puts item in the slot of deadline; a deadline already past fires at
// the next Advance.
func (w *Wheel[T]) Add(item T, deadline int64) {
	w.mu.Lock()
	t := deadline / w.tick
	if t < w.next {
		t = w.next
	}
	s := &w.slots[t&w.mask]
	*s = append(*s, entry[T]{item, deadline})
	w.n++
	w.mu.Unlock()
}

// Len returns the number of items held.
func (w *Wheel[T]) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// Advance runs fn for every item in the slots up to now, with the deadline
// it was added with. fn returns the item's deadline now: one after now puts
// it back, anything else (0) drops it. It returns the number of items fn
// saw.
func (w *Wheel[T]) Advance(now time.Time, fn func(item T, added, now int64) (deadline int64)) int {
	nowNS := now.UnixNano()
	end := nowNS / w.tick
	seen := 0
	for {
		w.mu.Lock()
		if w.next > end {
			w.mu.Unlock()
			return seen
		}
		slot := w.next & w.mask
		items := w.slots[slot]
		w.slots[slot] = w.spare[:0]
		w.spare = nil
		w.n -= len(items)
		w.next++
		w.mu.Unlock()

		for i, it := range items {
			seen++
			if d := fn(it.item, it.deadline, nowNS); d > nowNS {
				w.Add(it.item, d)
			}
			items[i] = entry[T]{}
		}
		w.mu.Lock()
		if w.spare == nil && cap(items) <= 1024 {
			w.spare = items[:0] // reused by the next slot emptied
		}
		w.mu.Unlock()
	}
}
