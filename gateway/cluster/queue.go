package cluster

import "sync"

// queue is a FIFO bounded in items and bytes between the goroutines that
// fill it (the engine's, or the receiver) and the one that drains it. push never
// blocks: past a bound it refuses.
type queue[T any] struct {
	maxItems, maxBytes int
	ready              chan struct{} // signalled after a push

	mu     sync.Mutex
	items  []T
	sizes  []int
	bytes  int
	closed bool
}

func newQueue[T any](maxItems, maxBytes int) *queue[T] {
	return &queue[T]{maxItems: maxItems, maxBytes: maxBytes, ready: make(chan struct{}, 1)}
}

// push appends v of size bytes; false when the queue is full or closed.
func (q *queue[T]) push(v T, size int) bool {
	q.mu.Lock()
	if q.closed || len(q.items) >= q.maxItems || (q.bytes+size > q.maxBytes && len(q.items) > 0) {
		q.mu.Unlock()
		return false
	}
	q.items = append(q.items, v)
	q.sizes = append(q.sizes, size)
	q.bytes += size
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return true
}

// take moves everything queued into buf (emptied first) and returns it;
// closed reports that the queue is closed (what it returns is the last).
func (q *queue[T]) take(buf []T) (items []T, closed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	buf = append(buf[:0], q.items...)
	clear(q.items)
	q.items, q.sizes, q.bytes = q.items[:0], q.sizes[:0], 0
	return buf, q.closed
}

// close refuses further pushes and wakes the drainer.
func (q *queue[T]) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}
