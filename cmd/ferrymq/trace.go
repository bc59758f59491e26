package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/wire"
)

type traceOptions struct {
	client clientOptions
	json   bool
}

func newTraceCmd() *cobra.Command {
	o := &traceOptions{}
	cmd := &cobra.Command{
		Use:   "trace ID",
		Short: "Show a message's path end to end: device publish, storage, each group's deliveries, retries, acks, downlink",
		Long: `Show the recorded hops of a message as a timeline, oldest first: the device's MQTT
publish and its acknowledgement, where it was stored, each consumer group's deliveries, retries
and commits, dead-lettering, and for a command its delivery to the device and the receipt.

Hops are recorded only for traced topics (trace.all or trace.topics in the server's config).
A retried or delayed message is traced under the ID its producer got.`,
		Example: `  ferrymq trace 0100a3f2000000000000012c0000005e
  ferrymq trace 0100a3f2000000000000012c0000005e --json | jq -r .hop`,
		Args: cobra.ExactArgs(1),
		RunE: runE(o.run),
	}
	o.client.AddFlags(cmd)
	cmd.Flags().BoolVar(&o.json, "json", false, "print one JSON object per hop")
	return cmd
}

func (o *traceOptions) run(cmd *cobra.Command, args []string) error {
	id, err := core.ParseMessageID(args[0])
	if err != nil {
		return err
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		hops, err := c.Trace(ctx, id)
		if err != nil {
			return fmt.Errorf("trace %s: %w", id, err)
		}
		w := cmd.OutOrStdout()
		if o.json {
			for _, h := range hops {
				if err := writeJSONLine(w, h); err != nil {
					return err
				}
			}
			return nil
		}
		m, err := c.Get(ctx, id)
		switch {
		case err == nil:
			fmt.Fprintf(w, "message %s  topic %s  queue %d  offset %d  key %s  stored %s\n", id, m.Topic, m.Queue, m.QueueOffset,
				orDash(displayIfSet(m.ShardingKey)), displayTime(m.StoredAt))
		case errors.Is(err, core.ErrMessageNotFound):
			fmt.Fprintf(w, "message %s  (no longer stored)\n", id)
		default:
			return fmt.Errorf("get %s: %w", id, err)
		}
		if len(hops) == 0 {
			_, err := fmt.Fprintln(w, "no hops recorded: its topic is not traced (trace.all or trace.topics in the server's config)")
			return err
		}
		tw := newTable(w)
		fmt.Fprintln(tw, "TIME\t+MS\tHOP\tACTOR\tNODE\tDETAILS")
		start := hops[0].At
		for _, h := range hops {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", h.At.UTC().Format("15:04:05.000"), h.At.Sub(start).Milliseconds(), h.Hop,
				orDash(displayIfSet(h.Actor)), orDash(h.Node), attrsText(h.Attrs))
		}
		return tw.Flush()
	})
}

// attrsText prints a hop's details as sorted name=value pairs.
func attrsText(attrs map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(attrs)) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k + "=" + displayText(attrs[k]))
	}
	return orDash(b.String())
}

type msgQueryOptions struct {
	client     clientOptions
	topic, key string
	clientID   string
	begin, end string
	max        int
	json       bool
}

func newMsgQueryCmd() *cobra.Command {
	o := &msgQueryOptions{}
	cmd := &cobra.Command{
		Use:   "query [--topic T] (--key K | --client C | --begin TIME [--end TIME])",
		Short: "Find messages by key, by the MQTT client that published them, or by store time within a topic",
		Example: `  ferrymq msg query --client car-42
  ferrymq msg query --topic telemetry --key car-42 --begin 2026-11-29T14:00:00Z
  ferrymq msg query --topic telemetry --begin 2026-11-29T14:00:00Z --end 2026-11-29T14:05:00Z --json`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", "", "topic (required for a time range; else every topic)")
	f.StringVar(&o.key, "key", "", "sharding key or index key")
	f.StringVar(&o.clientID, "client", "", "MQTT client ID of the publisher")
	f.StringVar(&o.begin, "begin", "", "stored at or after this RFC 3339 `TIME`")
	f.StringVar(&o.end, "end", "", "stored at or before this RFC 3339 `TIME`")
	f.IntVar(&o.max, "max", 50, "most messages to print")
	f.BoolVar(&o.json, "json", false, "print one JSON object per message (the record of consume --json)")
	return cmd
}

func (o *msgQueryOptions) run(cmd *cobra.Command, _ []string) error {
	if o.max < 1 {
		return fmt.Errorf("--max must be at least 1, got %d", o.max)
	}
	var begin, end time.Time
	var err error
	if o.begin != "" {
		if begin, err = time.Parse(time.RFC3339, o.begin); err != nil {
			return fmt.Errorf("--begin %q: want an RFC 3339 time such as 2026-11-29T14:00:00Z", o.begin)
		}
	}
	if o.end != "" {
		if end, err = time.Parse(time.RFC3339, o.end); err != nil {
			return fmt.Errorf("--end %q: want an RFC 3339 time such as 2026-11-29T14:05:00Z", o.end)
		}
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		req := wire.QueryReq{Topic: o.topic, Key: o.key, ClientID: o.clientID, Begin: begin, End: end}
		var all []*core.StoredMessage
		for len(all) < o.max {
			req.Max = min(o.max-len(all), 1000)
			msgs, next, err := c.Query(ctx, req)
			if err != nil {
				return err
			}
			all = append(all, msgs...)
			if next == "" {
				break
			}
			req.Cursor = next
		}
		w := cmd.OutOrStdout()
		if o.json {
			for _, m := range all {
				if err := writeJSONLine(w, newMessageRecord(m)); err != nil {
					return err
				}
			}
			return nil
		}
		if len(all) == 0 {
			_, err := fmt.Fprintln(w, "no messages")
			return err
		}
		tw := newTable(w)
		fmt.Fprintln(tw, "ID\tTOPIC\tQUEUE\tOFFSET\tKEY\tSTORED AT\tBODY")
		for _, m := range all {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", m.ID, m.Topic, m.Queue, m.QueueOffset, orDash(displayIfSet(m.ShardingKey)),
				displayTime(m.StoredAt), truncate(displayBody(m.Body), 60))
		}
		return tw.Flush()
	})
}
