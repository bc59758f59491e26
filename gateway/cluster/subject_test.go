package cluster

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

const pfx = DefaultPrefix

func TestSubject(t *testing.T) {
	for _, tc := range []struct{ topic, subject string }{
		{"cars/c1/cmd", "fmqmqtt.cars.c1.cmd"},
		{"a", "fmqmqtt.a"},
		{"A-b_9", "fmqmqtt.A-b_9"},
		{"a.b/ /x", "fmqmqtt.~YS5i.~IA.x"},
		{"a//b", "fmqmqtt.a.~.b"},
		{"/", "fmqmqtt.~.~"},
		{"/lead", "fmqmqtt.~.lead"},
		{"trail/", "fmqmqtt.trail.~"},
		{"*/>", "fmqmqtt.~Kg.~Pg"},
		{"x/$y", "fmqmqtt.x.~JHk"},
		{"~", "fmqmqtt.~fg"},
		{"ünï/😀", "fmqmqtt.~w7xuw68.~8J-YgA"},
	} {
		t.Run(tc.topic, func(t *testing.T) {
			s, ok := Subject(pfx, tc.topic)
			require.True(t, ok)
			require.Equal(t, tc.subject, s)
			require.True(t, server.IsValidLiteralSubject(s), s)
			back, err := Topic(pfx, s)
			require.NoError(t, err)
			require.Equal(t, tc.topic, back)
		})
	}
}

func TestSubjectNotRouted(t *testing.T) {
	for _, topic := range []string{"", "$SYS/x", "$ferrymq/p2p/c1", "$delayed/10/a", "a/+", "a/#"} {
		_, ok := Subject(pfx, topic)
		require.False(t, ok, topic)
	}
}

func TestTopicRejects(t *testing.T) {
	for _, s := range []string{
		"", "fmqmqtt", "fmqmqtt.", "other.a", "fmqmqtt..a", "fmqmqtt.a.*", "fmqmqtt.a.>",
		"fmqmqtt.~YQ",    // "a" encoded: not canonical (a plain level is never encoded)
		"fmqmqtt.~YS5",   // base64 with stray bits
		"fmqmqtt.~YS5i=", // padding
		"fmqmqtt.a b",
		"fmqmqtt.~JA", // "$": the topic would start with '$'
	} {
		_, err := Topic(pfx, s)
		require.ErrorIs(t, err, ErrNotRouted, s)
	}
}

func TestFilterSubjects(t *testing.T) {
	for _, tc := range []struct {
		filter   string
		subjects []string
	}{
		{"cars/+/cmd", []string{"fmqmqtt.cars.*.cmd"}},
		{"jobs/#", []string{"fmqmqtt.jobs", "fmqmqtt.jobs.>"}},
		{"#", []string{"fmqmqtt.>"}},
		{"+", []string{"fmqmqtt.*"}},
		{"+/#", []string{"fmqmqtt.*", "fmqmqtt.*.>"}},
		{"a b/+/#", []string{"fmqmqtt.~YSBi.*", "fmqmqtt.~YSBi.*.>"}},
		{"/#", []string{"fmqmqtt.~", "fmqmqtt.~.>"}},
	} {
		got, ok := FilterSubjects(pfx, tc.filter)
		require.True(t, ok, tc.filter)
		require.Equal(t, tc.subjects, got, tc.filter)
		for _, s := range got {
			require.True(t, server.IsValidSubject(s), s)
		}
	}
	for _, f := range []string{"", "$SYS/#", "$share/g/a", "a/#/b", "a+/b", "a/b#"} {
		_, ok := FilterSubjects(pfx, f)
		require.False(t, ok, f)
	}
}

func TestQueues(t *testing.T) {
	require.Equal(t, "fmqmqtt.node.gw-1", nodeQueue(pfx, "gw-1"))
	require.Equal(t, "fmqmqtt.node.~Z3cgMQ", nodeQueue(pfx, "gw 1"))
	a := shareQueue(pfx, "g", "$share/g/jobs/#")
	require.True(t, strings.HasPrefix(a, "fmqmqtt.share.g."), a)
	require.Equal(t, a, shareQueue(pfx, "g", "$share/g/jobs/#"), "the same on every node")
	require.NotEqual(t, a, shareQueue(pfx, "g", "$share/g/jobs/+"))
	require.NotContains(t, shareQueue(pfx, "a b\tc", "$share/a b\tc/x"), " ")
}

// FuzzSubject: every routed topic maps to a valid literal subject of
// tokens that Topic maps back; distinct topics never share a subject
// (Topic is a function of the subject, so a round trip proves it).
func FuzzSubject(f *testing.F) {
	for _, s := range []string{"cars/c1/cmd", "a//b", "/", "a.b/ /x", "*/>", "ünï/😀", "~", "x/$y", "\x00", "\xff/\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		s, ok := Subject(pfx, topic)
		if ok != Routed(topic) {
			t.Fatalf("Subject(%q) ok=%v", topic, ok)
		}
		if !ok {
			return
		}
		if !server.IsValidLiteralSubject(s) {
			t.Fatalf("Subject(%q) = %q: not a valid literal subject", topic, s)
		}
		if n := strings.Count(s, "."); n != strings.Count(topic, "/")+1 {
			t.Fatalf("Subject(%q) = %q: %d tokens", topic, s, n)
		}
		back, err := Topic(pfx, s)
		if err != nil || back != topic {
			t.Fatalf("Topic(Subject(%q)) = %q, %v", topic, back, err)
		}
	})
}

// FuzzTopic: any subject either decodes to a topic that maps back to it
// exactly (only canonical subjects decode) or is ErrNotRouted; no panic.
func FuzzTopic(f *testing.F) {
	for _, s := range []string{"fmqmqtt.a", "fmqmqtt.~", "fmqmqtt.~YQ", "fmqmqtt.~YS5i.~IA.x", "fmqmqtt..", "x", "fmqmqtt.~~", "fmqmqtt.*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, subject string) {
		topic, err := Topic(pfx, subject)
		if err != nil {
			return
		}
		s, ok := Subject(pfx, topic)
		if !ok || s != subject {
			t.Fatalf("Topic(%q) = %q, which maps to %q, %v", subject, topic, s, ok)
		}
	})
}

// FuzzFilter: a filter's subjects match, with the NATS server's own
// matcher, exactly the subjects of the topics the filter matches
// (mqtttopic.Match), and never one subject twice.
func FuzzFilter(f *testing.F) {
	for _, c := range [][2]string{
		{"a/#", "a"}, {"a/#", "a/b/c"}, {"#", "x"}, {"+", ""}, {"+/+", "/"}, {"a/+/c", "a//c"},
		{"a.b/#", "a.b"}, {"*/x", "*/x"}, {"+/#", "a"}, {"a/b", "a/b/c"}, {"/#", "/"}, {"ü/+", "ü/😀"},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, filter, topic string) {
		subjects, ok := FilterSubjects(pfx, filter)
		if !ok {
			return
		}
		for _, s := range subjects {
			if !server.IsValidSubject(s) {
				t.Fatalf("FilterSubjects(%q): %q is not valid", filter, s)
			}
		}
		subject, ok := Subject(pfx, topic)
		if !ok {
			return
		}
		n := 0
		for _, s := range subjects {
			if server.SubjectMatchesFilter(subject, s) {
				n++
			}
		}
		if want := mqtttopic.Match(filter, topic); want != (n > 0) || n > 1 {
			t.Fatalf("filter %q topic %q: MQTT match %v, %d of %q match %q", filter, topic, want, n, subjects, subject)
		}
	})
}

// TestTable checks the route table against mqtttopic.Match on random
// filters and topics over a small alphabet (so that they meet).
func TestTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	levels := []string{"a", "b", "", "+", "#"}
	word := func(wild bool) string {
		n := 1 + rng.IntN(4)
		var ls []string
		for i := range n {
			l := levels[rng.IntN(len(levels))]
			if !wild && (l == "+" || l == "#") || l == "#" && i != n-1 {
				l = "a"
			}
			ls = append(ls, l)
		}
		return strings.Join(ls, "/")
	}
	var tb table
	var routes []*route
	for range 200 {
		r := &route{filter: word(true)}
		tb.insert(r)
		routes = append(routes, r)
	}
	for _, r := range routes[:100] { // removal prunes and keeps the rest
		tb.remove(r)
	}
	routes = routes[100:]
	require.Equal(t, 100, tb.n)
	for range 2000 {
		topic := word(false)
		got := map[*route]int{}
		tb.match(topic, func(r *route) { got[r]++ })
		for _, r := range routes {
			want := 0
			if mqtttopic.Match(r.filter, topic) {
				want = 1
			}
			require.Equal(t, want, got[r], "filter %q topic %q", r.filter, topic)
		}
	}
	for _, r := range routes {
		tb.remove(r)
	}
	require.Zero(t, tb.n)
	require.Empty(t, tb.root.children)
}

func BenchmarkSubject(b *testing.B) {
	for _, tc := range []struct{ name, topic string }{
		{"plain", "cars/c00042/telemetry/engine"},
		{"escaped", "fleet.eu/vehicle 42/ünï/status"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.topic)))
			for b.Loop() {
				if _, ok := Subject(pfx, tc.topic); !ok {
					b.Fatal("not routed")
				}
			}
		})
	}
	b.Run("topic", func(b *testing.B) {
		s, _ := Subject(pfx, "fleet.eu/vehicle 42/ünï/status")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Topic(pfx, s); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkTableMatch(b *testing.B) {
	var tb table
	for i := range 10000 {
		tb.insert(&route{filter: fmt.Sprintf("cars/c%05d/cmd", i)})
	}
	tb.insert(&route{filter: "cars/+/telemetry/#"})
	tb.insert(&route{filter: "jobs/#", group: "g"})
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		tb.match("cars/c04242/cmd", func(*route) { n++ })
	}
}
