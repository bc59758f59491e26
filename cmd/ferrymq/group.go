package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/wire"
)

func newGroupCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "group",
		Short: "Inspect consumer groups and move their offsets",
		Example: `  ferrymq group list
  ferrymq group lag --group billing
  ferrymq group reset --group billing --topic orders --to 2024-05-01T00:00:00Z`,
		Args: cobra.NoArgs,
		RunE: helpRunE,
	}
	cmd.AddCommand(newGroupListCmd(), newGroupLagCmd(), newGroupResetCmd())
	return cmd
}

type groupListOptions struct {
	client clientOptions
	json   bool
}

func (o *groupListOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	cmd.Flags().BoolVar(&o.json, "json", false, "print the groups as a JSON array")
}

func newGroupListCmd() *cobra.Command {
	o := &groupListOptions{}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the groups that have live members, one line per member",
		Example: `  ferrymq group list
  ferrymq group list --json | jq -r '.[].group'`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *groupListOptions) run(cmd *cobra.Command, _ []string) error {
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		groups, err := c.Groups(ctx)
		if err != nil {
			return fmt.Errorf("list groups: %w", err)
		}
		if groups == nil {
			groups = []wire.GroupInfo{}
		}
		if o.json {
			return writeJSON(cmd.OutOrStdout(), groups)
		}
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "GROUP\tMODE\tMEMBER\tLAST HEARTBEAT\tQUEUES")
		for _, g := range groups {
			if len(g.Members) == 0 {
				fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\n", g.Group, g.Mode)
			}
			for _, m := range g.Members {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", g.Group, g.Mode, m.ClientID, displayTime(m.LastHeartbeat), displayQueues(m.Queues))
			}
		}
		return tw.Flush()
	})
}

// displayQueues shows queue refs grouped by topic: "orders:0,1,2 t2:5".
func displayQueues(refs []wire.QueueRef) string {
	if len(refs) == 0 {
		return "-"
	}
	var topics []string
	byTopic := map[string][]string{}
	for _, r := range refs {
		if _, ok := byTopic[r.Topic]; !ok {
			topics = append(topics, r.Topic)
		}
		byTopic[r.Topic] = append(byTopic[r.Topic], strconv.Itoa(r.Queue))
	}
	parts := make([]string, len(topics))
	for i, t := range topics {
		parts[i] = t + ":" + strings.Join(byTopic[t], ",")
	}
	return strings.Join(parts, " ")
}

type groupLagOptions struct {
	client clientOptions
	group  string
	member string
	json   bool
}

func (o *groupLagOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.group, "group", "", "consumer group (required)")
	f.StringVar(&o.member, "member", "", "broadcast groups: the member (client ID) whose own progress to show")
	f.BoolVar(&o.json, "json", false, "print the queues as a JSON array")
	_ = cmd.MarkFlagRequired("group")
}

func newGroupLagCmd() *cobra.Command {
	o := &groupLagOptions{}
	cmd := &cobra.Command{
		Use:   "lag --group G",
		Short: "Show a group's progress and backlog on each queue it consumes",
		Long: `Show a group's committed offset, the queue's range and the backlog (lag) on
every queue of the topics its live members subscribe to, and its retry topic.
The server reports lag only while the group has live members.`,
		Example: `  ferrymq group lag --group billing
  ferrymq group lag --group audit --member audit-1
  ferrymq group lag --group billing --json | jq '[.[].lag] | add'`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *groupLagOptions) run(cmd *cobra.Command, _ []string) error {
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		lags, err := c.Lag(ctx, o.group, o.member)
		if errors.Is(err, group.ErrUnknownMember) {
			return fmt.Errorf("group %s has no live members (lag is reported while a consumer of the group runs)", o.group)
		}
		if err != nil {
			return fmt.Errorf("lag of %s: %w", o.group, err)
		}
		if lags == nil {
			lags = []wire.QueueLag{}
		}
		if o.json {
			return writeJSON(cmd.OutOrStdout(), lags)
		}
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "TOPIC\tQUEUE\tCOMMITTED\tMIN\tMAX\tLAG\tOWNER\tLAST CONSUMED")
		var total int64
		for _, l := range lags {
			committed, owner := "-", "-"
			if l.Committed >= 0 {
				committed = strconv.FormatInt(l.Committed, 10)
			}
			if l.Owner != "" {
				owner = l.Owner
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%s\t%s\n", l.Topic, l.Queue, committed, l.Min, l.Max, l.Lag, owner, displayTime(l.LastConsumed))
			total += l.Lag
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "total lag %d\n", total)
		return err
	})
}

type groupResetOptions struct {
	client clientOptions
	group  string
	topic  string
	to     string
	json   bool
}

func (o *groupResetOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.group, "group", "", "consumer group (required)")
	f.StringVar(&o.topic, "topic", "", "topic whose offsets move (required)")
	f.StringVar(&o.to, "to", "", "earliest, latest, or an RFC 3339 time: the first message stored at or after it (required)")
	f.BoolVar(&o.json, "json", false, `print {"offsets": [...]} (the new offset of each queue)`)
	_ = cmd.MarkFlagRequired("group")
	_ = cmd.MarkFlagRequired("topic")
	_ = cmd.MarkFlagRequired("to")
}

func newGroupResetCmd() *cobra.Command {
	o := &groupResetOptions{}
	cmd := &cobra.Command{
		Use:   "reset --group G --topic T --to TIME|earliest|latest",
		Short: "Move a group's offsets on a topic (replay or skip messages)",
		Long: `Move a group's committed offsets on every queue of a topic: to the earliest
retained message (replay all), the latest (skip the backlog), or the first
message stored at or after a time. Live members continue from there.`,
		Example: `  ferrymq group reset --group billing --topic orders --to earliest
  ferrymq group reset --group billing --topic orders --to latest
  ferrymq group reset --group billing --topic orders --to 2024-05-01T12:00:00+02:00`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *groupResetOptions) run(cmd *cobra.Command, _ []string) error {
	pos, err := parsePosition("--to", o.to)
	if err != nil {
		return err
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		offs, err := c.ResetOffsets(ctx, o.group, o.topic, pos.at, pos.latest)
		if err != nil {
			return fmt.Errorf("reset %s on %s: %w", o.group, o.topic, err)
		}
		if offs == nil {
			offs = []int64{}
		}
		if o.json {
			return writeJSON(cmd.OutOrStdout(), wire.ResetReply{Offsets: offs})
		}
		w := cmd.OutOrStdout()
		fmt.Fprintf(w, "group %s on topic %s reset to %s\n", o.group, o.topic, o.to)
		tw := newTable(w)
		fmt.Fprintln(tw, "QUEUE\tOFFSET")
		for q, off := range offs {
			fmt.Fprintf(tw, "%d\t%d\n", q, off)
		}
		return tw.Flush()
	})
}
