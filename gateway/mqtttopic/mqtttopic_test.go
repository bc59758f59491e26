package mqtttopic

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMatch(t *testing.T) {
	cases := []struct {
		filter, name string
		want         bool
	}{
		{"#", "a", true},
		{"#", "a/b/c", true},
		{"#", "$SYS/x", false}, // [MQTT-4.7.2-1]
		{"+/x", "$SYS/x", false},
		{"$SYS/#", "$SYS/x", true},
		{"a/#", "a", true}, // [MQTT-4.7.1-2]
		{"a/#", "a/b/c", true},
		{"a/#", "ab", false},
		{"a/+", "a/b", true},
		{"a/+", "a", false},
		{"a/+", "a/b/c", false},
		{"a/+/c", "a/b/c", true},
		{"a/+/c", "a/b/d", false},
		{"+", "", true},
		{"+/+", "/x", true},
		{"a/b", "a/b", true},
		{"a/b", "a/b/", false},
		{"a/b/", "a/b/", true},
	}
	for _, c := range cases {
		require.Equal(t, c.want, Match(c.filter, c.name), "%q ~ %q", c.filter, c.name)
	}
}

func TestValidFilter(t *testing.T) {
	for _, f := range []string{"#", "a/#", "+", "a/+/b", "$SYS/#", "a//b"} {
		require.NoError(t, ValidFilter(f), f)
	}
	for _, f := range []string{"", "a#", "a/#/b", "a+", "a/b+/c", "#/a", "a/\x00"} {
		require.Error(t, ValidFilter(f), f)
	}
}

func TestP2PTarget(t *testing.T) {
	id, ok := P2PTarget(P2P + "car-7")
	require.True(t, ok)
	require.Equal(t, "car-7", id)
	for _, name := range []string{P2P, "cars/car-7", Internal + "down/x"} {
		_, ok := P2PTarget(name)
		require.False(t, ok, name)
	}
}

func TestUnshare(t *testing.T) {
	for _, c := range []struct{ in, group, filter string }{
		{"$share/g/a/#", "g", "a/#"},
		{"$SHARE/g/$ferrymq/p2p/x", "g", "$ferrymq/p2p/x"}, // mochi reads the prefix in any case
		{"$Share/g", "g", ""},
	} {
		g, f, ok := Unshare(c.in)
		require.True(t, ok, c.in)
		require.Equal(t, c.group, g, c.in)
		require.Equal(t, c.filter, f, c.in)
	}
	for _, f := range []string{"a/#", "$shared/g/a", "$share", "$queue/a"} {
		_, got, ok := Unshare(f)
		require.False(t, ok, f)
		require.Equal(t, f, got)
	}
}

// FuzzMatch: matching never panics on any input.
func FuzzMatch(f *testing.F) {
	f.Add("a/+/#", "a/b/c")
	f.Add("#", "$SYS")
	f.Fuzz(func(t *testing.T, filter, name string) {
		if ValidFilter(filter) == nil {
			_ = Match(filter, name)
		}
	})
}

func TestDelayed(t *testing.T) {
	topic, d, ok, err := Delayed("$delayed/90/cars/42/cmd")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "cars/42/cmd", topic)
	require.Equal(t, 90*time.Second, d)
	topic, d, ok, err = Delayed("$delayed/0/a")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "a", topic)
	require.Zero(t, d)

	_, _, ok, err = Delayed("cars/42")
	require.False(t, ok)
	require.NoError(t, err)
	for _, bad := range []string{"$delayed/", "$delayed/10", "$delayed/10/", "$delayed/-5/a", "$delayed/+5/a",
		"$delayed/abc/a", "$delayed/1.5/a", "$delayed//a", "$delayed/99999999999999999999/a", "$delayed/10/a/+",
		"$delayed/10/a/#", "$delayed/10/$SYS/x", "$delayed/10/$delayed/5/a"} {
		_, _, ok, err := Delayed(bad)
		require.True(t, ok, bad)
		require.ErrorIs(t, err, ErrBadDelayed, bad)
	}
}

// FuzzDelayed: parsing never panics, and what it accepts is a topic name
// under the prefix.
func FuzzDelayed(f *testing.F) {
	f.Add("$delayed/10/a/b")
	f.Add("$delayed/x/a")
	f.Add("$delayed/")
	f.Fuzz(func(t *testing.T, name string) {
		topic, d, ok, err := Delayed(name)
		if !ok || err != nil {
			return
		}
		if d < 0 || topic == "" || !strings.HasSuffix(name, "/"+topic) {
			t.Fatalf("Delayed(%q) = %q, %v", name, topic, d)
		}
	})
}
