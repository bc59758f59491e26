package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/gateway/shadowbench"
)

// benchShadowOptions are the flags of `ferrymq bench shadow`.
type benchShadowOptions struct {
	o     shadowbench.Options
	label string
	json  bool
}

func (b *benchShadowOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&b.o.MQTT, "mqtt", "127.0.0.1:1883", "gateway MQTT address")
	f.StringVar(&b.o.Core, "server", "127.0.0.1:10911", "core server address (backends)")
	f.StringVar(&b.o.Token, "token", "", "core token (default: none); also read from FERRYMQ_TOKEN")
	f.StringVar(&b.o.Username, "username", "", "MQTT username of the devices")
	f.StringVar(&b.o.Password, "password", "", "MQTT password of the devices")
	f.IntVar(&b.o.Devices, "devices", 64, "MQTT devices reporting, one update in flight each")
	f.IntVar(&b.o.Backends, "backends", 8, "core connections updating desired, one update in flight each")
	f.StringVar(&b.o.Prefix, "prefix", "shadow-bench-", "client ID prefix of the devices")
	f.DurationVar(&b.o.Warmup, "warmup", 2*time.Second, "run before the measured window")
	f.DurationVar(&b.o.Duration, "duration", 20*time.Second, "measured window")
	f.StringVar(&b.label, "label", "", "setup named in the result")
	f.BoolVar(&b.json, "json", false, "print the result as one JSON line")
}

// benchShadowRow is the result with the label.
type benchShadowRow struct {
	Label string `json:"label,omitempty"`
	shadowbench.Result
}

func newBenchShadowCmd() *cobra.Command {
	b := &benchShadowOptions{}
	cmd := &cobra.Command{
		Use:   "shadow",
		Short: "Device shadow updates/s from MQTT devices (reported) and core backends (desired) at once",
		Long: `Device shadow updates/s from both sides at once: --devices MQTT 3.1.1 clients
publish reported updates to $shadow/<id>/update at QoS 1 and wait for each
accepted answer; --backends core connections update desired of the same
devices in turn (Client.UpdateShadow). Every accepted update is durable
under the server's flush policy and an event on device-shadows.

A line a second goes to stderr; the result to stdout.`,
		Example: `  ferrymq bench shadow --duration 20s
  ferrymq bench shadow --devices 200 --backends 0 --label reported-only --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if b.o.Token == "" {
				b.o.Token = getenv("FERRYMQ_TOKEN")
			}
			b.o.Progress = cmd.ErrOrStderr()
			res, err := shadowbench.Run(cmd.Context(), b.o)
			if err != nil {
				return err
			}
			row := benchShadowRow{Label: b.label, Result: res}
			if b.json {
				return writeJSONLine(cmd.OutOrStdout(), row)
			}
			return writeBenchShadow(cmd.OutOrStdout(), row)
		},
	}
	b.AddFlags(cmd)
	return cmd
}

func writeBenchShadow(w io.Writer, r benchShadowRow) error {
	tw := newTable(w)
	fmt.Fprintf(tw, "label\t%s\n", benchDash(r.Label))
	fmt.Fprintf(tw, "updates/s\t%.0f in %.1f s (%d devices, %d backends)\n", r.PerSecond, r.Window, r.Devices, r.Backends)
	for _, s := range []struct {
		name string
		s    shadowbench.Side
	}{{"reported (MQTT)", r.Reported}, {"desired (core)", r.Desired}} {
		fmt.Fprintf(tw, "%s\t%.0f/s, %d accepted, %d rejected; p50 %s  p99 %s  max %s\n", s.name, s.s.PerSecond, s.s.Accepted, s.s.Rejected,
			fmtBenchMicros(float64(s.s.P50us)), fmtBenchMicros(float64(s.s.P99us)), fmtBenchMicros(float64(s.s.MaxUs)))
	}
	return tw.Flush()
}
