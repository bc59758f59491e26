package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// produceN sends n messages "<prefix><i>" (i from 0) to topic, keyed
// key-<i%keys>, and returns their IDs.
func produceN(t testing.TB, addr, topic, prefix string, n, keys int) []string {
	t.Helper()
	var ids []string
	for k := range keys {
		var in strings.Builder
		for i := k; i < n; i += keys {
			fmt.Fprintf(&in, "%s%d\n", prefix, i)
		}
		r := mustCLI(t, in.String(), "produce", "--server", addr, "--topic", topic, "--key", "key-"+strconv.Itoa(k), "-")
		ids = append(ids, r.lines()...)
	}
	require.Len(t, ids, n)
	return ids
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// The tests run consumers with --heartbeat-interval 100ms: servertest
// expires members silent for 500 ms, sooner than the default 1 s allows.

func TestConsumeJSON(t *testing.T) {
	addr := newServer(t)
	mustCLI(t, "", "topic", "create", "c", "--queues", "4", "--server", addr)
	mustCLI(t, "", "produce", "--server", addr, "--topic", "c", "--key", "car-1", "--tag", "created", "--prop", "a=1", "tagged")
	mustCLI(t, "", "produce", "--server", addr, "--topic", "c", "\xffbinary")
	produceN(t, addr, "c", "m", 10, 3)

	r := mustCLI(t, "", "consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", "c", "--group", "g", "--json", "--count", "12")
	recs := parseRecords(t, r.out)
	require.Len(t, recs, 12)
	got := map[string]record{}
	for _, rec := range recs {
		require.Equal(t, "c", rec.Topic)
		require.NotContains(t, got, rec.ID, "no duplicates")
		got[rec.Body] = rec
	}
	tagged := got["tagged"]
	require.Equal(t, "car-1", tagged.Key)
	require.Equal(t, []string{"created"}, tagged.Tags)
	require.Equal(t, map[string]string{"a": "1"}, tagged.Props)
	require.False(t, tagged.BornAt.IsZero())
	require.False(t, tagged.StoredAt.Before(tagged.BornAt))
	bin := got["/2JpbmFyeQ=="]
	require.True(t, bin.BodyBase64, "non-UTF-8 body as base64")
	require.Equal(t, []string{}, bin.Tags)
	require.Equal(t, map[string]string{}, bin.Props)
	for _, b := range names("m", 10) {
		require.Contains(t, got, b)
	}

	// Per queue, offsets come in order.
	last := map[int]int64{}
	for _, rec := range recs {
		if prev, ok := last[rec.Queue]; ok {
			require.Greater(t, rec.Offset, prev)
		}
		last[rec.Queue] = rec.Offset
	}

	// Without --json: one readable line per message.
	produceN(t, addr, "c", "h", 2, 1)
	r = mustCLI(t, "", "consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", "c", "--group", "g", "--count", "2")
	lines := r.lines()
	require.Len(t, lines, 2)
	require.Contains(t, lines[0], `body="h0"`)
	require.Contains(t, lines[0], "key=key-0")
	require.True(t, strings.HasPrefix(lines[0], "c/"), lines[0])
}

// TestConsumeCountIsExact checks that --count prints exactly that many
// messages while more are available, and that the group's next consumer
// gets exactly the rest: nothing printed twice, nothing skipped.
func TestConsumeCountIsExact(t *testing.T) {
	addr := newServer(t)
	for _, mode := range []struct {
		name  string
		flags []string
	}{
		{"clustering", nil},
		{"orderly", []string{"--orderly"}},
		{"pop", []string{"--pop"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			topic := "exact-" + mode.name
			mustCLI(t, "", "topic", "create", topic, "--queues", "4", "--server", addr)
			produceN(t, addr, topic, "m", 60, 6)
			args := append([]string{"consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", topic, "--group", "g", "--json"}, mode.flags...)
			var recs []record
			for _, n := range []int{1, 7, 30} {
				r := mustCLI(t, "", append(args, "--count", strconv.Itoa(n))...)
				got := parseRecords(t, r.out)
				require.Len(t, got, n)
				recs = append(recs, got...)
			}
			r := mustCLI(t, "", append(args, "--count", "22")...)
			recs = append(recs, parseRecords(t, r.out)...)
			r = mustCLI(t, "", append(args, "--idle-timeout", "300ms")...)
			require.Empty(t, r.out, "nothing left")
			seen := bodiesOf(recs)
			slices.Sort(seen)
			want := names("m", 60)
			slices.Sort(want)
			require.Equal(t, want, seen, "every message exactly once")
			for _, rec := range recs {
				require.Zero(t, rec.Reconsume, "nothing went through the retry path")
			}
		})
	}
}

func TestConsumeOrderly(t *testing.T) {
	addr := newServer(t)
	mustCLI(t, "", "topic", "create", "o", "--queues", "2", "--server", addr)
	produceN(t, addr, "o", "", 40, 4) // bodies are sequence numbers; 4 keys
	r := mustCLI(t, "", "consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", "o", "--group", "g", "--orderly", "--json", "--count", "40")
	recs := parseRecords(t, r.out)
	require.Len(t, recs, 40)
	last := map[string]int{}
	for _, rec := range recs {
		n, err := strconv.Atoi(rec.Body)
		require.NoError(t, err)
		if prev, ok := last[rec.Key]; ok {
			require.Greater(t, n, prev, "per-key order kept")
		}
		last[rec.Key] = n
	}
}

func TestConsumeBroadcast(t *testing.T) {
	addr := newServer(t)
	produceN(t, addr, "b", "m", 12, 3)
	args := []string{"consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", "b", "--group", "everyone", "--broadcast", "--json"}
	// Two members each get every message.
	one := startCLI(t, append(args, "--client-id", "one", "--count", "12")...)
	two := startCLI(t, append(args, "--client-id", "two", "--count", "12")...)
	for _, b := range []*background{one, two} {
		require.Eventually(t, func() bool { return len(nonEmptyLines(b.out.String())) == 12 }, 10*time.Second, 10*time.Millisecond)
	}
	require.NoError(t, one.stop(t))
	require.NoError(t, two.stop(t))
	for _, b := range []*background{one, two} {
		got := bodiesOf(parseRecords(t, b.out.String()))
		slices.Sort(got)
		want := names("m", 12)
		slices.Sort(want)
		require.Equal(t, want, got)
	}

	// A member's progress is its own: "one" has seen everything, a new
	// member starts from the earliest message.
	r := mustCLI(t, "", append(args, "--client-id", "one", "--idle-timeout", "400ms")...)
	require.Empty(t, r.out)
	r = mustCLI(t, "", append(args, "--client-id", "three", "--count", "12")...)
	require.Len(t, r.lines(), 12)
}

func TestConsumeIdleTimeout(t *testing.T) {
	addr := newServer(t)
	mustCLI(t, "", "topic", "create", "quiet", "--server", addr)
	for _, mode := range [][]string{nil, {"--pop"}} {
		start := time.Now()
		r := mustCLI(t, "", append([]string{"consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", "quiet", "--group", "g", "--idle-timeout", "300ms"}, mode...)...)
		require.Empty(t, r.out)
		require.Less(t, time.Since(start), 5*time.Second)
	}

	// The idle timer restarts with every message.
	produceN(t, addr, "quiet", "m", 3, 1)
	r := mustCLI(t, "", "consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", "quiet", "--group", "g", "--idle-timeout", "2s")
	require.Len(t, r.lines(), 3)
}

// TestConsumeInterrupt cancels a running consumer, as SIGINT does through
// main's signal context: it exits 0 and has committed what it printed.
func TestConsumeInterrupt(t *testing.T) {
	addr := newServer(t)
	for _, mode := range []struct {
		group string
		flags []string
	}{{"push", nil}, {"pop", []string{"--pop"}}} {
		topic := "live-" + mode.group
		mustCLI(t, "", "topic", "create", topic, "--queues", "2", "--server", addr)
		c := startCLI(t, append([]string{"consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", topic, "--group", mode.group}, mode.flags...)...)
		produceN(t, addr, topic, "m", 5, 2)
		require.Eventually(t, func() bool { return len(nonEmptyLines(c.out.String())) == 5 }, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, c.stop(t))
		require.Empty(t, c.err.String())

		r := mustCLI(t, "", append([]string{"consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", topic, "--group", mode.group, "--idle-timeout", "400ms"}, mode.flags...)...)
		require.Empty(t, r.out, "%s: progress was committed", mode.group)
	}
}

func TestConsumeFrom(t *testing.T) {
	addr := newServer(t)
	mustCLI(t, "", "topic", "create", "f", "--queues", "2", "--server", addr)
	produceN(t, addr, "f", "old", 4, 2)
	cut := time.Now()
	produceN(t, addr, "f", "new", 4, 2)
	args := []string{"consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", "f", "--json"}

	// A time resets the group's offsets to it, whatever it consumed before.
	mustCLI(t, "", append(args, "--group", "t", "--count", "8")...)
	r := mustCLI(t, "", append(args, "--group", "t", "--count", "4", "--from", cut.Format(time.RFC3339Nano))...)
	got := bodiesOf(parseRecords(t, r.out))
	slices.Sort(got)
	require.Equal(t, []string{"new0", "new1", "new2", "new3"}, got)

	// latest: a new group skips the backlog.
	r = mustCLI(t, "", append(args, "--group", "l", "--from", "latest", "--idle-timeout", "400ms")...)
	require.Empty(t, r.out)
	// earliest (the default): a new group reads it all.
	r = mustCLI(t, "", append(args, "--group", "e", "--from", "earliest", "--count", "8")...)
	require.Len(t, r.lines(), 8)
	// POP with a time.
	r = mustCLI(t, "", append(args, "--group", "p", "--pop", "--count", "4", "--from", cut.Format(time.RFC3339Nano))...)
	got = bodiesOf(parseRecords(t, r.out))
	slices.Sort(got)
	require.Equal(t, []string{"new0", "new1", "new2", "new3"}, got)
}

func TestConsumeBadInput(t *testing.T) {
	addr := newServer(t)
	base := []string{"consume", "--heartbeat-interval", "100ms", "--server", addr}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing topic", []string{"--group", "g"}, `required flag(s) "topic" not set`},
		{"missing group", []string{"--topic", "t"}, `required flag(s) "group" not set`},
		{"bad from", []string{"--topic", "t", "--group", "g", "--from", "yesterday"}, `--from "yesterday": want earliest, latest or an RFC 3339 time`},
		{"orderly broadcast", []string{"--topic", "t", "--group", "g", "--orderly", "--broadcast"}, "--orderly needs clustering mode"},
		{"pop broadcast", []string{"--topic", "t", "--group", "g", "--pop", "--broadcast"}, "--pop and --broadcast do not mix"},
		{"pop latest", []string{"--topic", "t", "--group", "g", "--pop", "--from", "latest"}, "--from latest does not apply to --pop"},
		{"negative count", []string{"--topic", "t", "--group", "g", "--count", "-1"}, "--count must not be negative"},
		{"two problems", []string{"--topic", "t", "--group", "g", "--count", "-1", "--idle-timeout", "-1s"}, "--count must not be negative, got -1; --idle-timeout"},
		{"argument", []string{"--topic", "t", "--group", "g", "extra"}, `unknown command "extra"`},
		{"bad group", []string{"--topic", "t", "--group", "no spaces"}, "join group no spaces: invalid group or client id"},
		{"from time on unknown topic", []string{"--topic", "nope", "--group", "g", "--from", "2024-01-01T00:00:00Z"}, `reset offsets of g on nope: topic not found: "nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cli(t, t.Context(), "", append(slices.Clone(base), tc.args...)...)
			requireOneLineError(t, r, tc.want)
			require.Empty(t, r.out)
		})
	}
}

func TestConsumeWaitsForTopic(t *testing.T) {
	addr := newServer(t)
	for _, mode := range []struct {
		name  string
		flags []string
	}{{"push", nil}, {"pop", []string{"--pop"}}} {
		topic := "later-" + mode.name
		c := startCLI(t, append([]string{"consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", topic,
			"--group", "g", "--count", "2"}, mode.flags...)...)
		require.Never(t, func() bool { return c.out.String() != "" }, 300*time.Millisecond, 20*time.Millisecond)
		produceN(t, addr, topic, "m", 2, 1)
		require.Eventually(t, func() bool { return len(nonEmptyLines(c.out.String())) == 2 }, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, c.stop(t))
		require.Empty(t, c.err.String())
	}
}
