package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/wire"
)

const (
	// popWait is the long poll of one POP receive.
	popWait = time.Second
	// maxPullBatch bounds the messages one pull or receive asks for.
	maxPullBatch = 32
	// countPollWait is the push consumer's long poll with --count: short,
	// so that queues commit soon after the last message was printed.
	countPollWait = 250 * time.Millisecond
	// commitWait bounds the wait, at --count, for the group's committed
	// offsets to cover every printed message.
	commitWait = 3 * time.Second
	// lagPoll is how often that wait asks for the group's offsets.
	lagPoll = 20 * time.Millisecond
)

type consumeOptions struct {
	client    clientOptions
	topic     string
	group     string
	tags      []string
	broadcast bool
	orderly   bool
	pop       bool
	from      string
	count     int
	idle      time.Duration
	json      bool
	clientID  string
	heartbeat time.Duration
}

func (o *consumeOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", "", "topic to consume (required)")
	f.StringVar(&o.group, "group", "", "consumer group (required)")
	f.StringArrayVar(&o.tags, "tag", nil, "only messages with this `TAG` (repeatable; filtered by the server)")
	f.BoolVar(&o.broadcast, "broadcast", false, "broadcast mode: this member gets every message (default: clustering, members share the queues)")
	f.BoolVar(&o.orderly, "orderly", false, "one message of a queue at a time, in queue order")
	f.BoolVar(&o.pop, "pop", false, "consume by POP: the server hands out messages, each acknowledged after it is printed")
	f.StringVar(&o.from, "from", "earliest", "where a new group starts: earliest or latest; an RFC 3339 `TIME` first resets the group's offsets on the topic to that time")
	f.IntVar(&o.count, "count", 0, "exit after printing this many messages (0: no limit)")
	f.DurationVar(&o.idle, "idle-timeout", 0, "exit when no message arrived for this long (0: wait forever)")
	f.BoolVar(&o.json, "json", false, "print one JSON object per message (keys: id, topic, queue, offset, key, tags, props, body, born_at, stored_at, reconsume)")
	f.StringVar(&o.clientID, "client-id", "", "member ID in the group (push consumers; default: generated). Broadcast progress is kept per member ID")
	f.DurationVar(&o.heartbeat, "heartbeat-interval", time.Second, "push consumers: how often to heartbeat the group; keep it well under the server's member timeout (3 s by default)")
	_ = cmd.MarkFlagRequired("topic")
	_ = cmd.MarkFlagRequired("group")
}

func newConsumeCmd() *cobra.Command {
	o := &consumeOptions{}
	cmd := &cobra.Command{
		Use:   "consume --topic T --group G [flags]",
		Short: "Consume a topic as a member of a consumer group and print the messages",
		Long: `Consume a topic as a member of a consumer group and print each message: one
line for people, or one JSON object per line with --json.

By default this is a push consumer in clustering mode (the group's members
share the queues); --broadcast gives this member every message, --orderly
delivers each queue's messages one at a time in order, and --pop consumes by
POP instead (receive, print, acknowledge). consume runs until --count
messages were printed, no message arrived for --idle-timeout, or it is
interrupted; then it commits its progress and leaves the group. The topic
need not exist yet: consume waits for it.

Messages the consumer had already fetched beyond --count are neither printed
nor committed: the group's next consumer gets them. At --count, consume waits
(up to 3 s) for the group's offsets to cover every printed message before it
leaves the group.`,
		Example: `  ferrymq consume --topic orders --group billing
  ferrymq consume --topic orders --group billing --json --count 10
  ferrymq consume --topic orders --group audit --broadcast --client-id audit-1
  ferrymq consume --topic orders --group billing --orderly --idle-timeout 5s
  ferrymq consume --topic orders --group billing --pop --count 100
  ferrymq consume --topic orders --group replay --from 2024-05-01T00:00:00Z`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

// validate checks the flags without a server.
func (o *consumeOptions) validate() (position, error) {
	var errs []error
	if o.broadcast && o.orderly {
		errs = append(errs, errors.New("--orderly needs clustering mode: drop --broadcast"))
	}
	if o.pop && o.broadcast {
		errs = append(errs, errors.New("--pop and --broadcast do not mix: POP consumers of a group share its messages"))
	}
	if o.count < 0 {
		errs = append(errs, fmt.Errorf("--count must not be negative, got %d", o.count))
	}
	if o.idle < 0 {
		errs = append(errs, fmt.Errorf("--idle-timeout must not be negative, got %s", o.idle))
	}
	if o.heartbeat <= 0 {
		errs = append(errs, fmt.Errorf("--heartbeat-interval must be positive, got %s", o.heartbeat))
	}
	pos, err := parsePosition("--from", o.from)
	if err != nil {
		errs = append(errs, err)
	} else if o.pop && pos.latest {
		errs = append(errs, errors.New("--from latest does not apply to --pop (a new POP group starts at the earliest message); use --from TIME or `group reset --to latest`"))
	}
	return pos, errors.Join(errs...)
}

func (o *consumeOptions) run(cmd *cobra.Command, _ []string) error {
	pos, err := o.validate()
	if err != nil {
		return err
	}
	c, err := o.client.dial(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	if !pos.at.IsZero() {
		ctx, cancel := context.WithTimeout(cmd.Context(), o.client.timeout)
		_, err := c.ResetOffsets(ctx, o.group, o.topic, pos.at, false)
		cancel()
		if err != nil {
			return fmt.Errorf("reset offsets of %s on %s: %w", o.group, o.topic, err)
		}
	}
	retryTopic := group.RetryTopic(o.group)
	if o.broadcast {
		retryTopic = "" // broadcast groups do not redeliver through it
	}
	pr := newPrinter(cmd.OutOrStdout(), o.json, o.count, retryTopic)
	if o.pop {
		return o.runPop(cmd, c, pr)
	}
	return o.runPush(cmd, c, pr, pos)
}

func (o *consumeOptions) runPush(cmd *cobra.Command, c *client.Client, pr *printer, pos position) error {
	log, err := o.client.logger(cmd)
	if err != nil {
		return err
	}
	member := o.clientID
	if member == "" {
		member = c.ClientID() // what NewPushConsumer picks
	}
	opts := consumer.Options{
		Group:         o.group,
		ClientID:      member,
		Mode:          group.Clustering,
		From:          group.FromEarliest,
		Subscriptions: []group.Subscription{{Topic: o.topic, Tags: o.tags}},
		Orderly:       o.orderly,
		// One listener goroutine: output keeps each queue's order (printing
		// is the bottleneck anyway), and everything printed from a queue
		// precedes, in offset order, what is held back at --count.
		ConsumeGoroutines: 1,
		PullBatch:         maxPullBatch,
		HeartbeatInterval: o.heartbeat,
		Logger:            &log,
	}
	if o.count > 0 {
		opts.PullBatch = min(o.count, maxPullBatch) // fetch little beyond --count
		opts.PollWait = countPollWait
	}
	if o.broadcast {
		opts.Mode = group.Broadcast
	}
	if pos.latest {
		opts.From = group.FromLatest
	}
	if o.orderly {
		// An orderly queue holding a message back at --count is stuck in
		// its listener and commits nothing more: commit after every
		// message, before the next one of the queue is delivered.
		opts.CommitInterval = time.Nanosecond
	}
	// A message past --count (or after output failed) is held: the
	// listener returns only when Close gives up on it, so it is neither
	// printed nor committed. (Returning Retry would send it through the
	// retry path with a delay, or drop it in broadcast mode.)
	var held atomic.Bool
	heldCh := make(chan struct{})
	opts.Listener = func(ctx context.Context, m *core.StoredMessage) consumer.Result {
		if pr.print(m) {
			return consumer.Success
		}
		if held.CompareAndSwap(false, true) {
			close(heldCh)
		}
		<-ctx.Done()
		return consumer.Retry
	}

	pc, err := c.NewPushConsumer(opts)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(cmd.Context(), o.client.timeout)
	err = pc.Start(sctx)
	cancel()
	if err != nil {
		return fmt.Errorf("join group %s: %w", o.group, err)
	}
	waitErr := o.wait(cmd.Context(), pr)
	if waitErr == nil && pr.full() {
		// Held messages keep their queues from committing at Close, so
		// let the running consumer commit what was printed first.
		lagMember := ""
		if o.broadcast {
			lagMember = member
		}
		if !awaitCommitted(cmd.Context(), c, o.group, lagMember, pr.positions()) {
			log.Warn().Msg("offsets of printed messages not confirmed committed; they may be delivered again")
		}
	}

	// Close under a fresh context: an interrupt must not cut the commit.
	// Once a message is held, Close need not wait for it: give up at once.
	cctx, cancelClose := context.WithTimeout(context.WithoutCancel(cmd.Context()), o.client.timeout)
	defer cancelClose()
	var wg sync.WaitGroup
	closed := make(chan struct{})
	wg.Go(func() {
		select {
		case <-heldCh:
			cancelClose()
		case <-closed:
		}
	})
	closeErr := pc.Close(cctx)
	close(closed)
	wg.Wait()
	if waitErr != nil {
		return waitErr
	}
	if closeErr != nil {
		return fmt.Errorf("close consumer: %w", closeErr)
	}
	return nil
}

// awaitCommitted polls the group's lag until the committed offset of every
// queue in next is at least its value, or ctx ends or commitWait passes. It
// reports whether they were.
func awaitCommitted(ctx context.Context, c *client.Client, grp, member string, next map[wire.QueueRef]int64) bool {
	ctx, cancel := context.WithTimeout(ctx, commitWait)
	defer cancel()
	for {
		lags, err := c.Lag(ctx, grp, member)
		if err == nil {
			committed := map[wire.QueueRef]int64{}
			for _, l := range lags {
				committed[wire.QueueRef{Topic: l.Topic, Queue: l.Queue}] = l.Committed
			}
			done := true
			for ref, off := range next {
				if got, ok := committed[ref]; !ok || got < off {
					done = false
					break
				}
			}
			if done {
				return true
			}
		}
		pause(ctx, lagPoll)
		if ctx.Err() != nil {
			return false
		}
	}
}

// wait returns when the printer is done (--count, or output failed), no
// message arrived for --idle-timeout, or ctx ends.
func (o *consumeOptions) wait(ctx context.Context, pr *printer) error {
	var idle <-chan time.Time
	var t *time.Timer
	if o.idle > 0 {
		t = time.NewTimer(o.idle)
		defer t.Stop()
		idle = t.C
	}
	for {
		select {
		case <-pr.done:
			return pr.failure()
		case <-pr.arrived:
			if t != nil {
				t.Reset(o.idle)
			}
		case <-idle:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

func (o *consumeOptions) runPop(cmd *cobra.Command, c *client.Client, pr *printer) error {
	log, err := o.client.logger(cmd)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	sc := c.NewSimpleConsumer(o.group, o.topic)
	sc.Orderly = o.orderly
	sc.Tags = o.tags
	last := time.Now()
	for {
		select {
		case <-pr.done:
			return pr.failure()
		default:
		}
		max := maxPullBatch
		if o.count > 0 {
			max = min(max, o.count-pr.printed())
		}
		wait := popWait
		if o.idle > 0 {
			left := o.idle - time.Since(last)
			if left <= 0 {
				return nil
			}
			wait = min(wait, left)
		}
		msgs, err := sc.Receive(ctx, max, wait)
		if ctx.Err() != nil {
			return nil // interrupted; what was received is not acknowledged and comes back
		}
		switch {
		case errors.Is(err, core.ErrTopicNotFound):
			// Like a push consumer, wait for the topic to be created.
			log.Debug().Err(err).Msg("topic does not exist yet")
			pause(ctx, wait)
			continue
		case err != nil && transient(err):
			log.Warn().Err(err).Msg("receive failed; retrying")
			pause(ctx, popWait/4)
			continue
		case err != nil:
			return fmt.Errorf("receive: %w", err)
		}
		if len(msgs) > 0 {
			last = time.Now()
		}
		for _, m := range msgs {
			if !pr.print(m.StoredMessage) {
				return pr.failure()
			}
			// Acknowledge under a fresh context: an interrupt now must not
			// turn a printed message into a redelivered one.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.client.timeout)
			err := sc.Ack(actx, m.Handle)
			cancel()
			if err != nil {
				return fmt.Errorf("ack %s: %w", m.ID, err)
			}
		}
	}
}

// transient reports whether a request may succeed if tried again.
func transient(err error) bool {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Retryable()
	}
	return errors.Is(err, client.ErrConnLost)
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// printer prints messages, at most limit of them (0: no limit), from any
// number of goroutines; lines never interleave.
type printer struct {
	w     io.Writer
	json  bool
	limit int

	arrived chan struct{} // a message was printed (capacity 1)
	done    chan struct{} // closed at the limit or after a write error

	// retryTopic is the group's retry topic, where redelivered messages
	// are read from (they are shown under their first topic).
	retryTopic string

	mu   sync.Mutex
	n    int
	err  error
	next map[wire.QueueRef]int64 // per queue read from: the offset after the last printed message
}

func newPrinter(w io.Writer, json bool, limit int, retryTopic string) *printer {
	return &printer{w: w, json: json, limit: limit, retryTopic: retryTopic, arrived: make(chan struct{}, 1),
		done: make(chan struct{}), next: map[wire.QueueRef]int64{}}
}

// print prints m and reports true, or reports false if the limit was
// already reached or output failed.
func (p *printer) print(m *core.StoredMessage) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil || (p.limit > 0 && p.n >= p.limit) {
		return false
	}
	var err error
	if p.json {
		err = writeJSONLine(p.w, newMessageRecord(m))
	} else {
		_, err = fmt.Fprintln(p.w, messageLine(m))
	}
	if err != nil {
		p.err = fmt.Errorf("print message: %w", err)
		close(p.done)
		return false
	}
	p.n++
	ref := p.readFrom(m)
	p.next[ref] = max(p.next[ref], m.QueueOffset+1)
	if p.n == p.limit {
		close(p.done)
	}
	select {
	case p.arrived <- struct{}{}:
	default:
	}
	return true
}

// readFrom is the queue m was read from: a redelivered message is shown
// under the topic it was first produced to (the origin property names it,
// and its reconsume count is positive), but read from the retry topic.
func (p *printer) readFrom(m *core.StoredMessage) wire.QueueRef {
	if origin := m.Properties[retry.PropOriginTopic]; p.retryTopic != "" && origin != "" && origin == m.Topic && m.ReconsumeCount > 0 {
		return wire.QueueRef{Topic: p.retryTopic, Queue: m.Queue}
	}
	return wire.QueueRef{Topic: m.Topic, Queue: m.Queue}
}

// full reports whether the limit was reached.
func (p *printer) full() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.limit > 0 && p.n >= p.limit
}

// positions returns, per queue read from, the offset after the last
// printed message.
func (p *printer) positions() map[wire.QueueRef]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.next)
}

func (p *printer) printed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *printer) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}
