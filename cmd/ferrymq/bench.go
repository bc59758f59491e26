package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// Targets and modes of `ferrymq bench core`.
const (
	targetFerryMQ   = "ferrymq"
	targetJetStream = "jetstream"
	modeProduce     = "produce"
	modeConsume     = "consume"
)

// benchOptions are the flags of `ferrymq bench core`.
type benchOptions struct {
	target    string
	server    string
	token     string
	mode      string
	producers int
	consumers int
	pipeline  int
	size      int
	count     int64
	duration  time.Duration
	timeout   time.Duration
	topic     string
	queues    int
	keys      int
	label     string
	skipFill  bool
	ordered   bool
	json      bool

	countSet bool // --count given: with --duration, whichever comes first
}

func (o *benchOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.target, "target", targetFerryMQ, "system under test: ferrymq (core TCP protocol) or jetstream (NATS JetStream)")
	f.StringVar(&o.server, "server", "", "server address (default 127.0.0.1:10911 for ferrymq, 127.0.0.1:4222 for jetstream)")
	f.StringVar(&o.token, "token", "", "ferrymq core token (default: none); also read from FERRYMQ_TOKEN")
	f.StringVar(&o.mode, "mode", modeProduce, "produce (timed sends, latency from send to ack) or consume (a backlog, with acks/commits)")
	f.IntVar(&o.producers, "producers", 16, "producers, each with its own connection")
	f.IntVar(&o.consumers, "consumers", 4, "consumers in consume mode, each with its own connection (one consumer group or durable)")
	f.IntVar(&o.pipeline, "pipeline", 64, "messages in flight per producer (1: one at a time)")
	f.IntVar(&o.size, "size", 1024, "payload size in bytes")
	f.Int64Var(&o.count, "count", 200_000, "messages in all (consume mode: the backlog produced first and consumed)")
	f.DurationVar(&o.duration, "duration", 0, "produce for this long instead of --count; consume: stop after this long")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "abort a run that takes longer")
	f.StringVar(&o.topic, "topic", "bench", "ferrymq topic; for jetstream the stream name, with subjects <topic>.*")
	f.IntVar(&o.queues, "queues", 8, "queues of the ferrymq topic when the bench creates it")
	f.IntVar(&o.keys, "keys", 0, "distinct sharding keys (jetstream: subjects) cycled through; 0: none (ferrymq spreads round-robin)")
	f.StringVar(&o.label, "label", "", `durability or setup named in the result row, e.g. "async", "sync", "sync_interval=always"`)
	f.BoolVar(&o.ordered, "ordered", false, "consume mode: per-key order (ferrymq: orderly consumers, one message of a queue at a time; jetstream: one durable per consumer over its share of the subjects) and count deliveries out of store order")
	f.BoolVar(&o.skipFill, "skip-fill", false, "consume mode: consume what is stored already instead of producing --count messages first")
	f.BoolVar(&o.json, "json", false, "print the result row as one JSON line instead of a table")
}

func (o *benchOptions) withDefaults(cmd *cobra.Command) {
	if o.server == "" {
		o.server = "127.0.0.1:10911"
		if o.target == targetJetStream {
			o.server = "127.0.0.1:4222"
		}
	}
	if o.token == "" {
		o.token = getenv("FERRYMQ_TOKEN")
	}
	o.countSet = cmd.Flags().Changed("count")
}

func (o *benchOptions) validate() error {
	var errs []error
	if o.target != targetFerryMQ && o.target != targetJetStream {
		errs = append(errs, fmt.Errorf("unknown target %q (ferrymq or jetstream)", o.target))
	}
	if o.mode != modeProduce && o.mode != modeConsume {
		errs = append(errs, fmt.Errorf("unknown mode %q (produce or consume)", o.mode))
	}
	if o.producers < 1 || o.consumers < 1 || o.pipeline < 1 {
		errs = append(errs, errors.New("--producers, --consumers and --pipeline must be at least 1"))
	}
	if o.size < 0 || o.size > 4<<20 {
		errs = append(errs, errors.New("--size must be 0 … 4 MiB"))
	}
	if o.count < 1 {
		errs = append(errs, errors.New("--count must be at least 1"))
	}
	if o.duration < 0 || o.timeout <= 0 {
		errs = append(errs, errors.New("--duration must not be negative and --timeout must be positive"))
	}
	if o.keys < 0 || o.keys > 1_000_000 || o.queues < 1 {
		errs = append(errs, errors.New("--keys must be 0 … 1,000,000 and --queues at least 1"))
	}
	if o.topic == "" || strings.ContainsAny(o.topic, ".*> ") {
		errs = append(errs, errors.New("--topic must be non-empty without '.', '*', '>' or spaces"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("bench: %w", errors.Join(errs...))
	}
	return nil
}

// limit is how much a produce run sends: count messages, or for duration if
// only a duration was given (or whichever comes first if both were).
func (o *benchOptions) limit() (count int64, duration time.Duration) {
	if o.duration > 0 && !o.countSet {
		return 0, o.duration
	}
	return o.count, o.duration
}

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure throughput and latency against a running server",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newBenchCoreCmd(), newBenchTableCmd(), newBenchMQTTCmd(), newBenchTortureCmd(), newBenchTailCmd(), newBenchReplayCmd(), newBenchRPCCmd(), newBenchShadowCmd())
	return cmd
}

func newBenchCoreCmd() *cobra.Command {
	o := &benchOptions{}
	cmd := &cobra.Command{
		Use:   "core",
		Short: "Produce or consume over the core TCP protocol (or against NATS JetStream, for comparison)",
		Long: `Produce or consume over the core TCP protocol, or the same load against NATS
JetStream for comparison.

produce: --producers connections each keep --pipeline asynchronous sends in
flight until --count messages (or --duration) are acknowledged; latency is
measured per message from send to acknowledgement.

consume: --count messages are produced first (untimed; --skip-fill consumes
what is stored already), then --consumers connections consume them as one
group — ferrymq: clustering push consumers committing offsets; jetstream: a
durable pull consumer with explicit acks, each message acknowledged.

A progress line goes to stderr every 500 ms; the result row to stdout.`,
		Example: `  ferrymq bench core --server 127.0.0.1:10911 --label async
  ferrymq bench core --target jetstream --server 127.0.0.1:4222 --label sync_interval=always
  ferrymq bench core --mode consume --count 500000 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.withDefaults(cmd)
			if err := o.validate(); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			res, err := o.run(ctx, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if o.json {
				return writeBenchJSON(cmd.OutOrStdout(), res)
			}
			return writeBenchTable(cmd.OutOrStdout(), []benchResult{res}, false)
		},
	}
	o.AddFlags(cmd)
	return cmd
}

// run runs the benchmark o describes; progress goes to progress.
func (o *benchOptions) run(ctx context.Context, progress io.Writer) (benchResult, error) {
	var t benchTarget
	if o.target == targetJetStream {
		t = newJetStreamTarget(o)
	} else {
		t = newFerryTarget(o)
	}
	res := benchResult{Target: o.target, Mode: o.mode, Label: o.label, Size: o.size, Server: o.server}
	if o.mode == modeProduce {
		if err := t.prepareProduce(ctx); err != nil {
			return res, err
		}
		count, duration := o.limit()
		m, err := driveProduce(ctx, t, o.producers, o.pipeline, count, duration, newBenchProgress(progress, o.target+" produce"))
		if err != nil {
			return res, err
		}
		res.Producers, res.Pipeline = o.producers, o.pipeline
		res.fill(m)
		return res, nil
	}
	if !o.skipFill {
		if err := t.prepareFill(ctx); err != nil {
			return res, err
		}
		if _, err := driveProduce(ctx, t, o.producers, o.pipeline, o.count, 0, newBenchProgress(progress, o.target+" fill")); err != nil {
			return res, fmt.Errorf("fill: %w", err)
		}
	}
	m, err := driveConsume(ctx, t, o.consumers, o.count, o.duration, newBenchProgress(progress, o.target+" consume"))
	if err != nil {
		return res, err
	}
	res.Consumers = o.consumers
	res.Ordered = o.ordered
	res.fill(m)
	return res, nil
}

// benchResult is one row of the result table.
type benchResult struct {
	Target     string  `json:"target"`
	Mode       string  `json:"mode"`
	Label      string  `json:"label,omitempty"`
	Producers  int     `json:"producers,omitempty"`
	Consumers  int     `json:"consumers,omitempty"`
	Pipeline   int     `json:"pipeline,omitempty"`
	Size       int     `json:"size"`
	Messages   int64   `json:"messages"`
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	MBPerSec   float64 `json:"mb_per_sec"`
	// Latencies from send to acknowledgement (produce only), µs.
	P50us  float64 `json:"p50_us,omitempty"`
	P99us  float64 `json:"p99_us,omitempty"`
	P999us float64 `json:"p999_us,omitempty"`
	// Ordered consume runs: first deliveries of a message after a later
	// message of the same queue (jetstream: subject).
	Ordered    bool  `json:"ordered,omitempty"`
	OutOfOrder int64 `json:"out_of_order,omitempty"`
	// Consume runs: deliveries of a message delivered before (a queue or
	// consumer changed hands before committing); not in Messages.
	Duplicates int64 `json:"duplicates,omitempty"`
	// Consume runs: from starting the consumers to the first delivery, ms
	// (Seconds and MsgsPerSec count from that delivery on).
	FirstMs float64 `json:"first_ms,omitempty"`
	Server  string  `json:"server"`
}

func (r *benchResult) fill(m benchMeasurement) {
	r.Messages = m.messages
	r.OutOfOrder, r.Duplicates = m.outOfOrder, m.duplicates
	if m.first > 0 {
		r.FirstMs = float64(m.first) / 1e6
	}
	r.Seconds = m.elapsed.Seconds()
	if r.Seconds > 0 {
		r.MsgsPerSec = float64(m.messages) / r.Seconds
		r.MBPerSec = float64(m.messages) * float64(r.Size) / r.Seconds / 1e6
	}
	if m.hist != nil && m.hist.Count() > 0 {
		us := func(q float64) float64 { return float64(m.hist.Quantile(q)) / 1e3 }
		r.P50us, r.P99us, r.P999us = us(0.50), us(0.99), us(0.999)
	}
}

func writeBenchJSON(w io.Writer, r benchResult) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// writeBenchTable prints rows for people: aligned text, or a Markdown table.
func writeBenchTable(w io.Writer, rows []benchResult, markdown bool) error {
	header := []string{"TARGET", "MODE", "LABEL", "CLIENTS", "PIPELINE", "SIZE", "MESSAGES", "SECONDS", "MSGS/S", "MB/S", "P50", "P99", "P99.9"}
	lines := [][]string{header}
	for _, r := range rows {
		clients := r.Producers
		if r.Mode == modeConsume {
			clients = r.Consumers
		}
		lines = append(lines, []string{r.Target, r.Mode, benchDash(r.Label), strconv.Itoa(clients), benchDash(benchItoa(r.Pipeline)),
			strconv.Itoa(r.Size), strconv.FormatInt(r.Messages, 10), strconv.FormatFloat(r.Seconds, 'f', 2, 64),
			strconv.FormatFloat(r.MsgsPerSec, 'f', 0, 64), strconv.FormatFloat(r.MBPerSec, 'f', 1, 64),
			fmtBenchMicros(r.P50us), fmtBenchMicros(r.P99us), fmtBenchMicros(r.P999us)})
	}
	if markdown {
		for i, l := range lines {
			if _, err := fmt.Fprintf(w, "| %s |\n", strings.Join(l, " | ")); err != nil {
				return err
			}
			if i == 0 {
				sep := make([]string, len(l))
				for j := range sep {
					sep[j] = "---"
					if j >= 3 {
						sep[j] = "---:"
					}
				}
				if _, err := fmt.Fprintf(w, "|%s|\n", strings.Join(sep, "|")); err != nil {
					return err
				}
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, l := range lines {
		if _, err := fmt.Fprintf(tw, "%s\t\n", strings.Join(l, "\t")); err != nil {
			return err
		}
	}
	return tw.Flush()
}

func benchDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func benchItoa(n int) string {
	if n == 0 {
		return ""
	}
	return strconv.Itoa(n)
}

// fmtBenchMicros formats a latency in µs with three significant digits.
func fmtBenchMicros(us float64) string {
	switch {
	case us <= 0:
		return "-"
	case us < 1000:
		return strconv.FormatFloat(us, 'f', max(0, 2-int(benchMagnitude(us))), 64) + "µs"
	case us < 1e6:
		ms := us / 1e3
		return strconv.FormatFloat(ms, 'f', max(0, 2-int(benchMagnitude(ms))), 64) + "ms"
	default:
		return strconv.FormatFloat(us/1e6, 'f', 2, 64) + "s"
	}
}

// benchMagnitude is ⌊log10 v⌋ for v ≥ 1, else 0.
func benchMagnitude(v float64) int {
	n := 0
	for v >= 10 {
		v /= 10
		n++
	}
	return n
}
