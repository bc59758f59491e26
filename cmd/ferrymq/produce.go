package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/wire"
)

// maxLineBytes bounds one stdin line of `produce -`: a frame's worth, more
// than any message the server accepts.
const maxLineBytes = wire.DefaultMaxFrame

// produceQueue bounds the sends waiting for their acknowledgement (beyond
// what the client itself keeps in flight).
const produceQueue = 4096

type produceOptions struct {
	client clientOptions
	topic  string
	key    string
	tag    string
	props  []string
	count  int
	size   int
	quiet  bool
	delay  string
	at     string
}

func (o *produceOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", "", "topic to send to (required)")
	f.StringVar(&o.key, "key", "", "sharding key: picks the queue, keeps per-key order, and is indexed (msg find --key)")
	f.StringVar(&o.tag, "tag", "", "tag consumers can filter on")
	f.StringArrayVar(&o.props, "prop", nil, "message property `NAME=VALUE` (repeatable)")
	f.IntVar(&o.count, "count", 1, "number of messages: BODY repeated, or generated bodies with --size")
	f.IntVar(&o.size, "size", 0, "generate bodies of this many `BYTES` instead of giving BODY")
	f.BoolVar(&o.quiet, "quiet", false, "do not print the message IDs")
	f.StringVar(&o.delay, "delay", "", "deliver the messages this long from now: a `DURATION` such as 90s, 36h or 7d12h (at most the server's longest delay, 40d by default)")
	f.StringVar(&o.at, "at", "", "deliver the messages at this RFC 3339 `TIME` (e.g. 2026-12-24T18:00:00Z)")
	_ = cmd.MarkFlagRequired("topic")
}

func newProduceCmd() *cobra.Command {
	o := &produceOptions{}
	cmd := &cobra.Command{
		Use:   "produce --topic T [flags] [BODY|-]",
		Short: "Send messages to a topic",
		Long: `Send messages to a topic and print their IDs, one per line, in input order.

The body is BODY; or, with "-", each line of stdin is one message; or, with
--size, --count bodies of that many bytes are generated. Sends are pipelined
(asynchronous, in order) and produce waits for every acknowledgement. It stops
at the first failure and exits non-zero if any message was not stored.`,
		Example: `  ferrymq produce --topic orders '{"id":1}'
  ferrymq produce --topic orders --key car-7 --tag created --prop source=cli '{"id":2}'
  tail -f events.log | ferrymq produce --topic events -
  ferrymq produce --topic bench --count 100000 --size 1024 --quiet
  ferrymq produce --topic reminders --key car-7 --delay 90s 'service due'
  ferrymq produce --topic reminders --at 2026-12-24T18:00:00Z 'merry christmas'`,
		Args: cobra.MaximumNArgs(1),
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

// message is the template every sent message copies.
func (o *produceOptions) message() (core.Message, error) {
	m := core.Message{Topic: o.topic, ShardingKey: o.key, Tag: o.tag}
	switch {
	case o.delay != "" && o.at != "":
		return m, errors.New("give --delay or --at, not both")
	case o.delay != "":
		d, err := parseDays(o.delay)
		if err != nil {
			return m, fmt.Errorf("--delay %q: %w", o.delay, err)
		}
		if d < 0 {
			return m, fmt.Errorf("--delay %q: must not be negative", o.delay)
		}
		m.DeliverAt = time.Now().Add(d)
	case o.at != "":
		t, err := time.Parse(time.RFC3339, o.at)
		if err != nil {
			return m, fmt.Errorf("--at %q: want an RFC 3339 time such as 2026-12-24T18:00:00Z", o.at)
		}
		m.DeliverAt = t
	}
	for _, p := range o.props {
		name, value, ok := strings.Cut(p, "=")
		if !ok || name == "" {
			return m, fmt.Errorf("--prop %q: want NAME=VALUE", p)
		}
		if m.Properties == nil {
			m.Properties = map[string]string{}
		}
		m.Properties[name] = value
	}
	return m, nil
}

// bodies yields message bodies in order; ok is false at the end. It ends
// early with ctx's error.
type bodies func(ctx context.Context) (body []byte, ok bool, err error)

// source picks where bodies come from; stop releases it.
func (o *produceOptions) source(cmd *cobra.Command, args []string) (next bodies, stop func(), err error) {
	countSet := cmd.Flags().Changed("count")
	sizeSet := cmd.Flags().Changed("size")
	if o.count < 1 {
		return nil, nil, fmt.Errorf("--count must be at least 1, got %d", o.count)
	}
	if o.size < 0 {
		return nil, nil, fmt.Errorf("--size must not be negative, got %d", o.size)
	}
	switch {
	case len(args) == 1 && args[0] == "-":
		if countSet || sizeSet {
			return nil, nil, errors.New("--count and --size do not apply to - (one message per stdin line)")
		}
		next, stop := lineBodies(cmd.InOrStdin())
		return next, stop, nil
	case len(args) == 1:
		if sizeSet {
			return nil, nil, errors.New("give either BODY or --size, not both")
		}
		body := []byte(args[0])
		return counted(o.count, func(int) []byte { return body }), func() {}, nil
	case sizeSet:
		return counted(o.count, func(i int) []byte { return generatedBody(i, o.size) }), func() {}, nil
	default:
		return nil, nil, errors.New("no message body: give BODY, - to read one message per stdin line, or --size BYTES to generate bodies")
	}
}

// counted yields n bodies made by body(i).
func counted(n int, body func(i int) []byte) bodies {
	i := 0
	return func(ctx context.Context) ([]byte, bool, error) {
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		if i >= n {
			return nil, false, nil
		}
		i++
		return body(i - 1), true, nil
	}
}

// generatedBody is size bytes of readable ASCII starting with the message's
// number: "17 abcdefgh…".
func generatedBody(i, size int) []byte {
	b := make([]byte, size)
	for j := range b {
		b[j] = 'a' + byte(j%26)
	}
	copy(b, strconv.Itoa(i+1)+" ")
	return b
}

// lineBodies yields the lines of r. A goroutine reads, so that an
// interrupt is noticed while stdin is quiet; stop ends it unless it is
// blocked reading (then it ends with the process or at r's EOF).
func lineBodies(r io.Reader) (bodies, func()) {
	lines := make(chan []byte)
	errc := make(chan error, 1)
	quit := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), maxLineBytes)
		for sc.Scan() {
			select {
			case lines <- bytes.Clone(sc.Bytes()):
			case <-quit:
				return
			}
		}
		errc <- sc.Err()
	}()
	next := func(ctx context.Context) ([]byte, bool, error) {
		select {
		case b, ok := <-lines:
			if ok {
				return b, true, nil
			}
			err := <-errc
			if errors.Is(err, bufio.ErrTooLong) {
				return nil, false, fmt.Errorf("read stdin: a line is longer than %d bytes", maxLineBytes)
			}
			if err != nil {
				return nil, false, fmt.Errorf("read stdin: %w", err)
			}
			return nil, false, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	return next, func() { close(quit) }
}

func (o *produceOptions) run(cmd *cobra.Command, args []string) error {
	tmpl, err := o.message()
	if err != nil {
		return err
	}
	next, stop, err := o.source(cmd, args)
	if err != nil {
		return err
	}
	defer stop()
	cl, err := o.client.dialCluster(cmd)
	if err != nil {
		return err
	}
	defer cl.Close()
	return o.send(cmd, cl, tmpl, next)
}

// asyncSender sends one message without waiting (client.Cluster, or a
// client.Producer).
type asyncSender interface {
	SendAsync(ctx context.Context, m *core.Message, done func(core.SendResult, error))
}

// sent is a send waiting for its acknowledgement.
type sent struct {
	seq      int // from 1
	deadline time.Time
	done     chan sendOutcome // buffered: the callback never blocks
}

type sendOutcome struct {
	res core.SendResult
	err error
}

// send sends every body asynchronously, in order, and prints the IDs in
// the same order as the acknowledgements come back. After the first
// failure it sends no more and waits for what is in flight.
func (o *produceOptions) send(cmd *cobra.Command, p asyncSender, tmpl core.Message, next bodies) error {
	// Sends already started finish even after an interrupt; cancelling
	// sendCtx (at the first failure) abandons those not yet written.
	sendCtx, cancelSend := context.WithCancel(context.WithoutCancel(cmd.Context()))
	defer cancelSend()
	queue := make(chan sent, produceQueue)
	summary := make(chan produceSummary, 1)
	go func() { summary <- o.collect(cmd.OutOrStdout(), queue, cancelSend) }()

	var inputErr error
	for seq := 1; sendCtx.Err() == nil; seq++ {
		body, ok, err := next(cmd.Context())
		if err != nil {
			inputErr = err
			break
		}
		if !ok {
			break
		}
		m := tmpl
		m.Body = body
		s := sent{seq: seq, deadline: time.Now().Add(o.client.timeout), done: make(chan sendOutcome, 1)}
		queue <- s
		p.SendAsync(sendCtx, &m, func(res core.SendResult, err error) { s.done <- sendOutcome{res, err} })
	}
	close(queue)
	sum := <-summary
	switch {
	case sum.firstErr != nil && sum.stored == 0 && sum.failed == 1:
		return sum.firstErr
	case sum.firstErr != nil:
		return fmt.Errorf("%d stored, %d failed; first failure, message %d: %w", sum.stored, sum.failed, sum.firstSeq, sum.firstErr)
	case sum.writeErr != nil:
		return fmt.Errorf("print message ids: %w (%d messages stored)", sum.writeErr, sum.stored)
	case errors.Is(inputErr, context.Canceled) && cmd.Context().Err() != nil:
		return fmt.Errorf("interrupted after %d messages", sum.stored)
	case inputErr != nil:
		return fmt.Errorf("%w (%d messages stored before)", inputErr, sum.stored)
	}
	return nil
}

type produceSummary struct {
	stored, failed int
	firstErr       error
	firstSeq       int
	writeErr       error
}

// collect waits for each send in order and prints its ID; at the first
// failure (to send, or to print) it calls abort.
func (o *produceOptions) collect(out io.Writer, queue <-chan sent, abort func()) produceSummary {
	var sum produceSummary
	w := bufio.NewWriter(out)
	for s := range queue {
		var r sendOutcome
		t := time.NewTimer(time.Until(s.deadline))
		select {
		case r = <-s.done:
		case <-t.C:
			r.err = fmt.Errorf("no acknowledgement within %s", o.client.timeout)
		}
		t.Stop()
		if r.err != nil {
			if sum.firstErr == nil {
				sum.firstErr, sum.firstSeq = r.err, s.seq
				abort()
			}
			sum.failed++
			continue
		}
		sum.stored++
		if o.quiet || sum.writeErr != nil {
			continue
		}
		_, err := fmt.Fprintln(w, r.res.ID)
		if err == nil && len(queue) == 0 {
			err = w.Flush() // nothing else ready: show what we have
		}
		if err != nil {
			sum.writeErr = err
			abort() // nobody would learn the IDs: stop sending
		}
	}
	if err := w.Flush(); err != nil && sum.writeErr == nil {
		sum.writeErr = err
	}
	return sum
}

// parseDays is time.ParseDuration with days: a leading "{n}d" (7d, 7d12h).
func parseDays(s string) (time.Duration, error) {
	neg := strings.HasPrefix(s, "-")
	rest := strings.TrimPrefix(s, "-")
	var days int64
	if i := strings.IndexByte(rest, 'd'); i > 0 {
		n, err := strconv.ParseInt(rest[:i], 10, 32)
		if err != nil {
			return 0, errors.New("want a duration such as 90s, 36h or 7d12h")
		}
		days, rest = n, rest[i+1:]
	}
	var d time.Duration
	if rest != "" || days == 0 {
		var err error
		if d, err = time.ParseDuration(rest); err != nil || d < 0 {
			return 0, errors.New("want a duration such as 90s, 36h or 7d12h")
		}
	}
	d += time.Duration(days) * 24 * time.Hour
	if neg {
		d = -d
	}
	return d, nil
}
