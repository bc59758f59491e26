package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/shadow"
)

func newShadowCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "shadow",
		Short: "Read, change and delete device shadows",
		Long: `A device shadow is a JSON document per device (MQTT client ID): the state a backend
wants (desired), the state the device reports (reported), their difference (delta) and a
version (docs/commands.md, "Device shadows").`,
		Example: `  ferrymq shadow get car-17
  ferrymq shadow update car-17 '{"temp":21,"mode":null}' --version 4
  ferrymq shadow delete car-17`,
		Args: cobra.NoArgs,
		RunE: helpRunE,
	}
	cmd.AddCommand(newShadowGetCmd(), newShadowUpdateCmd(), newShadowDeleteCmd())
	return cmd
}

type shadowGetOptions struct {
	client clientOptions
	json   bool
}

func newShadowGetCmd() *cobra.Command {
	o := &shadowGetOptions{}
	cmd := &cobra.Command{
		Use:     "get CLIENT_ID",
		Short:   "Print a device's shadow",
		Example: `  ferrymq shadow get car-17 --json`,
		Args:    cobra.ExactArgs(1),
		RunE:    runE(o.run),
	}
	o.client.AddFlags(cmd)
	cmd.Flags().BoolVar(&o.json, "json", false, "print the whole document as JSON")
	return cmd
}

func (o *shadowGetOptions) run(cmd *cobra.Command, args []string) error {
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		d, err := c.Shadow(ctx, args[0])
		if err != nil {
			return fmt.Errorf("shadow of %s: %w", args[0], err)
		}
		return printShadow(cmd, args[0], d, o.json)
	})
}

type shadowUpdateOptions struct {
	client  clientOptions
	version int64
	json    bool
}

func newShadowUpdateCmd() *cobra.Command {
	o := &shadowUpdateOptions{}
	cmd := &cobra.Command{
		Use:   "update CLIENT_ID DESIRED_JSON",
		Short: "Merge a JSON object into a device's desired state (null removes a field)",
		Example: `  ferrymq shadow update car-17 '{"temp":21}'
  ferrymq shadow update car-17 '{"lights":{"front":"on"},"mode":null}' --version 4
  ferrymq shadow update car-17 null   # clear desired`,
		Args: cobra.ExactArgs(2),
		RunE: runE(o.run),
	}
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.Int64Var(&o.version, "version", 0, "accept the change only while the shadow is at this version (0: any)")
	f.BoolVar(&o.json, "json", false, "print the new document as JSON")
	return cmd
}

func (o *shadowUpdateOptions) run(cmd *cobra.Command, args []string) error {
	if o.version < 0 {
		return fmt.Errorf("--version must not be negative, got %d", o.version)
	}
	if !json.Valid([]byte(args[1])) {
		return fmt.Errorf("desired state %q is not JSON", args[1])
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		d, err := c.UpdateShadow(ctx, args[0], json.RawMessage(args[1]), o.version)
		if err != nil {
			return fmt.Errorf("update shadow of %s: %w", args[0], err)
		}
		return printShadow(cmd, args[0], d, o.json)
	})
}

type shadowDeleteOptions struct {
	client  clientOptions
	version int64
}

func newShadowDeleteCmd() *cobra.Command {
	o := &shadowDeleteOptions{}
	cmd := &cobra.Command{
		Use:     "delete CLIENT_ID",
		Short:   "Delete a device's shadow (its version goes on at the next update)",
		Example: `  ferrymq shadow delete car-17 --version 5`,
		Args:    cobra.ExactArgs(1),
		RunE:    runE(o.run),
	}
	o.client.AddFlags(cmd)
	cmd.Flags().Int64Var(&o.version, "version", 0, "delete only while the shadow is at this version (0: any)")
	return cmd
}

func (o *shadowDeleteOptions) run(cmd *cobra.Command, args []string) error {
	if o.version < 0 {
		return fmt.Errorf("--version must not be negative, got %d", o.version)
	}
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		v, err := c.DeleteShadow(ctx, args[0], o.version)
		if err != nil {
			return fmt.Errorf("delete shadow of %s: %w", args[0], err)
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "shadow of %s deleted (version %d)\n", args[0], v)
		return err
	})
}

// printShadow prints d: for people its version and state, indented;
// with asJSON the whole document on one line.
func printShadow(cmd *cobra.Command, id string, d *shadow.Document, asJSON bool) error {
	w := cmd.OutOrStdout()
	if asJSON {
		return writeJSON(w, d)
	}
	state, err := json.MarshalIndent(d.State, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "shadow of %s: version %d\n%s\n", id, d.Version, state)
	return err
}
