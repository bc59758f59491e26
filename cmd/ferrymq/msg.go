package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
)

func newMsgCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "msg",
		Short: "Look up messages by ID or by key; list and cancel delayed messages",
		Example: `  ferrymq msg get 0100a3f2000000000000012c0000005e
  ferrymq msg find --topic orders --key car-7
  ferrymq msg delayed --topic reminders
  ferrymq msg cancel 0100a3f2000000000000012c0000005e`,
		Args: cobra.NoArgs,
		RunE: helpRunE,
	}
	cmd.AddCommand(newMsgGetCmd(), newMsgFindCmd(), newMsgQueryCmd(), newMsgDelayedCmd(), newMsgCancelCmd(), newMsgTxnCmd())
	return cmd
}

type msgGetOptions struct {
	client clientOptions
	json   bool
}

func (o *msgGetOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	cmd.Flags().BoolVar(&o.json, "json", false, "print the message as one JSON object (the record of consume --json)")
}

func newMsgGetCmd() *cobra.Command {
	o := &msgGetOptions{}
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show the message with the given ID (32 hex characters, as produce prints)",
		Example: `  ferrymq msg get 0100a3f2000000000000012c0000005e
  ferrymq msg get 0100a3f2000000000000012c0000005e --json | jq -r .body`,
		Args: cobra.ExactArgs(1),
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *msgGetOptions) run(cmd *cobra.Command, args []string) error {
	id, err := core.ParseMessageID(args[0])
	if err != nil {
		return err
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		m, err := c.Get(ctx, id)
		if err != nil {
			return fmt.Errorf("get %s: %w", id, err)
		}
		if o.json {
			return writeJSONLine(cmd.OutOrStdout(), newMessageRecord(m))
		}
		return writeMessageDetail(cmd, m)
	})
}

// writeMessageDetail prints every field of m, one per line.
func writeMessageDetail(cmd *cobra.Command, m *core.StoredMessage) error {
	keys := make([]string, len(m.Keys))
	for i, k := range m.Keys {
		keys[i] = displayText(k)
	}
	tw := newTable(cmd.OutOrStdout())
	rows := [][2]string{
		{"id", m.ID.String()},
		{"topic", m.Topic},
		{"queue", strconv.Itoa(m.Queue)},
		{"offset", strconv.FormatInt(m.QueueOffset, 10)},
		{"key", orDash(displayIfSet(m.ShardingKey))},
		{"index keys", orDash(strings.Join(keys, " "))},
		{"tag", orDash(displayIfSet(m.Tag))},
		{"props", orDash(displayProps(m.Properties))},
		{"born at", displayTime(m.BornAt)},
		{"stored at", displayTime(m.StoredAt)},
		{"deliver at", displayTime(m.DeliverAt)},
		{"reconsume", strconv.Itoa(m.ReconsumeCount)},
		{"size", fmt.Sprintf("%d bytes stored, body %d bytes", m.Size, len(m.Body))},
		{"body", displayBody(m.Body)},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

// orDash returns s, or "-" if it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// displayIfSet is displayText, but empty for an empty s.
func displayIfSet(s string) string {
	if s == "" {
		return ""
	}
	return displayText(s)
}

type msgFindOptions struct {
	client clientOptions
	topic  string
	key    string
	max    int
	json   bool
}

func (o *msgFindOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", "", "topic to search (required)")
	f.StringVar(&o.key, "key", "", "sharding key or index key (required)")
	f.IntVar(&o.max, "max", 32, "most messages to return")
	f.BoolVar(&o.json, "json", false, "print one JSON object per message (the record of consume --json)")
	_ = cmd.MarkFlagRequired("topic")
	_ = cmd.MarkFlagRequired("key")
}

func newMsgFindCmd() *cobra.Command {
	o := &msgFindOptions{}
	cmd := &cobra.Command{
		Use:   "find --topic T --key K",
		Short: "Find a topic's messages by key (sharding key or index key)",
		Example: `  ferrymq msg find --topic orders --key car-7
  ferrymq msg find --topic orders --key car-7 --max 100 --json`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *msgFindOptions) run(cmd *cobra.Command, _ []string) error {
	if o.max < 1 {
		return fmt.Errorf("--max must be at least 1, got %d", o.max)
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		msgs, err := c.FindByKey(ctx, o.topic, o.key, core.KeyQuery{Max: o.max})
		if err != nil {
			return fmt.Errorf("find %q in %s: %w", o.key, o.topic, err)
		}
		w := cmd.OutOrStdout()
		if o.json {
			for _, m := range msgs {
				if err := writeJSONLine(w, newMessageRecord(m)); err != nil {
					return err
				}
			}
			return nil
		}
		if len(msgs) == 0 {
			_, err := fmt.Fprintf(w, "no messages with key %s in %s\n", displayText(o.key), o.topic)
			return err
		}
		tw := newTable(w)
		fmt.Fprintln(tw, "ID\tQUEUE\tOFFSET\tTAG\tSTORED AT\tBODY")
		for _, m := range msgs {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", m.ID, m.Queue, m.QueueOffset, orDash(displayIfSet(m.Tag)), displayTime(m.StoredAt),
				truncate(displayBody(m.Body), 60))
		}
		return tw.Flush()
	})
}
