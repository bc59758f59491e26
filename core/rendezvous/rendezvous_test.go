package rendezvous_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/rendezvous"
)

// TestPlacement: Pick is Rank's first; the keys spread over the nodes;
// removing a node moves only the keys it held, and adding one moves only
// keys to it.
func TestPlacement(t *testing.T) {
	nodes := []string{"gw-1", "gw-2", "gw-3"}
	const keys = 3000
	count := map[string]int{}
	before := map[string]string{}
	for k := range keys {
		key := fmt.Sprintf("group-%d", k)
		n := rendezvous.Pick(nodes, key)
		require.Equal(t, n, rendezvous.Rank(nodes, key)[0])
		require.ElementsMatch(t, nodes, rendezvous.Rank(nodes, key))
		count[n]++
		before[key] = n
	}
	for _, n := range nodes {
		require.InDelta(t, keys/3, count[n], keys/10, "node %s: %d of %d", n, count[n], keys)
	}
	for key, was := range before {
		now := rendezvous.Pick([]string{"gw-1", "gw-3"}, key)
		if was != "gw-2" {
			require.Equal(t, was, now, "%s moved although its node stayed", key)
		}
		grown := rendezvous.Pick([]string{"gw-1", "gw-2", "gw-3", "gw-4"}, key)
		require.Contains(t, []string{was, "gw-4"}, grown, "%s moved between old nodes", key)
	}
	require.Empty(t, rendezvous.Pick(nil, "x"))
}
