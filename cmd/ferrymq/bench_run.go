package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/ferrymq/ferrymq/gateway/mqttbench"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// benchTarget is a system `bench core` can drive: it opens producer and
// consumer connections; the drivers below do the counting and timing, so
// both targets are measured by the same code.
type benchTarget interface {
	// prepareProduce readies the server for a produce run (topic, stream).
	prepareProduce(ctx context.Context) error
	// prepareFill readies it for producing a backlog that the consume
	// run that follows consumes exactly (and nothing stored before).
	prepareFill(ctx context.Context) error
	// prepareConsume runs before the consumers start; finishConsume after
	// they stopped.
	prepareConsume(ctx context.Context) error
	finishConsume(ctx context.Context) error
	// newSender opens producer i's connection.
	newSender(ctx context.Context, i int) (benchSender, error)
	// newReceiver opens consumer i's connection and starts consuming;
	// onMsg is called once per message consumed and acknowledged, with
	// its partition (ferrymq: queue; jetstream: subject index) and its
	// position there in store order.
	newReceiver(ctx context.Context, i int, onMsg func(part int, pos uint64)) (benchReceiver, error)
}

// benchSender is one producer connection.
type benchSender interface {
	// send starts sending message seq; done is called exactly once with
	// the outcome, possibly before send returns and on any goroutine.
	send(ctx context.Context, seq int64, done func(error))
	// close ends the connection; sends still in flight fail.
	close() error
}

// benchReceiver is one consumer connection.
type benchReceiver interface {
	close(ctx context.Context) error
}

// benchMeasurement is what a driver measured.
type benchMeasurement struct {
	messages   int64
	outOfOrder int64         // consume: first deliveries behind a later one of their partition
	duplicates int64         // consume: deliveries of a message delivered before (not counted in messages)
	first      time.Duration // consume: from starting the receivers to the first delivery (not in elapsed)
	elapsed    time.Duration
	hist       *mqttbench.Histogram // latencies from send to ack; nil for consume
}

// benchWorker keeps up to cap(sem) sends of one sender in flight.
type benchWorker struct {
	sem   chan struct{}
	acked atomic.Int64
	_     [56]byte // keep the counters of different workers off one cache line

	mu   sync.Mutex // held by acknowledgement callbacks
	hist *mqttbench.Histogram
}

// driveProduce sends count messages (or, with count 0, for duration) over
// producers connections with pipeline sends in flight on each, and measures
// from the first send to the last acknowledgement. The first failed send
// ends the run with its error.
func driveProduce(ctx context.Context, t benchTarget, producers, pipeline int, count int64, duration time.Duration, pr *benchProgress) (benchMeasurement, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	senders := make([]benchSender, 0, producers)
	defer func() {
		for _, s := range senders {
			_ = s.close()
		}
	}()
	for i := range producers {
		s, err := t.newSender(ctx, i)
		if err != nil {
			return benchMeasurement{}, fmt.Errorf("producer %d: %w", i, err)
		}
		senders = append(senders, s)
	}

	workers := make([]*benchWorker, producers)
	acked := func() int64 {
		var n int64
		for _, w := range workers {
			n += w.acked.Load()
		}
		return n
	}
	var next atomic.Int64
	start := time.Now()
	var deadline time.Time
	if duration > 0 {
		deadline = start.Add(duration)
	}
	claim := func() int64 {
		seq := next.Add(1) - 1
		if count > 0 && seq >= count || !deadline.IsZero() && time.Now().After(deadline) {
			return -1
		}
		return seq
	}
	for i := range workers {
		workers[i] = &benchWorker{sem: make(chan struct{}, pipeline), hist: mqttbench.NewHistogram()}
	}
	pr.start(acked)
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Go(func() { w.run(ctx, cancel, senders[i], claim) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	pr.stop()
	if err := context.Cause(ctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("run took longer than --timeout: %w", err)
		}
		return benchMeasurement{}, err
	}
	m := benchMeasurement{elapsed: elapsed, hist: mqttbench.NewHistogram()}
	for _, w := range workers {
		w.mu.Lock()
		m.hist.Merge(w.hist)
		w.mu.Unlock()
		m.messages += w.acked.Load()
	}
	return m, nil
}

// run sends claimed messages until claim says stop, then waits for the
// sends in flight. It returns early only when ctx ends.
func (w *benchWorker) run(ctx context.Context, fail context.CancelCauseFunc, s benchSender, claim func() int64) {
	for seq := claim(); seq >= 0; seq = claim() {
		select {
		case w.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		begin := time.Now()
		s.send(ctx, seq, func(err error) {
			lat := time.Since(begin)
			if err != nil {
				fail(fmt.Errorf("send: %w", err))
			} else {
				w.mu.Lock()
				w.hist.Record(lat)
				w.mu.Unlock()
				w.acked.Add(1)
			}
			<-w.sem // never blocks: this send holds a slot
		})
	}
	for range cap(w.sem) {
		select {
		case w.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
	}
}

// driveConsume starts consumers receivers and measures from the first
// delivery until count messages were consumed (or duration passed, if set);
// the time from starting the first receiver to the first delivery (joining
// the group, assigning queues) is measured apart (m.first).
func driveConsume(ctx context.Context, t benchTarget, consumers int, count int64, duration time.Duration, pr *benchProgress) (m benchMeasurement, err error) {
	if err := t.prepareConsume(ctx); err != nil {
		return m, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err = errors.Join(err, t.finishConsume(cctx))
	}()
	var got, firstNanos, endNanos atomic.Int64
	reached := make(chan struct{})
	start := time.Now()
	var seen deliverySet
	onMsg := func(part int, pos uint64) {
		if !seen.add(part, pos) {
			return // a redelivery (a queue changed hands before its commit)
		}
		n := got.Add(1)
		if n == 1 {
			firstNanos.Store(int64(time.Since(start)))
		}
		if n == count {
			endNanos.Store(int64(time.Since(start)))
			close(reached)
		}
	}
	receivers := make([]benchReceiver, 0, consumers)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, r := range receivers {
			err = errors.Join(err, r.close(cctx))
		}
	}()
	pr.start(got.Load)
	defer pr.stop()
	for i := range consumers {
		r, err := t.newReceiver(ctx, i, onMsg)
		if err != nil {
			return m, fmt.Errorf("consumer %d: %w", i, err)
		}
		receivers = append(receivers, r)
	}
	var timeout <-chan time.Time
	if duration > 0 {
		tm := time.NewTimer(duration - time.Since(start))
		defer tm.Stop()
		timeout = tm.C
	}
	defer func() { m.outOfOrder, m.duplicates = seen.outOfOrder.Load(), seen.duplicates.Load() }()
	select {
	case <-reached:
		m.messages, m.first = count, time.Duration(firstNanos.Load())
		m.elapsed = time.Duration(endNanos.Load()) - m.first
	case <-timeout:
		m.messages, m.first = min(got.Load(), count), time.Duration(firstNanos.Load())
		m.elapsed = time.Since(start) - m.first
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return m, fmt.Errorf("consumed %d of %d messages before --timeout: %w", got.Load(), count, ctx.Err())
		}
		return m, ctx.Err()
	}
	return m, nil
}

// deliverySet remembers what a consume run delivered, per partition
// (ferrymq: queue; jetstream: subject) and position in store order: a
// second delivery of a position is a duplicate, a first delivery of a
// position below the partition's highest so far is out of order.
type deliverySet struct {
	shards                 [16]deliveryShard
	outOfOrder, duplicates atomic.Int64
}

type deliveryShard struct {
	mu    sync.Mutex
	parts map[int]*deliveryPart
}

type deliveryPart struct {
	seen mqttbench.Seen // positions delivered
	next uint64         // highest position delivered + 1
}

// add records a delivery and reports whether it is the first of its
// position.
func (s *deliverySet) add(part int, pos uint64) bool {
	sh := &s.shards[uint(part)%uint(len(s.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.parts == nil {
		sh.parts = map[int]*deliveryPart{}
	}
	p := sh.parts[part]
	if p == nil {
		p = &deliveryPart{}
		sh.parts[part] = p
	}
	if !p.seen.Add(pos) {
		s.duplicates.Add(1)
		return false
	}
	if pos+1 < p.next {
		s.outOfOrder.Add(1)
	} else {
		p.next = pos + 1
	}
	return true
}

// benchProgress rewrites one status line on w every 500 ms: elapsed time,
// messages so far, and the rate over the last interval and overall.
type benchProgress struct {
	w      io.Writer
	prefix string
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

func newBenchProgress(w io.Writer, prefix string) *benchProgress {
	return &benchProgress{w: w, prefix: prefix, done: make(chan struct{})}
}

func (p *benchProgress) start(read func() int64) {
	begin := time.Now()
	p.wg.Go(func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		var last int64
		lastAt := begin
		for {
			var final bool
			select {
			case <-t.C:
			case <-p.done:
				final = true
			}
			now, n := time.Now(), read()
			el := now.Sub(begin).Seconds()
			rate := float64(n-last) / now.Sub(lastAt).Seconds()
			if final {
				rate = float64(n) / el
			}
			fmt.Fprintf(p.w, "\r%s  %6.1fs  %10d msgs  %9.0f msgs/s   ", p.prefix, el, n, rate)
			last, lastAt = n, now
			if final {
				fmt.Fprintln(p.w)
				return
			}
		}
	})
}

// stop prints the final line (the overall rate) and waits for the printer.
func (p *benchProgress) stop() {
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
}
