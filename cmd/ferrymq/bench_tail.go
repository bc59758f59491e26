package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core/corebench"
)

// benchTailOptions are the flags of `ferrymq bench tail`.
type benchTailOptions struct {
	server           string
	token            string
	topic            string
	queues           int
	rate             float64
	size             int
	producers        int
	warmup           time.Duration
	duration         time.Duration
	backlogTopic     string
	backlogConsumers int
	label            string
	json             bool
}

func (o *benchTailOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.server, "server", "127.0.0.1:10911", "core server address")
	f.StringVar(&o.token, "token", "", "core token (default: none); also read from FERRYMQ_TOKEN")
	f.StringVar(&o.topic, "topic", "tail", "tail topic (created if missing)")
	f.IntVar(&o.queues, "queues", 8, "queues of the tail topic when the bench creates it")
	f.Float64Var(&o.rate, "rate", 5000, "messages/s produced to the tail topic, across all producers")
	f.IntVar(&o.size, "size", 1024, "payload bytes of the tail messages")
	f.IntVar(&o.producers, "producers", 4, "producer connections")
	f.DurationVar(&o.warmup, "warmup", 2*time.Second, "run before the measured window opens")
	f.DurationVar(&o.duration, "duration", 20*time.Second, "longest measured window (it closes earlier once a backlog is consumed)")
	f.StringVar(&o.backlogTopic, "backlog", "", "topic a new group replays from its earliest message during the window (it must hold the backlog already)")
	f.IntVar(&o.backlogConsumers, "backlog-consumers", 1, "consumers of the backlog group, each with its own connection")
	f.StringVar(&o.label, "label", "", "setup named in the result")
	f.BoolVar(&o.json, "json", false, "print the result as one JSON line")
}

// benchTailRow is the result with the label.
type benchTailRow struct {
	Label string `json:"label,omitempty"`
	corebench.TailResult
}

func newBenchTailCmd() *cobra.Command {
	o := &benchTailOptions{}
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "A tail group's delivery latency at a fixed rate, with or without a group replaying a backlog",
		Long: `A tail group's delivery latency at a fixed rate, with or without a group
replaying a backlog (are readers at the tail isolated from a lagging one?).

Producers send --rate messages/s to --topic; a new consumer group consumes
it from its end and measures each message from its store time to its
receipt. With --backlog, a second new group replays that topic from its
earliest message during the measured window, which then closes when the
backlog is consumed (or after --duration). Reports the tail's latencies in
the window and the backlog group's rate.

A line a second goes to stderr; the result to stdout.`,
		Example: `  ferrymq bench core --topic backlog --size 65536 --count 65536 --producers 4   # a 4 GiB backlog
  ferrymq bench tail --duration 20s --json
  ferrymq bench tail --backlog backlog --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.token == "" {
				o.token = getenv("FERRYMQ_TOKEN")
			}
			res, err := corebench.RunTail(cmd.Context(), corebench.TailOptions{Addr: o.server, Token: o.token, Topic: o.topic, Queues: o.queues,
				Rate: o.rate, Size: o.size, Producers: o.producers, Warmup: o.warmup, Duration: o.duration,
				BacklogTopic: o.backlogTopic, BacklogConsumers: o.backlogConsumers, Progress: cmd.ErrOrStderr()})
			if err != nil {
				return err
			}
			row := benchTailRow{Label: o.label, TailResult: res}
			if o.json {
				return writeJSONLine(cmd.OutOrStdout(), row)
			}
			return writeBenchTail(cmd.OutOrStdout(), row)
		},
	}
	o.AddFlags(cmd)
	return cmd
}

func writeBenchTail(w io.Writer, r benchTailRow) error {
	tw := newTable(w)
	fmt.Fprintf(tw, "label\t%s\n", benchDash(r.Label))
	fmt.Fprintf(tw, "tail\t%s, %.0f msgs/s of %d B: %d received in %.1f s (%d sent)\n", r.Topic, r.Rate, r.Size, r.Received, r.Window, r.Sent)
	fmt.Fprintf(tw, "store → receive\tp50 %s  p99 %s  p99.9 %s  max %s\n", fmtBenchMicros(r.P50us), fmtBenchMicros(r.P99us),
		fmtBenchMicros(r.P999us), fmtBenchMicros(r.MaxUs))
	if b := r.Backlog; b != nil {
		done := "window ended first"
		if b.Done {
			done = "consumed it all"
		}
		fmt.Fprintf(tw, "backlog\t%s (group %s): %d of %d msgs, %.1f MB/s (%s)\n", b.Topic, b.Group, b.Messages, b.Total, b.MBPerSec, done)
	}
	return tw.Flush()
}
