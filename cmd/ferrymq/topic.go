package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/wire"
)

func newTopicCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topic",
		Short: "Create, list, describe, resize and delete topics",
		Example: `  ferrymq topic create orders --queues 8
  ferrymq topic update orders --queues 16
  ferrymq topic list
  ferrymq topic describe orders --json`,
		Args: cobra.NoArgs,
		RunE: helpRunE,
	}
	cmd.AddCommand(newTopicCreateCmd(), newTopicListCmd(), newTopicDescribeCmd(), newTopicUpdateCmd(), newTopicDeleteCmd())
	return cmd
}

// topicMessages is how many messages a topic holds (retained, readable).
func topicMessages(t wire.TopicInfo) int64 {
	var n int64
	for _, r := range t.Ranges {
		n += r.Messages
	}
	return n
}

type topicCreateOptions struct {
	client clientOptions
	queues int
	json   bool
}

func (o *topicCreateOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.IntVar(&o.queues, "queues", 0, "number of queues (default: the server's, 8)")
	f.BoolVar(&o.json, "json", false, "print the topic as JSON")
}

func newTopicCreateCmd() *cobra.Command {
	o := &topicCreateOptions{}
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a topic (succeeds if it exists with the same queue count)",
		Example: `  ferrymq topic create orders
  ferrymq topic create telemetry --queues 16 --server broker:10911`,
		Args: cobra.ExactArgs(1),
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *topicCreateOptions) run(cmd *cobra.Command, args []string) error {
	if o.queues < 0 {
		return fmt.Errorf("--queues must not be negative, got %d", o.queues)
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		t, err := c.CreateTopic(ctx, args[0], o.queues)
		if err != nil {
			return fmt.Errorf("create topic %s: %w", args[0], err)
		}
		if o.json {
			return writeJSON(cmd.OutOrStdout(), t)
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "topic %s: %d queues\n", t.Name, t.Queues)
		return err
	})
}

type topicListOptions struct {
	client clientOptions
	json   bool
}

func (o *topicListOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	cmd.Flags().BoolVar(&o.json, "json", false, "print the topics as a JSON array (with each queue's range)")
}

func newTopicListCmd() *cobra.Command {
	o := &topicListOptions{}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List topics, system topics (%RETRY%…, %DLQ%…) included",
		Example: `  ferrymq topic list
  ferrymq topic list --json | jq -r '.[].name'`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *topicListOptions) run(cmd *cobra.Command, _ []string) error {
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		list, err := c.Topics(ctx)
		if err != nil {
			return fmt.Errorf("list topics: %w", err)
		}
		if list == nil {
			list = []wire.TopicInfo{}
		}
		if o.json {
			return writeJSON(cmd.OutOrStdout(), list)
		}
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "TOPIC\tQUEUES\tMESSAGES\tCREATED")
		for _, t := range list {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", t.Name, t.Queues, topicMessages(t), displayTime(t.CreatedAt))
		}
		return tw.Flush()
	})
}

type topicDescribeOptions struct {
	client clientOptions
	json   bool
}

func (o *topicDescribeOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	cmd.Flags().BoolVar(&o.json, "json", false, "print the topic as JSON")
}

func newTopicDescribeCmd() *cobra.Command {
	o := &topicDescribeOptions{}
	cmd := &cobra.Command{
		Use:   "describe NAME",
		Short: "Show a topic's queues and the range of offsets each holds",
		Example: `  ferrymq topic describe orders
  ferrymq topic describe orders --json`,
		Args: cobra.ExactArgs(1),
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *topicDescribeOptions) run(cmd *cobra.Command, args []string) error {
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		t, err := c.Topic(ctx, args[0])
		if err != nil {
			return err // "topic not found: "x"" says it all
		}
		if o.json {
			return writeJSON(cmd.OutOrStdout(), t)
		}
		w := cmd.OutOrStdout()
		fmt.Fprintf(w, "topic     %s\nqueues    %d\nmessages  %d\ncreated   %s\n\n", t.Name, t.Queues, topicMessages(t), displayTime(t.CreatedAt))
		tw := newTable(w)
		fmt.Fprintln(tw, "QUEUE\tMIN\tMAX\tMESSAGES")
		for q, r := range t.Ranges {
			state := ""
			if q >= t.Queues {
				state = "\tretired (draining)"
			}
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d%s\n", q, r.Min, r.Max, r.Messages, state)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(t.Epochs) > 1 {
			fmt.Fprintln(w)
			tw = newTable(w)
			fmt.Fprintln(tw, "EPOCH	QUEUES	STARTED")
			for e, ep := range t.Epochs {
				fmt.Fprintf(tw, "%d\t%d\t%s\n", e, ep.Queues, displayTime(ep.Started))
			}
			return tw.Flush()
		}
		return nil
	})
}

type topicDeleteOptions struct {
	client clientOptions
}

func newTopicDeleteCmd() *cobra.Command {
	o := &topicDeleteOptions{}
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a topic: its queues and groups' offsets go, its messages are never served again",
		Long: `Delete a user topic at once. Its consume queues and every group's committed offsets go, and
its messages are never served again (by ID, key or query); they leave the disk with retention.
A topic created later under the same name starts empty. System topics cannot be deleted.`,
		Example: `  ferrymq topic delete orders`,
		Args:    cobra.ExactArgs(1),
		RunE:    runE(o.run),
	}
	o.client.AddFlags(cmd)
	return cmd
}

func (o *topicDeleteOptions) run(cmd *cobra.Command, args []string) error {
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		if err := c.DeleteTopic(ctx, args[0]); err != nil {
			return err
		}
		_, err := fmt.Fprintf(cmd.OutOrStdout(), "deleted topic %s\n", args[0])
		return err
	})
}

type topicUpdateOptions struct {
	client clientOptions
	queues int
	json   bool
}

func (o *topicUpdateOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.IntVar(&o.queues, "queues", 0, "the new number of queues (1 to 1024; required)")
	f.BoolVar(&o.json, "json", false, "print the topic as JSON")
}

func newTopicUpdateCmd() *cobra.Command {
	o := &topicUpdateOptions{}
	cmd := &cobra.Command{
		Use:   "update NAME --queues N",
		Short: "Resize a topic while producers and consumers run; every key keeps its order for every group",
		Long: `Resize a topic while producers and consumers run. From now on a key goes to one of the
new count's queues; a group takes a key's messages from its new queue only after it committed
the key's earlier ones in the old queue (docs/consumption.md, "Resizing a topic"). Queues beyond
a smaller count stay readable until every group drained them and retention removes them.`,
		Example: `  ferrymq topic update telemetry --queues 16
  ferrymq topic update telemetry --queues 4 --json`,
		Args: cobra.ExactArgs(1),
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *topicUpdateOptions) run(cmd *cobra.Command, args []string) error {
	if o.queues < 1 {
		return fmt.Errorf("--queues is required: 1 to 1024, got %d", o.queues)
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		t, err := c.ResizeTopic(ctx, args[0], o.queues)
		if err != nil {
			return fmt.Errorf("resize topic %s: %w", args[0], err)
		}
		if o.json {
			return writeJSON(cmd.OutOrStdout(), t)
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "topic %s: %d queues (%d readable, epoch %d)\n", t.Name, t.Queues, len(t.Ranges), max(len(t.Epochs)-1, 0))
		return err
	})
}
