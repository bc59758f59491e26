package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core/corebench"
)

func newBenchReplayCmd() *cobra.Command {
	var (
		o    corebench.ReplayOptions
		asJS bool
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "A new group replaying a topic from its earliest message: a lagging reader's rate",
		Long: `A new consumer group replays --topic from its earliest message, until it
has all of it, --duration ends, or it is interrupted (SIGINT, SIGTERM: the
result is printed all the same). Reports the rate from its first message
on. A line goes to stderr at the first message.

scripts/bench-isolation.sh runs it beside 'bench tail' as the backlog
reader, in a process of its own.`,
		Example: `  ferrymq bench replay --topic backlog --json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Token == "" {
				o.Token = getenv("FERRYMQ_TOKEN")
			}
			o.Started = cmd.ErrOrStderr()
			res, err := corebench.RunReplay(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJS {
				b, err := json.Marshal(res)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
				return err
			}
			done := "stopped first"
			if res.Done {
				done = "all of it"
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s (group %s): %d of %d msgs, %d bytes in %.1f s: %.1f MB/s (%s)\n",
				res.Topic, res.Group, res.Messages, res.Total, res.Bytes, res.Seconds, res.MBPerSec, done)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Addr, "server", "127.0.0.1:10911", "core server address")
	f.StringVar(&o.Token, "token", "", "core token (default: none); also read from FERRYMQ_TOKEN")
	f.StringVar(&o.Topic, "topic", "backlog", "topic to replay (it must hold messages)")
	f.IntVar(&o.Consumers, "consumers", 1, "consumers of the group, each with its own connection")
	f.DurationVar(&o.Duration, "duration", 0, "longest replay (0: until it has the topic or is interrupted)")
	f.BoolVar(&asJS, "json", false, "print the result as one JSON line")
	return cmd
}
