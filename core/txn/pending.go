package txn

import (
	"container/heap"
	"unique"

	"github.com/ferrymq/ferrymq/core"
)

// half is what the Service keeps of one unresolved half message: where it
// is and when it is next checked, never its body. Times are Unix
// nanoseconds. All fields are guarded by Service.mu.
type half struct {
	id        core.MessageID
	group     unique.Handle[string]
	topic     unique.Handle[string]
	offset    int64 // queue offset in HalfTopic
	storedAt  int64
	nextCheck int64
	checks    int
	// resolving is set while an End or a discard writes the half's
	// resolution; nobody else may resolve it meanwhile.
	resolving bool
	// Positions in Service.byCheck, Service.byOffset and the group's parked
	// list; -1 when not in it. While the checker works on a half it is in
	// none of byCheck and parked.
	checkIdx, offsetIdx, parkIdx int
}

func (h *half) info() PendingInfo {
	return PendingInfo{
		ID:        h.id,
		Group:     h.group.Value(),
		Topic:     h.topic.Value(),
		StoredAt:  unixTime(h.storedAt),
		Checks:    h.checks,
		NextCheck: unixTime(h.nextCheck),
		Waiting:   h.parkIdx >= 0,
	}
}

// halfHeap is a min-heap of halves that keeps each half's position in it,
// so a resolved half is removed in O(log n).
type halfHeap struct {
	items []*half
	less  func(a, b *half) bool
	index func(h *half) *int
}

func byNextCheck() halfHeap {
	return halfHeap{
		less: func(a, b *half) bool {
			if a.nextCheck != b.nextCheck {
				return a.nextCheck < b.nextCheck
			}
			return a.offset < b.offset
		},
		index: func(h *half) *int { return &h.checkIdx },
	}
}

func byOffset() halfHeap {
	return halfHeap{
		less:  func(a, b *half) bool { return a.offset < b.offset },
		index: func(h *half) *int { return &h.offsetIdx },
	}
}

func (q *halfHeap) Len() int           { return len(q.items) }
func (q *halfHeap) Less(i, j int) bool { return q.less(q.items[i], q.items[j]) }
func (q *halfHeap) Swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	*q.index(q.items[i]) = i
	*q.index(q.items[j]) = j
}

func (q *halfHeap) Push(x any) {
	h := x.(*half)
	*q.index(h) = len(q.items)
	q.items = append(q.items, h)
}

func (q *halfHeap) Pop() any {
	n := len(q.items) - 1
	h := q.items[n]
	q.items[n] = nil
	q.items = q.items[:n]
	*q.index(h) = -1
	return h
}

func (q *halfHeap) add(h *half) { heap.Push(q, h) }

func (q *halfHeap) remove(h *half) {
	if i := *q.index(h); i >= 0 {
		heap.Remove(q, i)
	}
}

func (q *halfHeap) top() *half {
	if len(q.items) == 0 {
		return nil
	}
	return q.items[0]
}

func (q *halfHeap) pop() *half { return heap.Pop(q).(*half) }

// recentSize bounds how many resolved halves State and End remember in
// memory; older ones are looked up in the broker.
const recentSize = 10_000

// resolution is what the Service remembers of a resolved half.
type resolution struct {
	state State
	group unique.Handle[string]
}

// recentSet remembers the last recentSize resolutions, oldest evicted first.
type recentSet struct {
	m    map[core.MessageID]resolution
	ring []core.MessageID
	next int
}

func newRecentSet() recentSet {
	return recentSet{m: make(map[core.MessageID]resolution)}
}

func (r *recentSet) add(id core.MessageID, res resolution) {
	if _, ok := r.m[id]; ok {
		r.m[id] = res
		return
	}
	if len(r.ring) < recentSize {
		r.ring = append(r.ring, id)
	} else {
		delete(r.m, r.ring[r.next])
		r.ring[r.next] = id
		r.next = (r.next + 1) % recentSize
	}
	r.m[id] = res
}

// registration is one Checker of a group.
type registration struct {
	id uint64
	c  Checker
}

// checkerSet holds a group's Checkers; checks go round-robin.
type checkerSet struct {
	regs []registration
	next int
}

// rotation returns the Checkers in the order to try them for one check and
// moves the round-robin start on.
func (cs *checkerSet) rotation() []Checker {
	n := len(cs.regs)
	out := make([]Checker, n)
	for i := range n {
		out[i] = cs.regs[(cs.next+i)%n].c
	}
	cs.next = (cs.next + 1) % n
	return out
}
