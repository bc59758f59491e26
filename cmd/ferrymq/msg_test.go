package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

func TestMsgGet(t *testing.T) {
	addr := newServer(t)
	id := mustCLI(t, "", "produce", "--server", addr, "--topic", "m", "--key", "car-9", "--tag", "moved",
		"--prop", "speed=12", "two\nlines").lines()[0]

	r := mustCLI(t, "", "msg", "get", id, "--server", addr)
	for _, want := range []string{"id          " + id, "topic       m\n", "key         car-9\n", "tag         moved\n",
		"props       speed=12\n", `body        "two\nlines"`} {
		require.Contains(t, r.out, want)
	}

	rec := getRecord(t, addr, id)
	require.Equal(t, id, rec.ID)
	require.Equal(t, "two\nlines", rec.Body)

	// Errors.
	requireOneLineError(t, cli(t, t.Context(), "", "msg", "get", "abc", "--server", addr), `invalid message id: "abc"`)
	parsed, err := core.ParseMessageID(id)
	require.NoError(t, err)
	gone := core.NewCommitLogID(parsed.StoreID(), 1<<40, parsed.Size())
	requireOneLineError(t, cli(t, t.Context(), "", "msg", "get", gone.String(), "--server", addr), "get "+gone.String()+": ")
	requireOneLineError(t, cli(t, t.Context(), "", "msg", "get", "--server", addr), "accepts 1 arg(s), received 0")
}

func TestMsgFind(t *testing.T) {
	addr := newServer(t)
	want := produceN(t, addr, "m", "x", 3, 1) // key "key-0"
	produceN(t, addr, "m", "y", 2, 1)         // key "key-0" too
	mustCLI(t, "", "produce", "--server", addr, "--topic", "m", "--key", "other", "z")

	r := mustCLI(t, "", "msg", "find", "--topic", "m", "--key", "key-0", "--json", "--server", addr)
	recs := parseRecords(t, r.out)
	require.Len(t, recs, 5)
	for _, rec := range recs {
		require.Equal(t, "key-0", rec.Key)
	}
	require.Subset(t, idsOf(recs), want)

	r = mustCLI(t, "", "msg", "find", "--topic", "m", "--key", "key-0", "--max", "2", "--json", "--server", addr)
	require.Len(t, parseRecords(t, r.out), 2)

	r = mustCLI(t, "", "msg", "find", "--topic", "m", "--key", "other", "--server", addr)
	require.Len(t, r.lines(), 2)
	require.Equal(t, []string{"ID", "QUEUE", "OFFSET", "TAG", "STORED", "AT", "BODY"}, strings.Fields(r.lines()[0]))
	require.Contains(t, r.lines()[1], `"z"`)

	r = mustCLI(t, "", "msg", "find", "--topic", "m", "--key", "nothing", "--server", addr)
	require.Equal(t, "no messages with key nothing in m\n", r.out)
	r = mustCLI(t, "", "msg", "find", "--topic", "m", "--key", "nothing", "--json", "--server", addr)
	require.Empty(t, r.out)

	requireOneLineError(t, cli(t, t.Context(), "", "msg", "find", "--topic", "m", "--server", addr), `required flag(s) "key" not set`)
	requireOneLineError(t, cli(t, t.Context(), "", "msg", "find", "--topic", "m", "--key", "k", "--max", "0", "--server", addr), "--max must be at least 1")
	requireOneLineError(t, cli(t, t.Context(), "", "msg", "find", "--topic", "nope", "--key", "k", "--server", addr), `topic not found: "nope"`)
}
