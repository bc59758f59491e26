package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core/store"
)

type serveOptions struct {
	dataDir   string
	flush     string
	segment   int64
	retention time.Duration
	logLevel  string
	logPretty bool
}

func (o *serveOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data", "./data", "data directory")
	f.StringVar(&o.flush, "flush", "async", "flush policy: async (ack in page cache, fsync every 500 ms) or sync (ack after fsync)")
	f.Int64Var(&o.segment, "segment-bytes", 1<<30, "commit-log segment size in bytes")
	f.DurationVar(&o.retention, "retention", 72*time.Hour, "delete commit-log segments older than this")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.BoolVar(&o.logPretty, "log-pretty", false, "human-readable logs instead of JSON lines")
}

func newServeCmd() *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the server (today: the embedded store; listeners come with the TCP and gateway work)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *serveOptions) run(cmd *cobra.Command) error {
	log, err := newLogger(stderr, o.logPretty, o.logLevel)
	if err != nil {
		return fmt.Errorf("log level: %w", err)
	}
	st, err := store.Open(o.dataDir, store.Options{
		Logger:       &log,
		FlushPolicy:  store.FlushPolicy(o.flush),
		SegmentBytes: o.segment,
		Retention:    o.retention,
	})
	if err != nil {
		return fmt.Errorf("open store %s: %w", o.dataDir, err)
	}
	log.Info().Str("data", o.dataDir).Str("flush", o.flush).
		Msg("embedded store open; MQTT, core TCP and HTTP listeners are not built yet")
	<-cmd.Context().Done()
	log.Info().Msg("shutting down")
	if err := st.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}
