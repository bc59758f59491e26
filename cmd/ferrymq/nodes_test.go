package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/server"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/wire"
)

// `ferrymq nodes` prints the server's cluster view: a lone server names
// itself; a view with several nodes is printed as given (here a test
// server's, a real cluster's is gateway/node's TestNATSDiscovery).
func TestNodesCmd(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	r := cli(t, t.Context(), "", "nodes", "--server", env.Addr, "--json")
	require.NoError(t, r.runErr, r.err)
	var info wire.ClusterInfo
	require.NoError(t, json.Unmarshal([]byte(r.out), &info))
	require.Equal(t, []wire.NodeInfo{{Core: env.Addr, Holder: true}}, info.Nodes)

	two := servertest.Start(t, servertest.Options{Server: server.Options{Cluster: func(context.Context) (wire.ClusterInfo, error) {
		return wire.ClusterInfo{Nodes: []wire.NodeInfo{{Name: "gw-1", Core: "10.0.0.1:10911", Holder: true}, {Name: "gw-2"}},
			Groups: map[string]string{"billing": "gw-2", "audit": "gw-2", "ops": "gw-1"}}, nil
	}}})
	r = cli(t, t.Context(), "", "nodes", "--server", two.Addr)
	require.NoError(t, r.runErr, r.err)
	require.Regexp(t, `NODE +CORE +HOLDER +GROUPS\ngw-1 +10\.0\.0\.1:10911 +yes +ops\ngw-2 +- +audit,billing\n`, r.out)
}
