package corebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/group"
)

// ReplayOptions configure RunReplay: a new consumer group replaying a
// topic from its earliest message — a lagging reader, in a process of its
// own. scripts/bench-isolation.sh runs it beside `bench tail`, as a
// backlog reader would run on a machine of its own: its client's work
// (receiving and decoding the backlog) is then not done in the tail
// client's process.
type ReplayOptions struct {
	// Addr is the core server, host:port; Token its token, if it wants one.
	Addr, Token string
	// Topic is replayed; it must hold messages.
	Topic string
	// Consumers of the group, each with its own connection (default 1).
	Consumers int
	// Duration bounds the replay (default: until it has the whole topic,
	// or ctx ends — which ends the replay, not as a failure).
	Duration time.Duration
	// Started, when set, gets one line at the first message.
	Started io.Writer
}

// ReplayResult is what RunReplay measured, from its first message on.
type ReplayResult struct {
	Topic string `json:"topic"`
	Group string `json:"group"`
	// Total is the topic's messages when the replay began.
	Total    int64   `json:"total"`
	Messages int64   `json:"messages"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	MBPerSec float64 `json:"mb_per_sec"`
	// Done: it received the whole topic.
	Done bool `json:"done"`
}

// RunReplay replays o.Topic with a new group until it has all of it, until
// o.Duration, or until ctx ends, and returns its rate.
func RunReplay(ctx context.Context, o ReplayOptions) (res ReplayResult, err error) {
	if o.Consumers == 0 {
		o.Consumers = 1
	}
	if o.Addr == "" || o.Topic == "" || o.Consumers < 0 || o.Duration < 0 {
		return res, errors.New("corebench: a replay needs a server address, a topic, and no negative count or duration")
	}
	run := fmt.Sprintf("replaybench-%d", time.Now().UnixNano())
	res.Topic, res.Group = o.Topic, run
	tr := &tailRun{o: TailOptions{Addr: o.Addr, Token: o.Token}, run: run}
	var closers []func(context.Context) error
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		for i := len(closers) - 1; i >= 0; i-- {
			err = errors.Join(err, closers[i](cctx))
		}
	}()
	admin, err := tr.dial(ctx, "admin")
	if err != nil {
		return res, err
	}
	closers = append(closers, func(context.Context) error { return admin.Close() })
	rp, err := newReplay(ctx, admin, o.Topic)
	if err != nil {
		return res, err
	}
	res.Total = rp.total
	if err := tr.startReplay(ctx, rp, run, "c", o.Consumers, &closers); err != nil {
		return res, err
	}
	if o.Started != nil {
		fmt.Fprintf(o.Started, "replaying %s: first message received\n", o.Topic)
	}
	var limit <-chan time.Time
	if o.Duration > 0 {
		t := time.NewTimer(o.Duration)
		defer t.Stop()
		limit = t.C
	}
	select {
	case <-rp.done:
		res.Done = true
	case <-limit:
	case <-ctx.Done():
	}
	end := time.Now()
	res.Messages, res.Bytes = rp.counts()
	res.Seconds = end.Sub(time.Unix(0, rp.firstAt.Load())).Seconds()
	if res.Seconds > 0 {
		res.MBPerSec = float64(res.Bytes) / res.Seconds / 1e6
	}
	return res, nil
}

// replay is a new consumer group replaying a topic from its earliest
// message (RunReplay's, and RunTail's backlog group): what it received,
// and when it had its first message and the whole topic.
type replay struct {
	topic string
	total int64 // the topic's messages when the replay began

	mu          sync.Mutex // guards msgs and bytes, read together
	msgs, bytes int64

	firstAt             atomic.Int64  // unix ns of the first message
	first, done         chan struct{} // closed at the first message, and when all came
	firstOnce, doneOnce sync.Once
}

// newReplay counts topic's messages; an empty or missing topic is an error.
func newReplay(ctx context.Context, admin *client.Client, topic string) (*replay, error) {
	info, err := admin.Topic(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("topic %s: %w", topic, err)
	}
	p := &replay{topic: topic, first: make(chan struct{}), done: make(chan struct{})}
	for _, q := range info.Ranges {
		p.total += q.Messages // not Max − Min: a queue's offsets need not be dense (the JetStream engine's are stream sequences)
	}
	if p.total == 0 {
		return nil, fmt.Errorf("topic %s is empty", topic)
	}
	return p, nil
}

// startReplay starts consumers consumers of a new group grp replaying p's
// topic from its earliest message, each on a connection of its own named
// conn and a number (their closers appended to closers), and waits for the
// first message.
func (r *tailRun) startReplay(ctx context.Context, p *replay, grp, conn string, consumers int, closers *[]func(context.Context) error) error {
	for i := range consumers {
		c, err := r.dial(ctx, fmt.Sprintf("%s%d", conn, i))
		if err != nil {
			return err
		}
		*closers = append(*closers, func(context.Context) error { return c.Close() })
		pc, err := r.consume(ctx, c, grp, p.topic, group.FromEarliest, p.received)
		if err != nil {
			return err
		}
		*closers = append(*closers, pc.Close)
	}
	select {
	case <-p.first:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("group %s received nothing of %s within 30 s", grp, p.topic)
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (p *replay) received(m *core.StoredMessage) {
	p.firstOnce.Do(func() { p.firstAt.Store(time.Now().UnixNano()); close(p.first) })
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bytes += int64(len(m.Body))
	if p.msgs++; p.msgs == p.total {
		p.doneOnce.Do(func() { close(p.done) })
	}
}

// counts returns the messages and bytes received so far (none for a nil
// replay).
func (p *replay) counts() (msgs, bytes int64) {
	if p == nil {
		return 0, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.msgs, p.bytes
}
