package corebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
)

// TailOptions configure RunTail. A zero field means its default.
type TailOptions struct {
	// Addr is the core server, host:port; Token its token, if it wants one.
	Addr, Token string
	// Topic is the tail topic (default "tail"), created with Queues queues
	// (default 8) if it does not exist.
	Topic  string
	Queues int
	// Rate is messages per second across all producers (default 5,000);
	// Size the payload in bytes (default 1,024); Producers the producer
	// connections (default 4).
	Rate      float64
	Size      int
	Producers int
	// Warmup runs before the window opens (default 2 s); Duration is the
	// longest the window stays open (default 20 s).
	Warmup, Duration time.Duration
	// BacklogTopic, when set, is replayed from its earliest message by a
	// new group of BacklogConsumers consumers (default 1) during the
	// window.
	BacklogTopic     string
	BacklogConsumers int
	// Progress, when set, gets a line a second.
	Progress io.Writer
}

func (o TailOptions) withDefaults() TailOptions {
	if o.Topic == "" {
		o.Topic = "tail"
	}
	if o.Queues == 0 {
		o.Queues = 8
	}
	if o.Rate == 0 {
		o.Rate = 5000
	}
	if o.Size == 0 {
		o.Size = 1024
	}
	if o.Producers == 0 {
		o.Producers = 4
	}
	if o.Warmup == 0 {
		o.Warmup = 2 * time.Second
	}
	if o.Duration == 0 {
		o.Duration = 20 * time.Second
	}
	if o.BacklogConsumers == 0 {
		o.BacklogConsumers = 1
	}
	return o
}

func (o TailOptions) validate() error {
	var errs []error
	if o.Addr == "" {
		errs = append(errs, errors.New("no server address"))
	}
	if o.Rate < 0 || o.Size < 0 || o.Producers < 0 || o.Queues < 0 || o.BacklogConsumers < 0 || o.Warmup < 0 || o.Duration < 0 {
		errs = append(errs, errors.New("rates, sizes, counts and durations must not be negative"))
	}
	if o.BacklogTopic != "" && o.BacklogTopic == o.Topic {
		errs = append(errs, errors.New("the backlog topic must not be the tail topic"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("corebench: %w", errors.Join(errs...))
	}
	return nil
}

// TailResult is what RunTail measured in its window.
type TailResult struct {
	Topic  string  `json:"topic"`
	Rate   float64 `json:"rate"`
	Size   int     `json:"size"`
	Window float64 `json:"window_seconds"`
	// Sent is what producers had acknowledged by the window's end (since
	// the start); Received the tail messages received in the window.
	Sent     int64 `json:"sent"`
	Received int64 `json:"received"`
	// Latency from store time to receipt of the tail messages received in
	// the window, µs.
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	P999us float64 `json:"p999_us"`
	MaxUs  float64 `json:"max_us"`
	// Backlog is the backlog group's part; nil without one.
	Backlog *BacklogResult `json:"backlog,omitempty"`
}

// BacklogResult is the backlog group's part of a TailResult.
type BacklogResult struct {
	Topic string `json:"topic"`
	Group string `json:"group"`
	// Total is what the topic held at the start; Messages and Bytes (of
	// payload) what the group received in the window.
	Total    int64   `json:"total"`
	Messages int64   `json:"messages"`
	Bytes    int64   `json:"bytes"`
	MBPerSec float64 `json:"mb_per_sec"`
	// Done: it consumed the whole backlog, which closed the window.
	Done bool `json:"done"`
}

// RunTail runs the load o describes and returns what it measured.
func RunTail(ctx context.Context, o TailOptions) (TailResult, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return TailResult{}, err
	}
	r := &tailRun{o: o, run: fmt.Sprintf("tailbench-%d", time.Now().UnixNano())}
	return r.run1(ctx)
}

type tailRun struct {
	o   TailOptions
	run string // prefix of group and client names

	mu       sync.Mutex
	samples  []tailSample // tail receipts
	winStart time.Time    // zero until the window opens
	winEnd   time.Time

	sent    atomic.Int64
	backlog *replay // nil without a backlog group
	fail    context.CancelCauseFunc
}

type tailSample struct {
	at  int64 // receipt, unix ns
	lat int64 // ns from store time
}

func (r *tailRun) dial(ctx context.Context, name string) (*client.Client, error) {
	c, err := client.Dial(ctx, client.Options{Addr: r.o.Addr, Token: r.o.Token, ClientID: r.run + "-" + name})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return c, nil
}

func (r *tailRun) run1(ctx context.Context) (res TailResult, err error) {
	o := r.o
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.fail = cancel
	var closers []func(context.Context) error
	defer func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer ccancel()
		for i := len(closers) - 1; i >= 0; i-- {
			err = errors.Join(err, closers[i](cctx))
		}
	}()

	admin, err := r.dial(ctx, "admin")
	if err != nil {
		return res, err
	}
	closers = append(closers, func(context.Context) error { return admin.Close() })
	if _, err := admin.Topic(ctx, o.Topic); errors.Is(err, core.ErrTopicNotFound) {
		if _, err := admin.CreateTopic(ctx, o.Topic, o.Queues); err != nil && !errors.Is(err, core.ErrTopicExists) {
			return res, fmt.Errorf("create %s: %w", o.Topic, err)
		}
	} else if err != nil {
		return res, fmt.Errorf("topic %s: %w", o.Topic, err)
	}
	if o.BacklogTopic != "" {
		if r.backlog, err = newReplay(ctx, admin, o.BacklogTopic); err != nil {
			return res, fmt.Errorf("backlog: %w", err)
		}
	}

	// The tail group, at the end of the topic, owning its queues before
	// the first message is sent.
	tailGroup := r.run + "-tail"
	tc, err := r.dial(ctx, "tail")
	if err != nil {
		return res, err
	}
	closers = append(closers, func(context.Context) error { return tc.Close() })
	tailPC, err := r.consume(ctx, tc, tailGroup, o.Topic, group.FromLatest, func(m *core.StoredMessage) {
		now := time.Now().UnixNano()
		r.mu.Lock()
		r.samples = append(r.samples, tailSample{at: now, lat: now - m.StoredAt.UnixNano()})
		r.mu.Unlock()
	})
	if err != nil {
		return res, err
	}
	closers = append(closers, tailPC.Close)
	if err := waitAssigned(ctx, admin, tailGroup); err != nil {
		return res, err
	}

	// Producers, paced.
	body := make([]byte, o.Size)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range body {
		body[i] = byte(rnd.Uint32())
	}
	producers := make([]*client.Client, 0, o.Producers)
	closers = append(closers, func(context.Context) error {
		var errs []error
		for _, pc := range producers {
			errs = append(errs, pc.Close())
		}
		return errors.Join(errs...)
	})
	for i := range o.Producers {
		pc, err := r.dial(ctx, fmt.Sprintf("p%d", i))
		if err != nil {
			return res, err
		}
		producers = append(producers, pc)
	}
	var pwg sync.WaitGroup
	pctx, pstop := context.WithCancel(ctx)
	closers = append(closers, func(context.Context) error { pstop(); pwg.Wait(); return nil }) // before the connections close
	start := time.Now()
	for _, pc := range producers {
		pwg.Go(func() { r.produce(pctx, pc.NewProducer(), body, start) })
	}

	progress := r.progress(ctx, start)
	closers = append(closers, func(context.Context) error { progress(); return nil })

	if err := sleep(ctx, o.Warmup); err != nil {
		return res, context.Cause(ctx)
	}
	backlogGroup := r.run + "-backlog"
	var backlogDone chan struct{} // nil without a backlog: never ready
	if r.backlog != nil {
		if err := r.startReplay(ctx, r.backlog, backlogGroup, "b", o.BacklogConsumers, &closers); err != nil {
			return res, err
		}
		backlogDone = r.backlog.done
	}
	r.mu.Lock()
	r.winStart = time.Now()
	msgs0, bytes0 := r.backlog.counts()
	r.mu.Unlock()
	done := false
	t := time.NewTimer(o.Duration)
	select {
	case <-t.C:
	case <-backlogDone:
		done = true
	case <-ctx.Done():
		t.Stop()
		return res, context.Cause(ctx)
	}
	t.Stop()
	r.mu.Lock()
	r.winEnd = time.Now()
	msgs, bytes := r.backlog.counts()
	msgs, bytes = msgs-msgs0, bytes-bytes0
	r.mu.Unlock()

	res = r.result()
	if o.BacklogTopic != "" {
		res.Backlog = &BacklogResult{Topic: o.BacklogTopic, Group: backlogGroup, Total: r.backlog.total, Messages: msgs, Bytes: bytes,
			MBPerSec: float64(bytes) / res.Window / 1e6, Done: done}
	}
	return res, nil
}

// result computes the tail's part from the samples in the window.
func (r *tailRun) result() TailResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	from, to := r.winStart.UnixNano(), r.winEnd.UnixNano()
	var lats []int64
	for _, s := range r.samples {
		if s.at >= from && s.at <= to {
			lats = append(lats, s.lat)
		}
	}
	slices.Sort(lats)
	res := TailResult{Topic: r.o.Topic, Rate: r.o.Rate, Size: r.o.Size, Window: r.winEnd.Sub(r.winStart).Seconds(),
		Sent: r.sent.Load(), Received: int64(len(lats))}
	if len(lats) > 0 {
		q := func(p float64) float64 {
			i := min(int(p*float64(len(lats))), len(lats)-1)
			return float64(lats[i]) / 1e3
		}
		res.P50us, res.P99us, res.P999us, res.MaxUs = q(0.50), q(0.99), q(0.999), float64(lats[len(lats)-1])/1e3
	}
	return res
}

// consume starts a clustering push consumer of topic for grp.
func (r *tailRun) consume(ctx context.Context, c *client.Client, grp, topic string, from group.ConsumeFrom, on func(*core.StoredMessage)) (*consumer.PushConsumer, error) {
	pc, err := c.NewPushConsumer(consumer.Options{Group: grp, From: from, Subscriptions: []group.Subscription{{Topic: topic}},
		Listener: func(_ context.Context, m *core.StoredMessage) consumer.Result {
			on(m)
			return consumer.Success
		}})
	if err == nil {
		err = pc.Start(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("consumer of %s for %s: %w", topic, grp, err)
	}
	return pc, nil
}

// produce sends what is due at the run's rate (its share of it) until ctx
// ends, with at most 256 sends unacknowledged.
func (r *tailRun) produce(ctx context.Context, p *client.Producer, body []byte, start time.Time) {
	rate := r.o.Rate / float64(r.o.Producers)
	sem := make(chan struct{}, 256)
	msg := &core.Message{Topic: r.o.Topic, Body: body}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var n int64
	for {
		due := int64(time.Since(start).Seconds() * rate)
		for ; n < due; n++ {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			p.SendAsync(ctx, msg, func(_ core.SendResult, err error) {
				<-sem
				if err == nil {
					r.sent.Add(1)
				} else if ctx.Err() == nil {
					r.fail(fmt.Errorf("send: %w", err))
				}
			})
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			for range cap(sem) { // the sends in flight end (or fail) before the connection closes
				sem <- struct{}{}
			}
			return
		}
	}
}

// progress writes a line a second until the returned stop is called.
func (r *tailRun) progress(ctx context.Context, start time.Time) (stop func()) {
	if r.o.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var lastN int
		var lastB int64
		for {
			select {
			case <-t.C:
			case <-done:
				return
			case <-ctx.Done():
				return
			}
			r.mu.Lock()
			recent := append([]tailSample(nil), r.samples[lastN:]...)
			lastN = len(r.samples)
			r.mu.Unlock()
			lats := make([]int64, len(recent))
			for i, s := range recent {
				lats[i] = s.lat
			}
			slices.Sort(lats)
			p99 := 0.0
			if len(lats) > 0 {
				p99 = float64(lats[min(len(lats)*99/100, len(lats)-1)]) / 1e6
			}
			_, b := r.backlog.counts()
			fmt.Fprintf(r.o.Progress, "%6.1fs  tail %6d msgs/s  p99 %7.2f ms  backlog %8.1f MB/s\n",
				time.Since(start).Seconds(), len(recent), p99, float64(b-lastB)/1e6)
			lastB = b
		}
	})
	return func() { close(done); wg.Wait() }
}

// waitAssigned polls until a member of grp owns queues.
func waitAssigned(ctx context.Context, c *client.Client, grp string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		gs, err := c.Groups(ctx)
		if err != nil {
			return fmt.Errorf("groups: %w", err)
		}
		for _, g := range gs {
			for _, m := range g.Members {
				if g.Group == grp && len(m.Queues) > 0 {
					return nil
				}
			}
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("group %s: no queues assigned: %w", grp, err)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
