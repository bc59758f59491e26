package jetstream

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestUntoken: token's inverse gives every name back, and refuses what
// token never makes.
func TestUntoken(t *testing.T) {
	for _, name := range []string{"", "billing", "group.billing-2", "a_b", "%RETRY%x", "ünï"} {
		got, ok := untoken(token(name))
		require.True(t, ok, name)
		require.Equal(t, name, got)
	}
	for _, bad := range []string{"_", "_4", "x_zz", "_G0"} {
		_, ok := untoken(bad)
		require.False(t, ok, bad)
	}
}
