package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/server/servertest"
)

// getRecord fetches a message with `msg get --json`.
func getRecord(t testing.TB, addr, id string) record {
	t.Helper()
	r := mustCLI(t, "", "msg", "get", id, "--json", "--server", addr)
	recs := parseRecords(t, r.out)
	require.Len(t, recs, 1)
	return recs[0]
}

func TestProduceBody(t *testing.T) {
	addr := newServer(t)
	r := mustCLI(t, "", "produce", "--server", addr, "--topic", "p", "--key", "car-7", "--tag", "created",
		"--prop", "source=cli", "--prop", "expr=a=b", "hello world")
	require.Len(t, r.lines(), 1)
	m := getRecord(t, addr, r.lines()[0])
	require.Equal(t, "hello world", m.Body)
	require.Equal(t, "p", m.Topic)
	require.Equal(t, "car-7", m.Key)
	require.Equal(t, []string{"created"}, m.Tags)
	require.Equal(t, map[string]string{"source": "cli", "expr": "a=b"}, m.Props)
	require.Equal(t, 0, m.Reconsume)
	require.False(t, m.StoredAt.IsZero())

	// BODY with --count sends it that many times.
	r = mustCLI(t, "", "produce", "--server", addr, "--topic", "p", "--count", "3", "again")
	require.Len(t, r.lines(), 3)
	for _, id := range r.lines() {
		require.Equal(t, "again", getRecord(t, addr, id).Body)
	}

	// A body that is not UTF-8 comes back as base64.
	r = mustCLI(t, "", "produce", "--server", addr, "--topic", "p", "\xff\xfe\x00")
	m = getRecord(t, addr, r.lines()[0])
	require.True(t, m.BodyBase64)
	require.Equal(t, "//4A", m.Body)
}

func TestProduceStdinLines(t *testing.T) {
	addr := newServer(t)
	long := strings.Repeat("x", 200<<10) // beyond bufio.Scanner's default 64 KiB
	in := "first\nsecond\n\n" + long + "\nlast"
	r := mustCLI(t, in, "produce", "--server", addr, "--topic", "lines", "--key", "one-queue", "-")
	ids := r.lines()
	require.Len(t, ids, 5, "one message per line, the empty one included")
	want := []string{"first", "second", "", long, "last"}
	var prev int64 = -1
	for i, id := range ids {
		m := getRecord(t, addr, id)
		require.Equal(t, want[i], m.Body)
		require.Greater(t, m.Offset, prev, "stored in input order")
		prev = m.Offset
	}

	// Empty stdin sends nothing.
	r = mustCLI(t, "", "produce", "--server", addr, "--topic", "lines", "-")
	require.Empty(t, r.out)
}

func TestProduceGenerated(t *testing.T) {
	addr := newServer(t)
	r := mustCLI(t, "", "produce", "--server", addr, "--topic", "gen", "--count", "500", "--size", "100")
	ids := r.lines()
	require.Len(t, ids, 500)
	unique := map[string]bool{}
	for _, id := range ids {
		unique[id] = true
	}
	require.Len(t, unique, 500)
	first, last := getRecord(t, addr, ids[0]), getRecord(t, addr, ids[499])
	require.Len(t, first.Body, 100)
	require.True(t, strings.HasPrefix(first.Body, "1 "), first.Body)
	require.True(t, strings.HasPrefix(last.Body, "500 "), "IDs are printed in send order")

	r = mustCLI(t, "", "produce", "--server", addr, "--topic", "gen", "--count", "20", "--size", "8", "--quiet")
	require.Empty(t, r.out)
	var info struct{ Ranges []struct{ Min, Max int64 } }
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "", "topic", "describe", "gen", "--json", "--server", addr).out), &info))
	var total int64
	for _, q := range info.Ranges {
		total += q.Max - q.Min
	}
	require.EqualValues(t, 520, total)
}

func TestProduceStopsAtFirstFailure(t *testing.T) {
	addr := newServer(t)
	huge := strings.Repeat("y", 5<<20) // over the store's 4 MiB message limit
	r := cli(t, t.Context(), "ok\n"+huge+"\nlater\n", "produce", "--server", addr, "--topic", "f", "-")
	requireOneLineError(t, r, "first failure, message 2: message too large")
	require.NotEmpty(t, r.lines(), "the first message was stored and its ID printed")
	require.Equal(t, "ok", getRecord(t, addr, r.lines()[0]).Body)

	// A lone failing message reports just its error.
	requireOneLineError(t, cli(t, t.Context(), "", "produce", "--server", addr, "--topic", "no spaces", "x"),
		`Error: invalid topic name "no spaces"`)
}

func TestProduceBadInput(t *testing.T) {
	addr := newServer(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing topic", []string{"hello"}, `required flag(s) "topic" not set`},
		{"prop without value", []string{"--topic", "t", "--prop", "novalue", "x"}, `--prop "novalue": want NAME=VALUE`},
		{"prop without name", []string{"--topic", "t", "--prop", "=v", "x"}, `--prop "=v": want NAME=VALUE`},
		{"no body", []string{"--topic", "t"}, "no message body"},
		{"body and size", []string{"--topic", "t", "--size", "10", "x"}, "either BODY or --size"},
		{"stdin and count", []string{"--topic", "t", "--count", "2", "-"}, "do not apply to -"},
		{"zero count", []string{"--topic", "t", "--count", "0", "x"}, "--count must be at least 1"},
		{"negative size", []string{"--topic", "t", "--size", "-1"}, "--size must not be negative"},
		{"two bodies", []string{"--topic", "t", "a", "b"}, "accepts at most 1 arg(s), received 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"produce", "--server", addr}, tc.args...)
			r := cli(t, t.Context(), "", args...)
			requireOneLineError(t, r, tc.want)
			require.Empty(t, r.out)
		})
	}
}

// TestProduceAvoidsAFaultyNode: `ferrymq produce` given two nodes, one of
// whose stores refuses every write (fault injected in its broker), sends
// through a client.Cluster: every message is stored on the healthy node,
// none fails.
func TestProduceAvoidsAFaultyNode(t *testing.T) {
	good := servertest.Start(t, servertest.Options{})
	faults := &servertest.Faults{}
	faults.Set(servertest.FailProduce)
	bad := servertest.Start(t, servertest.Options{ServerBroker: faults.Wrap})
	t.Cleanup(func() { faults.Set(servertest.Healthy) })
	r := mustCLI(t, "", "produce", "--server", bad.Addr+","+good.Addr, "--topic", "p", "--count", "20", "through the breaker")
	require.Len(t, r.lines(), 20)
	for _, id := range r.lines() {
		require.Equal(t, "through the breaker", getRecord(t, good.Addr, id).Body)
	}
}
