package mqttbench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// publisher is one publishing connection of an MQTT client library.
type publisher interface {
	// publish hands m over; the completion function the publisher was
	// dialled with is called exactly once for m, on any goroutine, when the
	// broker acknowledged it (QoS 1: PUBACK, 2: PUBCOMP), it was written
	// (QoS 0), or it failed. publish does not block: a caller has at most
	// Options.Inflight messages outstanding.
	publish(m *outMsg)
	// close fails what is still outstanding, disconnects, and returns
	// after the client's goroutines have ended. Not concurrent with publish.
	close()
}

// subscriber is one subscribing connection.
type subscriber interface {
	// close disconnects and returns after the client's goroutines ended.
	close()
}

// outMsg is a message buffer of a publisher, reused once completed.
type outMsg struct {
	buf   []byte
	start time.Time // when it was handed to the client
}

// pollInterval is how often the drain checks whether all has arrived.
const pollInterval = 10 * time.Millisecond

// drainQuiet ends the drain early when nothing arrives for this long: what
// has not arrived by then is lost.
const drainQuiet = 3 * time.Second

// ackShards spread the recording of acknowledgement latencies over a few
// locks (a histogram is 58 KiB: not one per publisher).
const ackShards = 16

// pubsub is one pubsub run.
type pubsub struct {
	o     *Options
	addr  brokerAddr
	errs  errorSet
	quiet time.Duration // drainQuiet, shorter in tests

	sent       []*atomic.Int64 // per publisher; also the trackers' bound
	acked      atomic.Int64
	failed     atomic.Int64 // completed with an error
	ackLatency [ackShards]struct {
		mu sync.Mutex
		h  *Histogram
	}
}

func runPubSub(ctx context.Context, o *Options, addr brokerAddr) (res Result, err error) {
	r := &pubsub{o: o, addr: addr, quiet: drainQuiet, sent: make([]*atomic.Int64, o.Publishers)}
	for i := range r.sent {
		r.sent[i] = new(atomic.Int64)
	}
	for i := range r.ackLatency {
		r.ackLatency[i].h = NewHistogram()
	}
	res = Result{Mode: ModePubSub, Label: o.Label, Addr: o.Addr, Version: o.Version, Started: time.Now(),
		Publishers: o.Publishers, Subscribers: o.Subscribers, QoS: o.QoS, SizeBytes: o.SizeBytes, Inflight: o.Inflight, Rate: o.Rate}
	defer func() { res.Errors = r.errs.list() }()
	runStart := res.Started

	// Receivers first, so that they miss nothing.
	subTrackers := make([]*tracker, o.Subscribers)
	subs := make([]subscriber, o.Subscribers)
	defer func() { closeAll(subs, o.Workers) }()
	err = parallel(ctx, o.Subscribers, o.Workers, func(ctx context.Context, i int) error {
		subTrackers[i] = newTracker(runStart, r.sent)
		id := fmt.Sprintf("%ssub-%d", o.ClientPrefix, i)
		s, err := r.dialSub(ctx, id, o.filterOf(i), subTrackers[i])
		subs[i] = s
		return err
	})
	if err != nil {
		return res, fmt.Errorf("subscribers: %w", err)
	}
	slow, err := dialSlow(ctx, o, r.addr)
	defer slow.close()
	if err != nil {
		return res, fmt.Errorf("slow subscribers: %w", err)
	}
	res.SlowSubscribers = o.SlowSubscribers
	var coreTrackers []*tracker
	if o.Core.Addr != "" {
		coreTrackers = []*tracker{newTracker(runStart, r.sent)}
		cr, err := startCore(ctx, o.Core, o.ClientPrefix+"core", coreTrackers[0])
		if err != nil {
			return res, err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if cerr := cr.close(cctx); cerr != nil {
				r.errs.add(fmt.Errorf("close core consumer: %w", cerr))
			}
		}()
	}

	pubs := make([]publisher, o.Publishers)
	frees := make([]chan *outMsg, o.Publishers)
	defer func() { closeAll(pubs, o.Workers) }()
	err = parallel(ctx, o.Publishers, o.Workers, func(ctx context.Context, i int) error {
		frees[i] = make(chan *outMsg, o.Inflight)
		for range o.Inflight {
			m := &outMsg{buf: make([]byte, o.SizeBytes)}
			fillPayload(m.buf)
			frees[i] <- m
		}
		id := fmt.Sprintf("%spub-%d", o.ClientPrefix, i)
		p, err := r.dialPub(ctx, id, publisherTopic(o.Topic, i), r.completion(i, frees[i]))
		pubs[i] = p
		return err
	})
	if err != nil {
		return res, fmt.Errorf("publishers: %w", err)
	}

	// Publish.
	pr := startProgress(o.Progress, o.ProgressInterval, r.progressLine(subTrackers, coreTrackers))
	defer pr.stop()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range pubs {
		wg.Go(func() { r.publishLoop(ctx, i, pubs[i], frees[i], start) })
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()

	// Drain: wait for the receivers to get all they should.
	var sent int64
	for _, s := range r.sent {
		sent += s.Load()
	}
	res.Sent, res.Acked = sent, r.acked.Load()
	expected := res.Acked
	if o.QoS == 0 {
		expected = res.Sent
	}
	// Each subscriber expects every message; in pairs, the subscribers
	// together expect each once.
	subExpected := expected * int64(len(subTrackers))
	if o.pairs() {
		subExpected = expected
	}
	drainStart := time.Now()
	r.drain(ctx, func() bool {
		return receivedBy(subTrackers) >= subExpected && receivedBy(coreTrackers) >= expected*int64(len(coreTrackers))
	}, func() int64 { return receivedBy(subTrackers) + receivedBy(coreTrackers) })
	res.SlowDisconnected = slow.disconnected()
	res.DrainSeconds = time.Since(drainStart).Seconds()
	pr.stop()

	// Close the publishers now, so that a message still unacknowledged
	// counts as failed.
	closeAll(pubs, o.Workers)
	res.Failed = res.Sent - res.Acked
	if res.Seconds > 0 {
		res.AckedPerSec = float64(res.Acked) / res.Seconds
	}
	if o.QoS > 0 {
		h := NewHistogram()
		for i := range r.ackLatency {
			s := &r.ackLatency[i]
			s.mu.Lock()
			h.Merge(s.h)
			s.mu.Unlock()
		}
		l := latencyOf(h)
		res.AckLatency = &l
	}
	if len(subTrackers) > 0 {
		res.MQTT = deliveries(subTrackers, subExpected, start)
	}
	if len(coreTrackers) > 0 {
		res.Core = deliveries(coreTrackers, expected, start)
	}
	return res, ctx.Err()
}

func (r *pubsub) dialPub(ctx context.Context, id, topic string, done func(*outMsg, error)) (publisher, error) {
	if r.o.Version == 5 {
		return dialPub5(ctx, r.o, r.addr, id, topic, done, &r.errs)
	}
	return dialPub3(ctx, r.o, r.addr, id, topic, done, &r.errs)
}

func (r *pubsub) dialSub(ctx context.Context, id, filter string, tr *tracker) (subscriber, error) {
	if r.o.Version == 5 {
		return dialSub5(ctx, r.o, r.addr, id, filter, tr, &r.errs)
	}
	return dialSub3(ctx, r.o, r.addr, id, filter, tr, &r.errs)
}

// completion returns publisher i's completion function: it counts the
// outcome and gives the buffer back.
func (r *pubsub) completion(i int, free chan<- *outMsg) func(*outMsg, error) {
	shard := &r.ackLatency[i%ackShards]
	return func(m *outMsg, err error) {
		if err != nil {
			r.failed.Add(1)
			r.errs.add(fmt.Errorf("publish: %w", err))
		} else {
			if r.o.QoS > 0 {
				lat := time.Since(m.start)
				shard.mu.Lock()
				shard.h.Record(lat)
				shard.mu.Unlock()
			}
			r.acked.Add(1)
		}
		free <- m // never blocks: m came from free
	}
}

// publishLoop sends publisher i's messages: Count of them or until
// Duration passed, paced at Rate/Publishers per second if Rate is set
// (publisher i offset by i/Rate, so the publishers take turns), with at
// most Inflight outstanding. Then it waits up to Drain for the
// outstanding ones.
func (r *pubsub) publishLoop(ctx context.Context, i int, p publisher, free chan *outMsg, start time.Time) {
	o := r.o
	var deadline time.Time
	if o.Duration > 0 {
		deadline = start.Add(o.Duration)
	}
	var interval, offset time.Duration
	var pace *time.Timer
	if o.Rate > 0 {
		interval = time.Duration(float64(o.Publishers) / o.Rate * 1e9)
		offset = time.Duration(float64(i) / o.Rate * 1e9)
		pace = time.NewTimer(time.Hour)
		defer pace.Stop()
	}
	sent := r.sent[i]
	for seq := int64(0); o.Count == 0 || seq < o.Count; seq++ {
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			break
		}
		if pace != nil {
			if wait := time.Until(start.Add(offset + time.Duration(seq)*interval)); wait > 0 {
				pace.Reset(wait)
				select {
				case <-pace.C:
				case <-ctx.Done():
					return
				}
			}
		}
		var m *outMsg
		select {
		case m = <-free:
		case <-ctx.Done():
			return
		}
		now := time.Now()
		EncodePayload(m.buf, Stamp{Publisher: uint32(i), Seq: uint32(seq), SentUnixNano: now.UnixNano()})
		m.start = now
		sent.Add(1) // before publish: a receiver checks the sequence against it
		p.publish(m)
	}
	wait := time.NewTimer(o.Drain)
	defer wait.Stop()
	for range cap(free) {
		select {
		case <-free:
		case <-wait.C:
			r.errs.add(fmt.Errorf("publish: no acknowledgement within %v after the last message", o.Drain))
			return
		case <-ctx.Done():
			return
		}
	}
}

// drain waits until the receivers got all they should (done), nothing
// arrived for r.quiet (the rest is lost), Drain passed, or ctx ended.
// Ending at Drain while messages still arrive overstates the loss: that
// is reported as an error.
func (r *pubsub) drain(ctx context.Context, done func() bool, received func() int64) {
	limit := time.NewTimer(r.o.Drain)
	defer limit.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	last, lastAt := received(), time.Now()
	for !done() {
		select {
		case <-tick.C:
			if n := received(); n != last {
				last, lastAt = n, time.Now()
			} else if time.Since(lastAt) >= r.quiet {
				return
			}
		case <-limit.C:
			if time.Since(lastAt) < r.quiet {
				r.errs.add(fmt.Errorf("drain: messages were still arriving after %v: loss is overstated (raise the drain)", r.o.Drain))
			}
			return
		case <-ctx.Done():
			return
		}
	}
}

// progressLine reports messages sent, acknowledged and received, each
// with its rate over the last interval, and the messages in flight.
func (r *pubsub) progressLine(subs, cores []*tracker) func(el time.Duration, final bool) string {
	var last [4]int64
	var lastEl time.Duration
	return func(el time.Duration, final bool) string {
		var now [4]int64
		for _, s := range r.sent {
			now[0] += s.Load()
		}
		now[1], now[2], now[3] = r.acked.Load(), receivedBy(subs), receivedBy(cores)
		dt := (el - lastEl).Seconds()
		if final {
			dt, last = el.Seconds(), [4]int64{}
		}
		rate := func(k int) float64 { return float64(now[k]-last[k]) / max(dt, 1e-9) }
		line := fmt.Sprintf("pubsub %6.1fs  sent %9d %7.0f/s  acked %9d %7.0f/s", el.Seconds(), now[0], rate(0), now[1], rate(1))
		if len(subs) > 0 {
			line += fmt.Sprintf("  received %9d %7.0f/s", now[2], rate(2))
		}
		if len(cores) > 0 {
			line += fmt.Sprintf("  core %9d %7.0f/s", now[3], rate(3))
		}
		line += fmt.Sprintf("  inflight %5d", now[0]-now[1]-r.failed.Load())
		last, lastEl = now, el
		return line
	}
}

// closer is a connection to close at the end.
type closer interface{ close() }

// closeAll closes the non-nil connections of cs on up to workers
// goroutines and sets them to nil (so a second call does nothing).
func closeAll[C closer](cs []C, workers int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(len(cs), workers) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(cs); i = int(next.Add(1) - 1) {
				if c := cs[i]; any(c) != nil {
					c.close()
				}
			}
		})
	}
	wg.Wait()
	clear(cs)
}

// parallel calls f(ctx, i) for every i in [0, n) on up to workers
// goroutines. The first error cancels the calls not yet started and is
// returned (or ctx's error if ctx ended first).
func parallel(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, workers) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx) // nil unless f failed or the parent ended
}
