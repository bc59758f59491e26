package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core/client"
)

type rpcOptions struct {
	client   clientOptions
	clientID string
	json     bool
}

func newRPCCmd() *cobra.Command {
	o := &rpcOptions{}
	cmd := &cobra.Command{
		Use:   "rpc --client ID [--timeout 5s] PAYLOAD",
		Short: "Call a connected MQTT device and print its answer (synchronous call, RRPC)",
		Long: `Send PAYLOAD ("-": standard input) to the device with this MQTT client ID and wait for its
answer, which is printed as it came (with --json: one object with the call ID, the answer, the
node the device is connected to and the time it took).

The device gets the request on $rpc/{client}/request/{call id} — MQTT 5 with a Response Topic
and Correlation Data — and answers on $rpc/{client}/response/{call id} (docs/commands.md).
The call fails at once when no gateway node has the device connected, and when the device
does not answer within --timeout (1s–60s).`,
		Example: `  ferrymq rpc --client car-42 '{"method":"unlock"}'
  echo -n reboot | ferrymq rpc --client car-42 --timeout 30s -`,
		Args: cobra.ExactArgs(1),
		RunE: runE(o.run),
	}
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.clientID, "client", "", "MQTT client ID of the device (required)")
	f.BoolVar(&o.json, "json", false, "print the answer as one JSON object")
	t := f.Lookup("timeout")
	t.Usage, t.DefValue = "how long the device has to answer, 1s–60s (also bounds connecting)", client.DefaultCallTimeout.String()
	o.client.timeout = client.DefaultCallTimeout
	_ = cmd.MarkFlagRequired("client")
	return cmd
}

func (o *rpcOptions) run(cmd *cobra.Command, args []string) error {
	if o.client.timeout < client.MinCallTimeout || o.client.timeout > client.MaxCallTimeout {
		return fmt.Errorf("--timeout %v: want %v to %v", o.client.timeout, client.MinCallTimeout, client.MaxCallTimeout)
	}
	payload := []byte(args[0])
	if args[0] == "-" {
		var err error
		if payload, err = io.ReadAll(cmd.InOrStdin()); err != nil {
			return fmt.Errorf("read the payload from standard input: %w", err)
		}
	}
	c, err := o.client.dial(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	// The device's time starts now, connecting done.
	ctx, cancel := context.WithTimeout(cmd.Context(), o.client.timeout)
	defer cancel()
	a, err := c.Call(ctx, o.clientID, payload)
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	if o.json {
		return writeJSONLine(w, a)
	}
	if _, err := w.Write(a.Payload); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "\n(call %s answered by %s on node %s in %v)\n", a.ID, o.clientID, orDash(a.Node),
		time.Duration(a.TookMS*float64(time.Millisecond)).Round(time.Microsecond))
	return nil
}
