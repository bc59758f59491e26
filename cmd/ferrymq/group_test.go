package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/wire"
)

// lagOf returns `group lag --json` for topic's queues, or nil if the
// command failed (the group may be between members).
func lagOf(t testing.TB, addr, group, member, topic string) []wire.QueueLag {
	t.Helper()
	args := []string{"group", "lag", "--group", group, "--json", "--server", addr}
	if member != "" {
		args = append(args, "--member", member)
	}
	r := cli(t, t.Context(), "", args...)
	if r.runErr != nil {
		return nil
	}
	var all, out []wire.QueueLag
	if json.Unmarshal([]byte(r.out), &all) != nil {
		return nil
	}
	for _, l := range all {
		if l.Topic == topic {
			out = append(out, l)
		}
	}
	return out
}

// caughtUp reports whether every queue of lags is fully committed (an
// empty queue may have no committed offset).
func caughtUp(lags []wire.QueueLag) bool {
	for _, l := range lags {
		if l.Lag != 0 || (l.Max > l.Min && l.Committed != l.Max) {
			return false
		}
	}
	return len(lags) > 0
}

func TestGroupCommands(t *testing.T) {
	addr := newServer(t)
	mustCLI(t, "", "topic", "create", "g", "--queues", "2", "--server", addr)
	produceN(t, addr, "g", "m", 6, 2)
	c := startCLI(t, "consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", "g", "--group", "billing", "--client-id", "member-1", "--json")
	require.Eventually(t, func() bool { return len(nonEmptyLines(c.out.String())) == 6 }, 10*time.Second, 10*time.Millisecond)

	// list
	r := mustCLI(t, "", "group", "list", "--server", addr)
	require.Equal(t, []string{"GROUP", "MODE", "MEMBER", "LAST", "HEARTBEAT", "QUEUES"}, strings.Fields(r.lines()[0]))
	require.Contains(t, r.out, "billing")
	require.Contains(t, r.out, "member-1")
	require.Contains(t, r.out, "g:0,1")
	var groups []wire.GroupInfo
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "", "group", "list", "--json", "--server", addr).out), &groups))
	require.Len(t, groups, 1)
	require.Equal(t, "billing", groups[0].Group)
	require.Equal(t, "clustering", groups[0].Mode)
	require.Len(t, groups[0].Members, 1)
	require.Equal(t, "member-1", groups[0].Members[0].ClientID)

	// lag
	require.Eventually(t, func() bool { return caughtUp(lagOf(t, addr, "billing", "", "g")) }, 10*time.Second, 20*time.Millisecond)
	lags := lagOf(t, addr, "billing", "", "g")
	require.Len(t, lags, 2)
	for _, l := range lags {
		require.Equal(t, "member-1", l.Owner)
	}
	r = mustCLI(t, "", "group", "lag", "--group", "billing", "--server", addr)
	require.Equal(t, []string{"TOPIC", "QUEUE", "COMMITTED", "MIN", "MAX", "LAG", "OWNER", "LAST", "CONSUMED"}, strings.Fields(r.lines()[0]))
	require.Contains(t, r.out, "member-1")
	require.True(t, strings.HasSuffix(r.out, "total lag 0\n"), r.out)

	// reset: the live member replays the topic.
	r = mustCLI(t, "", "group", "reset", "--group", "billing", "--topic", "g", "--to", "earliest", "--json", "--server", addr)
	require.JSONEq(t, `{"offsets":[0,0]}`, r.out)
	require.Eventually(t, func() bool { return len(nonEmptyLines(c.out.String())) == 12 }, 10*time.Second, 10*time.Millisecond)
	r = mustCLI(t, "", "group", "reset", "--group", "billing", "--topic", "g", "--to", "latest", "--server", addr)
	require.Contains(t, r.out, "group billing on topic g reset to latest\n")
	require.Contains(t, r.out, "QUEUE  OFFSET\n0      3\n1      3\n")
	require.NoError(t, c.stop(t))
	require.Empty(t, c.err.String())
}

func TestGroupLagOfBroadcastMember(t *testing.T) {
	addr := newServer(t)
	produceN(t, addr, "b", "m", 4, 2)
	c := startCLI(t, "consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", "b", "--group", "fanout", "--broadcast", "--client-id", "b1")
	require.Eventually(t, func() bool { return caughtUp(lagOf(t, addr, "fanout", "b1", "b")) }, 10*time.Second, 20*time.Millisecond)
	require.Len(t, nonEmptyLines(c.out.String()), 4)
	require.NoError(t, c.stop(t))
}

func TestGroupResetToTime(t *testing.T) {
	addr := newServer(t)
	mustCLI(t, "", "topic", "create", "t", "--queues", "1", "--server", addr)
	produceN(t, addr, "t", "old", 3, 1)
	cut := time.Now()
	produceN(t, addr, "t", "new", 2, 1)
	r := mustCLI(t, "", "group", "reset", "--group", "g", "--topic", "t", "--to", cut.Format(time.RFC3339Nano), "--json", "--server", addr)
	require.JSONEq(t, `{"offsets":[3]}`, r.out)
	r = mustCLI(t, "", "consume", "--heartbeat-interval", "100ms", "--server", addr, "--topic", "t", "--group", "g", "--json", "--count", "2")
	require.Equal(t, []string{"new0", "new1"}, bodiesOf(parseRecords(t, r.out)))
}

func TestGroupErrors(t *testing.T) {
	addr := newServer(t)
	mustCLI(t, "", "topic", "create", "t", "--server", addr)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"lag of a group without members", []string{"lag", "--group", "nobody"}, "group nobody has no live members"},
		{"lag without group", []string{"lag"}, `required flag(s) "group" not set`},
		{"reset without to", []string{"reset", "--group", "g", "--topic", "t"}, `required flag(s) "to" not set`},
		{"reset to nonsense", []string{"reset", "--group", "g", "--topic", "t", "--to", "yesterday"}, `--to "yesterday": want earliest, latest or an RFC 3339 time`},
		{"reset unknown topic", []string{"reset", "--group", "g", "--topic", "nope", "--to", "latest"}, `reset g on nope: topic not found: "nope"`},
		{"reset invalid group", []string{"reset", "--group", "a b", "--topic", "t", "--to", "latest"}, "invalid group or client id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"group"}, tc.args...), "--server", addr)
			requireOneLineError(t, cli(t, t.Context(), "", args...), tc.want)
		})
	}
}
