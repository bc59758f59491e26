package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/wire"
)

func TestTopicCommands(t *testing.T) {
	addr := newServer(t)
	r := mustCLI(t, "", "topic", "create", "orders", "--queues", "3", "--server", addr)
	require.Equal(t, "topic orders: 3 queues\n", r.out)
	// Creating it again with the same queue count is fine.
	mustCLI(t, "", "topic", "create", "orders", "--queues", "3", "--server", addr)

	var created wire.TopicInfo
	r = mustCLI(t, "", "topic", "create", "events", "--json", "--server", addr)
	require.NoError(t, json.Unmarshal([]byte(r.out), &created))
	require.Equal(t, "events", created.Name)
	require.Equal(t, 8, created.Queues, "the server's default")

	produceN(t, addr, "orders", "m", 5, 5)

	r = mustCLI(t, "", "topic", "list", "--server", addr)
	lines := r.lines()
	require.Equal(t, []string{"TOPIC", "QUEUES", "MESSAGES", "CREATED"}, strings.Fields(lines[0]))
	var row []string
	for _, l := range lines[1:] {
		if f := strings.Fields(l); f[0] == "orders" {
			row = f
		}
	}
	require.Equal(t, []string{"orders", "3", "5"}, row[:3])

	var list []wire.TopicInfo
	r = mustCLI(t, "", "topic", "list", "--json", "--server", addr)
	require.NoError(t, json.Unmarshal([]byte(r.out), &list))
	byName := map[string]wire.TopicInfo{}
	for _, ti := range list {
		byName[ti.Name] = ti
	}
	require.Contains(t, byName, "orders")
	require.Contains(t, byName, "events")
	require.Len(t, byName["orders"].Ranges, 3)

	r = mustCLI(t, "", "topic", "describe", "orders", "--server", addr)
	require.Contains(t, r.out, "topic     orders\nqueues    3\nmessages  5\n")
	require.Contains(t, r.out, "QUEUE  MIN  MAX  MESSAGES\n")

	var desc wire.TopicInfo
	r = mustCLI(t, "", "topic", "describe", "orders", "--json", "--server", addr)
	require.NoError(t, json.Unmarshal([]byte(r.out), &desc))
	require.Len(t, desc.Ranges, 3)
	var total int64
	for _, q := range desc.Ranges {
		total += q.Max - q.Min
	}
	require.EqualValues(t, 5, total)
}

func TestTopicErrors(t *testing.T) {
	addr := newServer(t)
	mustCLI(t, "", "topic", "create", "orders", "--queues", "3", "--server", addr)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"describe unknown", []string{"describe", "nope"}, `Error: topic not found: "nope"`},
		{"describe without name", []string{"describe"}, "accepts 1 arg(s), received 0"},
		{"create with other queue count", []string{"create", "orders", "--queues", "5"}, "create topic orders: topic exists"},
		{"create invalid name", []string{"create", "a/b"}, `invalid topic name "a/b"`},
		{"negative queues", []string{"create", "x", "--queues", "-1"}, "--queues must not be negative"},
		{"list with argument", []string{"list", "x"}, `unknown command "x" for "ferrymq topic list"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"topic"}, tc.args...), "--server", addr)
			r := cli(t, t.Context(), "", args...)
			requireOneLineError(t, r, tc.want)
		})
	}
	// No server: one line too.
	r := cli(t, t.Context(), "", "topic", "list", "--server", "127.0.0.1:1", "--timeout", "2s")
	requireOneLineError(t, r, "connect to 127.0.0.1:1")
}

func TestTopicDelete(t *testing.T) {
	addr := newServer(t)
	mustCLI(t, "", "produce", "--server", addr, "--topic", "gone", "--key", "k", "x")
	r := mustCLI(t, "", "topic", "delete", "gone", "--server", addr)
	require.Equal(t, "deleted topic gone\n", r.out)
	requireOneLineError(t, cli(t, t.Context(), "", "topic", "describe", "gone", "--server", addr), "topic not found")
	requireOneLineError(t, cli(t, t.Context(), "", "topic", "delete", "gone", "--server", addr), "topic not found")
	requireOneLineError(t, cli(t, t.Context(), "", "topic", "delete", "%DLQ%g", "--server", addr), "invalid topic name")
}
