package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/gateway/callbench"
)

type benchRPCOptions struct {
	o    callbench.Options
	json bool
}

func newBenchRPCCmd() *cobra.Command {
	b := &benchRPCOptions{}
	cmd := &cobra.Command{
		Use:   "rpc",
		Short: "Synchronous calls to devices: latency at a fixed call rate",
		Long: `Connect --devices MQTT 5 devices that answer every call on its Response Topic, then
call them in turn over the core port (--target mqtt: MQTT 5 request/response through any
broker) at --rate calls per second for --duration (after
--warmup), open loop: each call is timed from when it was due, so a server that falls behind
shows in the latencies. A progress line goes to stderr every second; the result row to stdout.`,
		Example: `  ferrymq bench rpc --mqtt 127.0.0.1:1883 --server 127.0.0.1:10911 --devices 1000 --rate 1000 --duration 30s
  ferrymq bench rpc --target mqtt --mqtt 127.0.0.1:1884   # the same through a plain MQTT 5 broker`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			o := b.o
			if o.Token == "" {
				o.Token = getenv(envToken)
			}
			errOut := cmd.ErrOrStderr()
			o.Progress = func(done, answered int64, el time.Duration) {
				fmt.Fprintf(errOut, "%6.1fs  calls %d  answered %d\n", el.Seconds(), done, answered)
			}
			r, err := callbench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if b.json {
				return writeJSONLine(w, r)
			}
			tw := newTable(w)
			fmt.Fprintln(tw, "DEVICES\tRATE\tCALLS\tANSWERED\tTIMEOUTS\tNOT_CONNECTED\tERRORS\tANSWERED/S\tP50\tP90\tP99\tMAX")
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f\t%v\t%v\t%v\t%v\n", r.Devices, r.Rate, r.Calls, r.Answered, r.Timeouts,
				r.NotConnected, r.Errors, r.PerSecond, r.P50.Round(time.Microsecond), r.P90.Round(time.Microsecond),
				r.P99.Round(time.Microsecond), r.Max.Round(time.Microsecond))
			if r.FirstError != "" {
				fmt.Fprintf(errOut, "first error: %s\n", r.FirstError)
			}
			return tw.Flush()
		}),
	}
	f := cmd.Flags()
	f.StringVar(&b.o.Target, "target", callbench.TargetFerryMQ, "ferrymq (calls over the core port) or mqtt (MQTT 5 request/response through any broker at --mqtt, what a backend without RRPC does)")
	f.StringVar(&b.o.MQTT, "mqtt", "127.0.0.1:1883", "the gateway's MQTT TCP address the devices connect to")
	f.StringVar(&b.o.Core, "server", defaultServer, "core address the calls are made through")
	f.StringVar(&b.o.Token, "token", "", "core token; also read from "+envToken)
	f.IntVar(&b.o.Devices, "devices", 1000, "connected devices, called in turn")
	f.IntVar(&b.o.Rate, "rate", 1000, "calls per second")
	f.DurationVar(&b.o.Duration, "duration", 30*time.Second, "how long the measured calls run")
	f.DurationVar(&b.o.Warmup, "warmup", 2*time.Second, "calls before the measured ones, not counted")
	f.DurationVar(&b.o.Timeout, "timeout", 5*time.Second, "each call's timeout")
	f.IntVar(&b.o.Size, "size", 64, "request payload in bytes (the devices echo it)")
	f.IntVar(&b.o.Conns, "conns", 4, "core connections the calls share")
	f.BoolVar(&b.json, "json", false, "print the result as one JSON line")
	return cmd
}
