package client_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/server"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/wire"
)

// A lone server names itself, at its listening address.
func TestClusterInfoOfALoneServer(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c, err := client.Dial(t.Context(), client.Options{Addr: env.Addr})
	require.NoError(t, err)
	defer c.Close()
	info, err := c.Cluster(t.Context())
	require.NoError(t, err)
	require.Equal(t, wire.ClusterInfo{Nodes: []wire.NodeInfo{{Core: env.Addr, Holder: true}}}, info)
}

// twoNodes starts two servers, a and b, a naming both as its cluster (the
// view is the test's: two embedded servers do not know of each other;
// gateway/node tests the view a JetStream cluster gives).
func twoNodes(t *testing.T) (a, b *servertest.Env) {
	b = servertest.Start(t, servertest.Options{})
	var aAddr string
	a = servertest.Start(t, servertest.Options{Server: server.Options{Cluster: func(context.Context) (wire.ClusterInfo, error) {
		return wire.ClusterInfo{Nodes: []wire.NodeInfo{{Name: "a", Core: aAddr, Holder: true}, {Name: "b", Core: b.Addr}}}, nil
	}}})
	aAddr = a.Addr
	return a, b
}

// A client given one address learns the others from the server's cluster
// view (Options.Discover) and, when that server goes away, reconnects to
// one it learned: produces go on.
func TestDiscoverFindsTheOtherNodes(t *testing.T) {
	a, b := twoNodes(t)

	c, err := client.Dial(t.Context(), client.Options{Addr: a.Addr, Discover: true, MaxBackoff: 50 * time.Millisecond,
		DiscoverEvery: 50 * time.Millisecond})
	require.NoError(t, err)
	defer c.Close()
	info, err := c.Cluster(t.Context())
	require.NoError(t, err)
	require.Len(t, info.Nodes, 2)
	require.Eventually(t, func() bool { return slices.Contains(c.Addrs(), b.Addr) }, 10*time.Second, time.Millisecond,
		"the view is learned in the background")
	require.Equal(t, a.Addr, c.Addrs()[0], "the given address first")

	a.Stop()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := c.NewProducer().Send(ctx, &core.Message{Topic: "t", Body: []byte("after")})
		return err == nil
	}, 20*time.Second, 10*time.Millisecond, "the client reconnected to the node it learned")
	res, err := b.Store.Read(t.Context(), core.ReadRequest{Topic: "t", Offset: 0, MaxCount: 10})
	require.NoError(t, err)
	require.NotEmpty(t, res.Messages, "stored on b")
}

// A Cluster given one address with Discover adds the nodes it names, each
// with a connection and a breaker, and sends to them.
func TestClusterDiscover(t *testing.T) {
	a, b := twoNodes(t)
	cl, err := client.DialCluster(t.Context(), client.ClusterOptions{Addrs: []string{a.Addr}, Discover: true,
		Client: client.Options{DiscoverEvery: 50 * time.Millisecond}})
	require.NoError(t, err)
	defer cl.Close()
	require.Eventually(t, func() bool {
		nodes := cl.Nodes()
		return len(nodes) == 2 && nodes[1].Addr == b.Addr && nodes[1].Connected
	}, 10*time.Second, 5*time.Millisecond, "b discovered and connected")
	for i := range 40 {
		_, err := cl.Send(t.Context(), &core.Message{Topic: "t", ShardingKey: fmt.Sprint(i), Body: []byte("x")})
		require.NoError(t, err)
	}
	require.Positive(t, cl.Nodes()[1].Sent, "the discovered node takes its keys")
}
