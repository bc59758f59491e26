package topictree

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// collect records what a match visits; members accept in turn unless
// refused says otherwise.
type collect struct {
	subs    []string
	members []string
	refused map[string]bool
}

func (c *collect) Subscription(v string, o Options) { c.subs = append(c.subs, v) }
func (c *collect) Member(g, _ string, v string, o Options) bool {
	if c.refused[v] {
		return false
	}
	c.members = append(c.members, g+":"+v)
	return true
}

func match(t *Tree[string], topic string) []string {
	var c collect
	t.Match(topic, &c)
	sort.Strings(c.subs)
	return c.subs
}

func TestMatchAgreesWithTheSpec(t *testing.T) {
	filters := []string{"#", "+", "a", "a/#", "a/+", "a/b", "a/+/c", "+/+/c", "a/b/c", "+/#", "$SYS/#", "$SYS/+",
		"a//c", "a/+/+", "/a", "+/a", "a/b/#", "x/y/z/#"}
	topics := []string{"a", "a/b", "a/b/c", "a//c", "/a", "$SYS/uptime", "$SYS", "b", "x/y/z", "x/y/z/w", "a/", "", "/"}
	var tr Tree[string]
	for _, f := range filters {
		require.False(t, tr.Add(f, f, Options{}))
	}
	require.Equal(t, len(filters), tr.Len())
	for _, topic := range topics {
		var want []string
		for _, f := range filters {
			if mqtttopic.Match(f, topic) {
				want = append(want, f)
			}
		}
		sort.Strings(want)
		require.Equal(t, want, match(&tr, topic), "topic %q", topic)
	}
	// [MQTT-4.7.2-1]: $-topics are not matched by leading wildcards.
	require.Equal(t, []string{"$SYS/#", "$SYS/+"}, match(&tr, "$SYS/uptime"))
}

func TestAddReplacesAndRemovePrunes(t *testing.T) {
	var tr Tree[string]
	require.False(t, tr.Add("devices/car-1/cmd", "car-1", Options{QoS: 1}))
	require.True(t, tr.Add("devices/car-1/cmd", "car-1", Options{QoS: 2}), "a second subscribe replaces [MQTT-3.8.4-3]")
	require.Equal(t, 1, tr.Len())
	var got []Options
	tr.Match("devices/car-1/cmd", visitFunc(func(v string, o Options) { got = append(got, o) }))
	require.Equal(t, []Options{{QoS: 2}}, got)

	require.False(t, tr.Remove("devices/car-2/cmd", "car-1"))
	require.True(t, tr.Remove("devices/car-1/cmd", "car-1"))
	require.False(t, tr.Remove("devices/car-1/cmd", "car-1"))
	require.Zero(t, tr.Len())
	require.Empty(t, tr.root.kids, "empty nodes are pruned")
	require.Nil(t, tr.root.index)
}

func TestWideLevelsAreIndexed(t *testing.T) {
	var tr Tree[string]
	for i := range 100 {
		tr.Add(fmt.Sprintf("devices/car-%d/cmd", i), fmt.Sprint(i), Options{})
	}
	dev := tr.root.child("devices")
	require.NotNil(t, dev.index)
	require.Equal(t, []string{"42"}, match(&tr, "devices/car-42/cmd"))
	for i := range 100 {
		require.True(t, tr.Remove(fmt.Sprintf("devices/car-%d/cmd", i), fmt.Sprint(i)))
	}
	require.Nil(t, tr.root.child("devices"))
}

func TestSharedGroupsTakeTurns(t *testing.T) {
	var tr Tree[string]
	tr.Add("$share/g/jobs/+", "m1", Options{})
	tr.Add("$share/g/jobs/+", "m2", Options{})
	tr.Add("$SHARE/h/jobs/#", "m3", Options{})
	tr.Add("jobs/+", "plain", Options{})
	seen := map[string]int{}
	for range 10 {
		var c collect
		tr.Match("jobs/1", &c)
		require.Equal(t, []string{"plain"}, c.subs)
		require.Len(t, c.members, 2, "one member of each group: %v", c.members)
		for _, m := range c.members {
			seen[m]++
		}
	}
	require.Equal(t, map[string]int{"g:m1": 5, "g:m2": 5, "h:m3": 10}, seen)

	// A member that refuses (offline) passes its turn on.
	c := collect{refused: map[string]bool{"m1": true}}
	for range 3 {
		tr.Match("jobs/1", &c)
	}
	require.NotContains(t, c.members, "g:m1")
	require.Contains(t, c.members, "g:m2")

	require.True(t, tr.Remove("$share/g/jobs/+", "m1"))
	require.True(t, tr.Remove("$share/g/jobs/+", "m2"))
	require.False(t, tr.Remove("$share/g/jobs/+", "m2"))
	var filters []string
	tr.Filters(func(f, v string, _ Options) { filters = append(filters, f+"="+v) })
	slices.Sort(filters)
	require.Equal(t, []string{"$share/h/jobs/#=m3", "jobs/+=plain"}, filters)
}

type visitFunc func(v string, o Options)

func (f visitFunc) Subscription(v string, o Options)            { f(v, o) }
func (f visitFunc) Member(string, string, string, Options) bool { return false }

// FuzzMatch checks the trie against mqtttopic.Match, the reference
// matcher, for arbitrary filters and topic names.
func FuzzMatch(f *testing.F) {
	for _, s := range []string{"a/+/c|a/b/c", "#|$SYS/x", "a/#|a", "+/+|/", "a//c|a//c", "+|", "$share/g/a/#|a/b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		filtersPart, topic, _ := strings.Cut(s, "|")
		var tr Tree[string]
		var filters []string
		for _, fl := range strings.Split(filtersPart, ",") {
			if _, inner, shared := splitShare(fl); shared && (inner == "" || mqtttopic.ValidFilter(inner) != nil) {
				continue
			}
			if mqtttopic.ValidFilter(fl) != nil || strings.ContainsAny(topic, "+#") {
				continue
			}
			tr.Add(fl, fl, Options{})
			filters = append(filters, fl)
		}
		var want []string
		for _, fl := range filters {
			_, inner, _ := splitShare(fl)
			if mqtttopic.Match(inner, topic) && !slices.Contains(want, fl) {
				want = append(want, fl)
			}
		}
		var c collect
		tr.Match(topic, &c)
		got := c.subs
		for _, m := range c.members {
			got = append(got, m[strings.Index(m, ":")+1:])
		}
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(want, got) {
			t.Fatalf("filters %q topic %q: want %q, got %q", filters, topic, want, got)
		}
		for _, fl := range filters {
			tr.Remove(fl, fl)
		}
		if tr.Len() != 0 || len(tr.root.kids) != 0 || tr.root.index != nil || tr.root.plus != nil || tr.root.hash != nil {
			t.Fatalf("tree not empty after removing every filter")
		}
	})
}

func BenchmarkMatch(b *testing.B) {
	var tr Tree[int]
	for i := range 100_000 {
		tr.Add(fmt.Sprintf("devices/car-%d/cmd", i), i, Options{QoS: 1})
	}
	tr.Add("devices/+/cmd", -1, Options{})
	tr.Add("#", -2, Options{})
	n := 0
	vis := countVisitor{n: &n}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tr.Match("devices/car-4242/cmd", vis)
	}
	if n != 3*b.N {
		b.Fatalf("matched %d for %d", n, b.N)
	}
}

type countVisitor struct{ n *int }

func (c countVisitor) Subscription(int, Options)                { *c.n++ }
func (c countVisitor) Member(string, string, int, Options) bool { return true }
