package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
)

// Result is a listener's verdict on one message.
type Result int

const (
	// Success: the message is done.
	Success Result = iota
	// Retry: deliver it again later (concurrent: through the retry path;
	// orderly and broadcast: in place after SuspendTime).
	Retry
)

// Listener handles one message. Its context ends when the consumer is
// closed without waiting or aborted. A call that returns after
// ConsumeTimeout counts as Retry whatever it returned.
type Listener func(ctx context.Context, m *core.StoredMessage) Result

// Coordinator is what a consumer needs of its group coordinator.
type Coordinator interface {
	Heartbeat(ctx context.Context, req group.HeartbeatRequest) (group.Assignment, error)
	Pull(ctx context.Context, req group.PullRequest) (group.PullResult, error)
	Commit(ctx context.Context, group, clientID string, ref group.QueueRef, offset int64) error
	Release(ctx context.Context, group, clientID string, ref group.QueueRef) error
	Leave(ctx context.Context, group, clientID string) error
}

// Retrier takes a message back for later redelivery (or dead-lettering).
// *retry.Service implements it.
type Retrier interface {
	// SendBack schedules m's next attempt, or dead-letters it after the
	// last one.
	SendBack(ctx context.Context, group string, m *core.StoredMessage, reason string) (retry.Outcome, error)
	// DeadLetter moves m straight to the group's dead-letter topic.
	DeadLetter(ctx context.Context, group string, m *core.StoredMessage, reason string) error
}

// Options configure a PushConsumer. A zero field means its default.
type Options struct {
	Group, ClientID string
	// Mode: group.Clustering (default) or group.Broadcast.
	Mode group.Mode
	From group.ConsumeFrom
	// FromTime is where From group.FromTimestamp starts.
	FromTime      time.Time
	Subscriptions []group.Subscription
	Listener      Listener
	// Orderly processes each queue one message at a time, in order.
	Orderly bool

	// ConsumeGoroutines bounds concurrent listener calls; default 16.
	ConsumeGoroutines int
	// PullBatch is the most messages one pull asks for; default 32.
	PullBatch int
	// MaxInflightPerQueue pauses pulling a queue with this many unfinished
	// messages (bounded memory); default 1,000.
	MaxInflightPerQueue int
	// HeartbeatInterval; default 1 s.
	HeartbeatInterval time.Duration
	// PollWait bounds each long poll; default 1 s.
	PollWait time.Duration
	// CommitInterval is the most time between commits while consuming;
	// default 200 ms. A queue also commits when it goes idle and on stop.
	CommitInterval time.Duration
	// SuspendTime is the pause before an in-place retry; default 1 s.
	SuspendTime time.Duration
	// MaxReconsume bounds in-place attempts (orderly, broadcast); default 16.
	MaxReconsume int
	// ConsumeTimeout: a listener call that takes longer counts as Retry;
	// default 15 min.
	ConsumeTimeout time.Duration
	Logger         *zerolog.Logger
}

func (o Options) withDefaults() Options {
	if o.Mode == "" {
		o.Mode = group.Clustering
	}
	if o.ConsumeGoroutines == 0 {
		o.ConsumeGoroutines = 16
	}
	if o.PullBatch == 0 {
		o.PullBatch = 32
	}
	if o.MaxInflightPerQueue == 0 {
		o.MaxInflightPerQueue = 1000
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = time.Second
	}
	if o.PollWait == 0 {
		o.PollWait = time.Second
	}
	if o.CommitInterval == 0 {
		o.CommitInterval = 200 * time.Millisecond
	}
	if o.SuspendTime == 0 {
		o.SuspendTime = time.Second
	}
	if o.MaxReconsume == 0 {
		o.MaxReconsume = 16
	}
	if o.ConsumeTimeout == 0 {
		o.ConsumeTimeout = 15 * time.Minute
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	if o.Group == "" || o.ClientID == "" {
		errs = append(errs, errors.New("group and client id are required"))
	}
	if o.Listener == nil {
		errs = append(errs, errors.New("a listener is required"))
	}
	if len(o.Subscriptions) == 0 {
		errs = append(errs, errors.New("at least one subscription is required"))
	}
	if o.Orderly && o.Mode == group.Broadcast {
		errs = append(errs, errors.New("orderly consumption needs clustering mode"))
	}
	if o.ConsumeGoroutines < 1 || o.PullBatch < 1 || o.MaxInflightPerQueue < o.PullBatch || o.MaxReconsume < 1 {
		errs = append(errs, errors.New("goroutines, batch, in-flight bound (≥ batch) and attempts must be positive"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("consumer: invalid options: %w", errors.Join(errs...))
	}
	return nil
}

// PushConsumer consumes a group's queues with a listener.
type PushConsumer struct {
	coord Coordinator
	retry Retrier
	opts  Options
	log   zerolog.Logger
	tasks chan task // messages for the listener goroutines

	// runCtx ends at Close (after draining) or abort; listeners run under
	// it, so a stopping queue worker does not cancel its in-flight work.
	runCtx    context.Context
	runCancel context.CancelFunc
	pullCtx   context.Context // ends when pulling must stop
	stopPull  context.CancelFunc

	mu      sync.Mutex
	workers map[group.QueueRef]*worker
	version uint64

	hbDone chan struct{}
	// kick asks the heartbeat goroutine for a heartbeat now: a worker
	// learnt that its queue was reassigned (another member joined or
	// left), and waiting for the next tick would leave the queue idle.
	kick      chan struct{}
	wg        sync.WaitGroup // workers and the heartbeat goroutine
	listeners sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// NewPushConsumer returns a consumer; Start it.
func NewPushConsumer(c Coordinator, r Retrier, opts Options) (*PushConsumer, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if r == nil && opts.Mode == group.Clustering {
		return nil, errors.New("consumer: clustering mode needs a retrier")
	}
	p := &PushConsumer{coord: c, retry: r, opts: opts, tasks: make(chan task, opts.ConsumeGoroutines), kick: make(chan struct{}, 1),
		workers: map[group.QueueRef]*worker{}, hbDone: make(chan struct{}),
		log: opts.Logger.With().Str("component", "consumer").Str("group", opts.Group).Str("client", opts.ClientID).Logger()}
	p.runCtx, p.runCancel = context.WithCancel(context.Background())
	p.pullCtx, p.stopPull = context.WithCancel(p.runCtx)
	return p, nil
}

// Start joins the group (the first heartbeat's error is returned) and
// starts consuming.
func (p *PushConsumer) Start(ctx context.Context) error {
	a, err := p.heartbeat(ctx)
	if err != nil {
		p.runCancel()
		return err
	}
	if !p.opts.Orderly {
		for i := 0; i < p.opts.ConsumeGoroutines; i++ {
			p.listeners.Add(1)
			go p.listenLoop()
		}
	}
	p.apply(a)
	p.wg.Add(1)
	go p.heartbeatLoop()
	return nil
}

// task is a run of messages of one queue for a listener goroutine, which
// handles them one after another. A pulled batch is cut into at most
// ConsumeGoroutines runs: as parallel as single-message tasks whenever
// there are idle listeners, without a hand-off per message.
type task struct {
	w    *worker
	gen  uint64
	msgs []*core.StoredMessage
}

// listenLoop is one of the ConsumeGoroutines listener goroutines of a
// concurrent consumer. It ends when the task channel is closed (Close,
// after every worker drained) or at abort.
func (p *PushConsumer) listenLoop() {
	defer p.listeners.Done()
	for {
		select {
		case t, ok := <-p.tasks:
			if !ok {
				return
			}
			for _, m := range t.msgs {
				if !t.w.consumeConcurrently(m) {
					break // aborted
				}
				t.w.complete(t.gen, m.QueueOffset)
			}
		case <-p.runCtx.Done():
			return
		}
	}
}

func (p *PushConsumer) heartbeat(ctx context.Context) (group.Assignment, error) {
	return p.coord.Heartbeat(ctx, group.HeartbeatRequest{Group: p.opts.Group, ClientID: p.opts.ClientID,
		Mode: p.opts.Mode, From: p.opts.From, FromTime: p.opts.FromTime, Subscriptions: p.opts.Subscriptions})
}

func (p *PushConsumer) heartbeatLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.opts.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-p.pullCtx.Done():
			return
		case <-t.C:
		case <-p.kick:
		}
		a, err := p.heartbeat(p.pullCtx)
		if err != nil {
			if p.pullCtx.Err() == nil {
				p.log.Warn().Err(err).Msg("heartbeat failed")
			}
			continue
		}
		p.apply(a)
	}
}

// rebalanceNow asks for a heartbeat without waiting for the next tick;
// requests made before it runs are one.
func (p *PushConsumer) rebalanceNow() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// apply starts workers for newly assigned queues and stops those for
// queues taken away.
func (p *PushConsumer) apply(a group.Assignment) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pullCtx.Err() != nil || (a.Version == p.version && len(p.workers) > 0 && p.holdsLocked(a.Queues)) {
		return
	}
	p.version = a.Version
	want := map[group.QueueRef]bool{}
	for _, ref := range a.Queues {
		want[ref] = true
		old := p.workers[ref]
		if old != nil && !old.stopping() {
			continue
		}
		// A worker still finishing this queue from an earlier assignment
		// hands over when it is done: never two workers on one queue.
		w := p.newWorker(ref, old)
		p.workers[ref] = w
		p.wg.Add(1)
		go w.run()
	}
	for ref, w := range p.workers {
		if !want[ref] && !w.stopping() {
			w.stop() // finishes, commits, releases, then exits
		}
	}
}

// holdsLocked reports whether the running workers are exactly those of
// queues. A version alone does not say: a coordinator that restarted counts
// its versions from 1 again, and the same number may assign other queues.
func (p *PushConsumer) holdsLocked(queues []group.QueueRef) bool {
	n := 0
	for _, w := range p.workers {
		if !w.stopping() {
			n++
		}
	}
	if n != len(queues) {
		return false
	}
	for _, ref := range queues {
		if w := p.workers[ref]; w == nil || w.stopping() {
			return false
		}
	}
	return true
}

// Close stops pulling, waits for running listeners until ctx ends, commits
// what finished, and leaves the group.
func (p *PushConsumer) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		p.stopPull()
		done := make(chan struct{})
		go func() { p.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			p.runCancel() // stop waiting for slow listeners
			<-done
		}
		close(p.tasks) // every worker has drained: no more sends
		p.listeners.Wait()
		p.runCancel()
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := p.coord.Leave(lctx, p.opts.Group, p.opts.ClientID); err != nil && !errors.Is(err, group.ErrUnknownMember) {
			p.closeErr = fmt.Errorf("leave group: %w", err)
		}
	})
	return p.closeErr
}

// abort stops everything at once without committing or leaving, as a crash
// would (the coordinator notices the missed heartbeats). Tests use it.
func (p *PushConsumer) abort() {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		for _, w := range p.workers {
			w.aborted.Store(true)
		}
		p.mu.Unlock()
		p.runCancel()
		p.wg.Wait()
		p.listeners.Wait()
	})
}
