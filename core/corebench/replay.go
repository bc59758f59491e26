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
	info, err := admin.Topic(ctx, o.Topic)
	if err != nil {
		return res, fmt.Errorf("topic %s: %w", o.Topic, err)
	}
	for _, q := range info.Ranges {
		res.Total += q.Max - q.Min
	}
	if res.Total == 0 {
		return res, fmt.Errorf("topic %s is empty", o.Topic)
	}

	var (
		mu          sync.Mutex // guards the counts and stopped
		msgs, bytes int64
		stopped     bool         // counting ended: the result is taken
		firstAt     atomic.Int64 // unix ns of the first message
		firstOnce   sync.Once
		doneOnce    sync.Once
		first       = make(chan struct{})
		done        = make(chan struct{})
	)
	for i := range o.Consumers {
		c, err := tr.dial(ctx, fmt.Sprintf("c%d", i))
		if err != nil {
			return res, err
		}
		closers = append(closers, func(context.Context) error { return c.Close() })
		pc, err := tr.consume(ctx, c, run, o.Topic, group.FromEarliest, func(m *core.StoredMessage) {
			firstOnce.Do(func() { firstAt.Store(time.Now().UnixNano()); close(first) })
			mu.Lock()
			defer mu.Unlock()
			if stopped {
				return
			}
			bytes += int64(len(m.Body))
			if msgs++; msgs == res.Total {
				doneOnce.Do(func() { close(done) })
			}
		})
		if err != nil {
			return res, err
		}
		closers = append(closers, pc.Close)
	}
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		return res, errors.New("the replay received nothing within 30 s")
	case <-ctx.Done():
		return res, context.Cause(ctx)
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
	case <-done:
		res.Done = true
	case <-limit:
	case <-ctx.Done():
	}
	mu.Lock()
	end := time.Now()
	stopped = true
	res.Messages, res.Bytes = msgs, bytes
	mu.Unlock()
	res.Seconds = end.Sub(time.Unix(0, firstAt.Load())).Seconds()
	if res.Seconds > 0 {
		res.MBPerSec = float64(res.Bytes) / res.Seconds / 1e6
	}
	return res, nil
}
