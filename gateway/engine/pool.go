package engine

import "sync"

// job is a unit of work on the pool: a connection's turn (conn.run), or a
// func.
type job interface{ run() }

type funcJob func()

func (f funcJob) run() { f() }

// pool runs jobs on at most max goroutines, started as work arrives and
// kept until Close: the engine's goroutine count does not grow with its
// connections, only with how much work is running at once. A connection
// is submitted once per turn (conn.sched), so one connection's work never
// runs on two goroutines at once.
type pool struct {
	mu     sync.Mutex
	cond   sync.Cond
	q      []job // FIFO: q[head:] are waiting
	head   int
	n      int // goroutines started
	idle   int // of them waiting
	max    int
	closed bool
	wg     sync.WaitGroup
	panics func(any)
}

func newPool(max int, onPanic func(any)) *pool {
	p := &pool{max: max, panics: onPanic}
	p.cond.L = &p.mu
	return p
}

// submit queues j; it never blocks.
func (p *pool) submit(j job) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.q = append(p.q, j)
	switch {
	case p.idle > 0:
		p.cond.Signal()
	case p.n < p.max:
		p.n++
		p.wg.Go(p.work)
	}
	p.mu.Unlock()
}

func (p *pool) work() {
	p.mu.Lock()
	for {
		for p.head == len(p.q) && !p.closed {
			p.idle++
			p.cond.Wait()
			p.idle--
		}
		if p.head == len(p.q) { // closed and drained
			p.mu.Unlock()
			return
		}
		j := p.q[p.head]
		p.q[p.head] = nil
		p.head++
		if p.head == len(p.q) {
			p.q, p.head = p.q[:0], 0
		} else if p.head > 1024 && p.head*2 > len(p.q) {
			n := copy(p.q, p.q[p.head:])
			clear(p.q[n:])
			p.q, p.head = p.q[:n], 0
		}
		p.mu.Unlock()
		p.runOne(j)
		p.mu.Lock()
	}
}

func (p *pool) runOne(j job) {
	defer func() {
		if r := recover(); r != nil && p.panics != nil {
			p.panics(r)
		}
	}()
	j.run()
}

// close lets the workers finish what is queued, then stops them; it
// returns when they have ended.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

// goroutines returns how many workers are running.
func (p *pool) goroutines() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
