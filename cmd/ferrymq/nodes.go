package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/wire"
)

type nodesOptions struct {
	client clientOptions
	json   bool
}

func newNodesCmd() *cobra.Command {
	o := &nodesOptions{}
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "The cluster's nodes and their core addresses, as the server names them (discovery)",
		Long: `The nodes a client may connect to and their core addresses, as the server
answers the wire's CLUSTER request: a lone server names itself; with the
JetStream engine the nodes alive, the one holding the core services marked.
Every client command learns these addresses when it connects, so --server
needs one of them.`,
		Example: `  ferrymq nodes --server a:10911
  ferrymq nodes --json | jq -r '.nodes[].core'`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.client.AddFlags(cmd)
	cmd.Flags().BoolVar(&o.json, "json", false, "print the answer as JSON")
	return cmd
}

func (o *nodesOptions) run(cmd *cobra.Command, _ []string) error {
	return o.client.call(cmd, func(ctx context.Context, c *client.Client) error {
		info, err := c.Cluster(ctx)
		if err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		if info.Nodes == nil {
			info.Nodes = []wire.NodeInfo{}
		}
		if o.json {
			return writeJSON(cmd.OutOrStdout(), info)
		}
		byNode := map[string][]string{}
		for g, node := range info.Groups {
			byNode[node] = append(byNode[node], g)
		}
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "NODE\tCORE\tHOLDER\tGROUPS")
		for _, n := range info.Nodes {
			holder := ""
			if n.Holder {
				holder = "yes"
			}
			groups := byNode[n.Name]
			slices.Sort(groups)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", benchDash(n.Name), benchDash(n.Core), holder, benchDash(strings.Join(groups, ",")))
		}
		return tw.Flush()
	})
}
