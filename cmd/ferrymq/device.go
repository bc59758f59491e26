package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/gateway/devicesim"
)

func newDeviceCmd() *cobra.Command {
	o := devicesim.Options{}
	cmd := &cobra.Command{
		Use:   "device --client ID",
		Short: "Run a simulated MQTT 5 device that answers calls (for trying ferrymq by hand)",
		Long: `Connect one MQTT 5 device to the gateway and keep it connected until interrupted. It
answers every synchronous call made to it (ferrymq rpc, docs/commands.md) with --answer, and
prints every message it receives, one line each: topic, then payload.`,
		Example: `  ferrymq device --client car-42 &
  ferrymq rpc --client car-42 unlock            # prints "done: unlock"
  ferrymq device --client car-42 --answer '{"ok":true,"req":{payload}}' --subscribe 'cars/car-42/#'`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			o.Log = cmd.OutOrStdout()
			d, err := devicesim.Connect(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "device %s connected to %s; Ctrl-C ends it\n", o.ClientID, o.Addr)
			select {
			case <-cmd.Context().Done():
				return d.Close()
			case <-d.Done():
				return fmt.Errorf("device %s: the gateway closed the connection", o.ClientID)
			}
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.Addr, "mqtt", "127.0.0.1:1883", "the gateway's MQTT TCP address")
	f.StringVar(&o.ClientID, "client", "", "the device's MQTT client ID (required)")
	f.StringVar(&o.Username, "username", "", "MQTT username, if the gateway asks for credentials")
	f.StringVar(&o.Password, "password", "", "MQTT password")
	f.StringVar(&o.Answer, "answer", "done: {payload}", "the answer to every call; {payload} is the request's payload")
	f.StringSliceVar(&o.Subscribe, "subscribe", nil, "topic filters to subscribe to as well (QoS 1)")
	_ = cmd.MarkFlagRequired("client")
	return cmd
}
