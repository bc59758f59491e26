package pop

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/gate"
	"github.com/ferrymq/ferrymq/core/retry"
)

// ReasonExpired is the retry reason (retry.PropReason) of a message whose
// invisible time ran out.
const ReasonExpired = "invisible time expired"

// Log field names.
const (
	fieldGroup   = "group"
	fieldTopic   = "topic"
	fieldQueue   = "queue"
	fieldOffset  = "offset"
	fieldAttempt = "attempt"
	fieldOutcome = "outcome"
	fieldMin     = "min_offset"
)

// Request asks Pop for messages.
type Request struct {
	// Group is the consumer group (retry.ValidateGroup).
	Group string
	// Topic must exist.
	Topic string
	// Max bounds the messages returned; 0 means Options.MaxPop, and more
	// than Options.MaxPop is cut to it.
	Max int
	// Invisible is how long the messages stay hidden from other poppers
	// unless acknowledged; 0 means Options.DefaultInvisible, otherwise it
	// must lie in [Options.MinInvisible, Options.MaxInvisible].
	Invisible time.Duration
	// Wait bounds a long poll: when nothing is available Pop waits up to
	// Wait for messages to arrive. 0 returns at once.
	Wait time.Duration
	// Orderly keeps per-queue order: a queue with a message in flight hands
	// out nothing else, and an expired message is handed out again in place.
	Orderly bool
	// Tags, when non-empty, hands out only messages with one of these tags;
	// the others count as consumed by the group.
	Tags []string
	// MaxBytes bounds the stored size (core.StoredMessage.Size) of the
	// messages returned together; 0 means DefaultMaxBytes. The first
	// message is handed out whatever its size, so one of the largest
	// messages still comes, alone.
	MaxBytes int
}

// DefaultMaxBytes is Request.MaxBytes's default: 4 MiB, as a core read's
// (core.ReadRequest), so that an answer of several messages of up to 4 MiB
// (core.MaxBodyBytes) still fits one wire frame (wire.DefaultMaxFrame).
const DefaultMaxBytes = 4 << 20

// Popped is one message handed out.
type Popped struct {
	// Message is the stored message. Its ReconsumeCount is Attempt-1.
	// Messages redelivered after a failure (not orderly) come from the
	// group's retry topic: Message.Topic is retry.RetryTopic(group) and the
	// retry.PropOriginTopic property names the original.
	Message *core.StoredMessage
	// Handle acknowledges the message or changes its invisible time.
	Handle string
	// Attempt is 1 on the first delivery and grows by one per redelivery.
	Attempt int
	// VisibleAt is the invisibility deadline: the handle works until then.
	VisibleAt time.Time
}

// Service hands out messages to poppers. It is safe for concurrent use.
type Service struct {
	b    core.Broker
	gate *gate.Gate // epoch barriers of resized topics
	r    *retry.Service
	opts Options
	log  zerolog.Logger
	sign *signer
	gen  atomic.Uint64 // hand-out generations
	rr   atomic.Uint32 // rotates the queue Pop starts at

	// waiting counts long polls that are waiting (for tests).
	waiting atomic.Int32

	// mu guards queues. Lock order: mu; then queueState.mu; then heapMu.
	mu     sync.Mutex
	queues map[queueKey]*queueState

	// heapMu guards deadlines and every entry's deadline and idx.
	heapMu    sync.Mutex
	deadlines deadlineHeap
	// wake tells the reviver the earliest deadline moved earlier.
	wake chan struct{}

	// availMu guards avail, closed and replaced when a queue unlocks or an
	// orderly message becomes ready again: long polls wait on it.
	availMu sync.Mutex
	avail   chan struct{}

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	startOnce sync.Once
	closeOnce sync.Once
	closed    atomic.Bool
}

// New checks opts and returns a Service over b that sends failed messages
// back through r. Call Start to have expired messages handled.
func New(b core.Broker, r *retry.Service, opts Options) (*Service, error) {
	if b == nil || r == nil {
		return nil, fmt.Errorf("%w: nil broker or retry service", ErrBadOptions)
	}
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("draw handle secret: %w", err)
	}
	s := &Service{
		b:      b,
		gate:   gate.New(b),
		r:      r,
		opts:   opts,
		log:    opts.Logger.With().Str("component", "pop").Logger(),
		sign:   newSigner(secret),
		queues: map[queueKey]*queueState{},
		wake:   make(chan struct{}, 1),
		avail:  make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Start starts the reviver, the goroutine that handles messages whose
// invisible time ran out. Calls after the first do nothing.
func (s *Service) Start() {
	s.startOnce.Do(func() {
		s.wg.Go(func() { s.revive(s.ctx) })
	})
}

// Close stops the reviver and returns once it has ended; long polls return
// core.ErrClosed, as does every later call. In-flight state is dropped: the
// next Service delivers unacknowledged messages again. It is idempotent and
// never fails.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.startOnce.Do(func() {})
		s.cancel()
		s.wg.Wait()
	})
	return nil
}

// Pop hands out up to req.Max messages of req.Topic and of the group's
// retry topic, each hidden from other poppers for the invisible time. With
// req.Wait it long-polls until a message is available, req.Wait passes or
// ctx is done (an empty result is not an error).
func (s *Service) Pop(ctx context.Context, req Request) ([]Popped, error) {
	if s.closed.Load() {
		return nil, core.ErrClosed
	}
	if err := retry.ValidateGroup(req.Group); err != nil {
		return nil, err
	}
	if req.Max < 0 || req.Wait < 0 {
		return nil, fmt.Errorf("%w: max %d, wait %v", ErrInvalidRequest, req.Max, req.Wait)
	}
	n := req.Max
	if n == 0 {
		n = s.opts.MaxPop
	}
	n = min(n, s.opts.MaxPop)
	invisible := req.Invisible
	if invisible == 0 {
		invisible = s.opts.DefaultInvisible
	}
	if err := s.checkInvisible(invisible); err != nil {
		return nil, err
	}

	var timer *time.Timer
	for {
		// Take both channels before looking, so nothing that becomes
		// available while we look is missed.
		arrivals, avail := s.b.Arrivals(""), s.available()
		out, err := s.popOnce(ctx, req, n, invisible)
		if err != nil || len(out) > 0 || req.Wait == 0 {
			return out, err
		}
		if timer == nil {
			timer = time.NewTimer(req.Wait)
			defer timer.Stop()
		}
		s.waiting.Add(1)
		select {
		case <-arrivals:
		case <-avail:
		case <-timer.C:
			s.waiting.Add(-1)
			return s.popOnce(ctx, req, n, invisible)
		case <-ctx.Done():
			s.waiting.Add(-1)
			return nil, fmt.Errorf("pop %s: %w", req.Topic, ctx.Err())
		case <-s.ctx.Done():
			s.waiting.Add(-1)
			return nil, core.ErrClosed
		}
		s.waiting.Add(-1)
	}
}

func (s *Service) checkInvisible(d time.Duration) error {
	if d < s.opts.MinInvisible || d > s.opts.MaxInvisible {
		return fmt.Errorf("%w: %v outside [%v, %v]", ErrInvisibleTime, d, s.opts.MinInvisible, s.opts.MaxInvisible)
	}
	return nil
}

// source is one queue Pop may take from.
type source struct {
	topic string
	queue int
	max   int64 // the queue's max offset when Pop looked
}

// popOnce looks at every queue of the topic (and, unless orderly, of the
// group's retry topic) once, starting at a rotating one.
func (s *Service) popOnce(ctx context.Context, req Request, n int, invisible time.Duration) ([]Popped, error) {
	info, err := s.b.Topic(ctx, req.Topic)
	if err != nil {
		return nil, fmt.Errorf("pop %s: %w", req.Topic, err)
	}
	srcs := make([]source, 0, len(info.Ranges)+1)
	for q, r := range info.Ranges {
		srcs = append(srcs, source{topic: req.Topic, queue: q, max: r.Max})
	}
	if rt := retry.RetryTopic(req.Group); !req.Orderly && rt != req.Topic {
		ri, err := s.b.Topic(ctx, rt)
		switch {
		case err == nil:
			for q, r := range ri.Ranges {
				srcs = append(srcs, source{topic: rt, queue: q, max: r.Max})
			}
		case !errors.Is(err, core.ErrTopicNotFound):
			return nil, fmt.Errorf("pop %s: %w", rt, err)
		}
	}
	if len(srcs) == 0 {
		return nil, nil
	}
	start := int(s.rr.Add(1) % uint32(len(srcs)))
	var out []Popped
	var firstErr error
	room := req.MaxBytes
	if room <= 0 {
		room = DefaultMaxBytes
	}
	for i := range srcs {
		if len(out) >= n || len(out) > 0 && room <= 0 {
			break
		}
		src := srcs[(start+i)%len(srcs)]
		q := s.queue(queueKey{group: req.Group, topic: src.topic, queue: src.queue})
		got, err := s.take(ctx, q, req, n-len(out), invisible, src.max, &room, len(out) == 0)
		out = append(out, got...)
		if err != nil {
			if errors.Is(err, core.ErrClosed) || ctx.Err() != nil {
				firstErr = err
				break
			}
			s.log.Error().Err(err).Str(fieldGroup, req.Group).Str(fieldTopic, src.topic).Int(fieldQueue, src.queue).Msg("pop from queue")
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if len(out) > 0 {
		s.traceDelivered(req, out)
		return out, nil // handed out: they must reach the caller
	}
	return nil, firstErr
}

// Ack marks the message of a handle consumed. It fails with
// ErrInvalidHandle for a handle this Service did not issue and with
// ErrHandleExpired once the handle's deadline has passed, it was replaced,
// or the message was already acknowledged; then it has no effect.
func (s *Service) Ack(ctx context.Context, text string) error {
	if s.closed.Load() {
		return core.ErrClosed
	}
	h, q, now, err := s.resolve(text)
	if err != nil {
		return err
	}
	q.mu.Lock()
	traceID, err := s.ackLocked(ctx, q, h, now)
	q.mu.Unlock()
	if err == nil && !traceID.IsZero() {
		s.traceAcked(h, traceID)
	}
	return err
}

// ackLocked marks the message of h done and returns the ID it is traced
// under (zero when its hand-out was not traced).
func (s *Service) ackLocked(ctx context.Context, q *queueState, h handle, now time.Time) (core.MessageID, error) {
	e, err := q.liveLocked(h)
	if err != nil {
		return core.MessageID{}, err
	}
	s.heapMu.Lock()
	if e.idx < 0 || !now.Before(e.deadline) {
		s.heapMu.Unlock()
		return core.MessageID{}, fmt.Errorf("%w: deadline passed", ErrHandleExpired)
	}
	s.deadlines.remove(e)
	s.heapMu.Unlock()
	full := s.fullLocked(q)
	q.doneLocked(e)
	s.advanceLocked(ctx, q)
	if full || (e.orderly && q.invisible == 0) {
		s.signal()
	}
	return e.traceID, nil
}

// ChangeInvisibleTime hides the message of a handle for d from now on and
// returns a new handle for it; the old one stops working. Errors as for Ack,
// plus ErrInvisibleTime for d outside [MinInvisible, MaxInvisible].
func (s *Service) ChangeInvisibleTime(ctx context.Context, text string, d time.Duration) (string, error) {
	if s.closed.Load() {
		return "", core.ErrClosed
	}
	if err := s.checkInvisible(d); err != nil {
		return "", err
	}
	h, q, now, err := s.resolve(text)
	if err != nil {
		return "", err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	e, err := q.liveLocked(h)
	if err != nil {
		return "", err
	}
	deadline := now.Add(d)
	s.heapMu.Lock()
	if e.idx < 0 || !now.Before(e.deadline) {
		s.heapMu.Unlock()
		return "", fmt.Errorf("%w: deadline passed", ErrHandleExpired)
	}
	s.deadlines.move(e, deadline)
	top := e.idx == 0
	s.heapMu.Unlock()
	if top {
		s.kick()
	}
	e.gen = s.gen.Add(1)
	h.gen, h.deadline = e.gen, deadline.UnixNano()
	return s.sign.encode(h), nil
}

// resolve authenticates a handle and finds its queue.
func (s *Service) resolve(text string) (handle, *queueState, time.Time, error) {
	h, err := s.sign.decode(text)
	if err != nil {
		return h, nil, time.Time{}, err
	}
	now := s.opts.Now()
	if h.expiredAt(now) {
		return h, nil, now, fmt.Errorf("%w: deadline %v passed", ErrHandleExpired, time.Unix(0, h.deadline).UTC())
	}
	s.mu.Lock()
	q := s.queues[queueKey{group: h.group, topic: h.topic, queue: h.queue}]
	s.mu.Unlock()
	if q == nil {
		return h, nil, now, fmt.Errorf("%w: queue %s/%d not in use", ErrHandleExpired, h.topic, h.queue)
	}
	return h, q, now, nil
}

// queue returns the state of one (group, topic, queue), creating it.
func (s *Service) queue(k queueKey) *queueState {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[k]
	if q == nil {
		q = &queueState{key: k, inflight: map[int64]*entry{}}
		s.queues[k] = q
	}
	return q
}

// available returns a channel closed when a queue unlocks or an orderly
// message becomes ready again.
func (s *Service) available() <-chan struct{} {
	s.availMu.Lock()
	defer s.availMu.Unlock()
	return s.avail
}

func (s *Service) signal() {
	s.availMu.Lock()
	close(s.avail)
	s.avail = make(chan struct{})
	s.availMu.Unlock()
}

// kick tells the reviver to look at the deadlines again.
func (s *Service) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
