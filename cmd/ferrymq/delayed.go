package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/wire"
)

type msgDelayedOptions struct {
	client clientOptions
	topic  string
	max    int
	json   bool
}

func (o *msgDelayedOptions) AddFlags(cmd *cobra.Command) {
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", "", "only messages for this topic")
	f.IntVar(&o.max, "max", 100, "most messages to list")
	f.BoolVar(&o.json, "json", false, "print one JSON object per message")
}

func newMsgDelayedCmd() *cobra.Command {
	o := &msgDelayedOptions{}
	cmd := &cobra.Command{
		Use:   "delayed [--topic T]",
		Short: "List delayed messages not yet delivered, soonest first",
		Example: `  ferrymq msg delayed
  ferrymq msg delayed --topic reminders --max 1000 --json`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *msgDelayedOptions) run(cmd *cobra.Command, _ []string) error {
	if o.max < 1 {
		return fmt.Errorf("--max must be at least 1, got %d", o.max)
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		var all []wire.Delayed
		req := wire.ListDelayedReq{Topic: o.topic, Max: min(o.max, 1000)}
		for len(all) < o.max {
			page, err := c.ListDelayed(ctx, req)
			if err != nil {
				return fmt.Errorf("list delayed messages: %w", err)
			}
			all = append(all, page.Pending...)
			if page.Done {
				break
			}
			req.Level, req.Offset = page.NextLevel, page.NextOffset
		}
		all = all[:min(len(all), o.max)]
		slices.SortStableFunc(all, func(a, b wire.Delayed) int { return a.Due.Compare(b.Due) })
		w := cmd.OutOrStdout()
		if o.json {
			for _, d := range all {
				if err := writeJSONLine(w, d); err != nil {
					return err
				}
			}
			return nil
		}
		if len(all) == 0 {
			_, err := fmt.Fprintln(w, "no delayed messages pending")
			return err
		}
		tw := newTable(w)
		fmt.Fprintln(tw, "ID\tTOPIC\tDUE\tIN\tKEY\tSIZE")
		now := time.Now()
		for _, d := range all {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", d.ID, d.Topic, displayTime(d.Due), d.Due.Sub(now).Round(time.Second),
				orDash(displayIfSet(d.Key)), d.Size)
		}
		return tw.Flush()
	})
}

type msgCancelOptions struct {
	client clientOptions
}

func newMsgCancelCmd() *cobra.Command {
	o := &msgCancelOptions{}
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a delayed message before it is due (ID as produce printed it)",
		Long: `Cancel a delayed message before it is due, by the ID produce printed.

The server refuses an unknown ID, the ID of a message that was not delayed,
one already delivered (or being delivered), and one cancelled before.`,
		Example: `  ferrymq msg cancel 0100a3f2000000000000012c0000005e`,
		Args:    cobra.ExactArgs(1),
		RunE:    runE(o.run),
	}
	o.client.AddFlags(cmd)
	return cmd
}

func (o *msgCancelOptions) run(cmd *cobra.Command, args []string) error {
	id, err := core.ParseMessageID(args[0])
	if err != nil {
		return err
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		d, err := c.CancelDelayed(ctx, id)
		if err != nil {
			return err // the server's error names the ID
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "cancelled %s (topic %s, was due %s)\n", d.ID, d.Topic, displayTime(d.Due))
		return err
	})
}

type msgTxnOptions struct {
	client clientOptions
	json   bool
}

func newMsgTxnCmd() *cobra.Command {
	o := &msgTxnOptions{}
	cmd := &cobra.Command{
		Use:   "transactions",
		Short: "List transactional half messages not yet committed or rolled back, oldest first",
		Long: `List the half messages the server holds for transactions that are neither committed nor
rolled back: their producer group, topic, how many check-backs were sent and when the next is due.`,
		Example: `  ferrymq msg transactions
  ferrymq msg transactions --json`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.client.AddFlags(cmd)
	cmd.Flags().BoolVar(&o.json, "json", false, "print one JSON object per half message")
	return cmd
}

func (o *msgTxnOptions) run(cmd *cobra.Command, _ []string) error {
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		pending, err := c.PendingTransactions(ctx)
		if err != nil {
			return fmt.Errorf("list transactions: %w", err)
		}
		w := cmd.OutOrStdout()
		if o.json {
			for _, p := range pending {
				if err := writeJSONLine(w, p); err != nil {
					return err
				}
			}
			return nil
		}
		if len(pending) == 0 {
			_, err := fmt.Fprintln(w, "no transactions pending")
			return err
		}
		tw := newTable(w)
		fmt.Fprintln(tw, "ID\tGROUP\tTOPIC\tSTORED AT\tCHECKS\tNEXT CHECK")
		for _, p := range pending {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", p.ID, p.Group, p.Topic, displayTime(p.StoredAt), p.Checks, displayTime(p.NextCheck))
		}
		return tw.Flush()
	})
}
