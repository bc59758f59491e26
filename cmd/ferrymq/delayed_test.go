package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/core/wire"
)

func TestProduceDelayedListCancel(t *testing.T) {
	addr := newServer(t)
	start := time.Now()
	soon := mustCLI(t, "", "produce", "--server", addr, "--topic", "rem", "--key", "car-7", "--delay", "1s", "soon").lines()
	require.Len(t, soon, 1)
	later := mustCLI(t, "", "produce", "--server", addr, "--topic", "rem", "--delay", "39d23h", "later").lines()[0]
	at := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Second)
	atID := mustCLI(t, "", "produce", "--server", addr, "--topic", "other", "--at", at.Format(time.RFC3339), "at").lines()[0]

	// Listed soonest first, with --topic filtering.
	var pending []wire.Delayed
	for _, l := range mustCLI(t, "", "msg", "delayed", "--server", addr, "--json").lines() {
		var d wire.Delayed
		require.NoError(t, json.Unmarshal([]byte(l), &d))
		pending = append(pending, d)
	}
	require.Len(t, pending, 3)
	require.Equal(t, []string{soon[0], atID, later}, []string{pending[0].ID, pending[1].ID, pending[2].ID})
	require.Equal(t, "car-7", pending[0].Key)
	require.True(t, pending[1].Due.Equal(at))
	require.WithinDuration(t, start.Add(39*24*time.Hour+23*time.Hour), pending[2].Due, 10*time.Second)
	table := mustCLI(t, "", "msg", "delayed", "--server", addr, "--topic", "rem").out
	require.Contains(t, table, later)
	require.NotContains(t, table, atID)

	r := mustCLI(t, "", "msg", "cancel", "--server", addr, later)
	require.Contains(t, r.out, "cancelled "+later)
	requireOneLineError(t, cli(t, t.Context(), "", "msg", "cancel", "--server", addr, later), "already cancelled")
	requireOneLineError(t, cli(t, t.Context(), "", "msg", "cancel", "--server", addr, "nothex"), "invalid message id")

	// The 1 s one arrives in its topic with the producer's ID as delay.id.
	var recs []record
	require.Eventually(t, func() bool {
		r := cli(t, t.Context(), "", "consume", "--server", addr, "--topic", "rem", "--group", "g", "--json", "--count", "1", "--from", "earliest")
		if r.runErr != nil {
			return false
		}
		recs = parseRecords(t, r.out)
		return len(recs) == 1
	}, 15*time.Second, 50*time.Millisecond)
	require.Equal(t, "soon", recs[0].Body)
	require.Equal(t, soon[0], recs[0].Props["delay.id"])
	require.False(t, recs[0].StoredAt.Before(start.Add(time.Second)), "not before its time")
	requireOneLineError(t, cli(t, t.Context(), "", "msg", "cancel", "--server", addr, soon[0]), "already due")
	requireOneLineError(t, cli(t, t.Context(), "", "msg", "cancel", "--server", addr, recs[0].ID), "already due")
}

func TestProduceBadDelays(t *testing.T) {
	addr := newServer(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--delay", "41d"}, "deliver-at too far ahead"},
		{[]string{"--delay", "-5s"}, "must not be negative"},
		{[]string{"--delay", "soon"}, "want a duration"},
		{[]string{"--at", "tomorrow"}, "want an RFC 3339 time"},
		{[]string{"--at", "2020-01-01T00:00:00Z"}, "in the past"},
		{[]string{"--delay", "1h", "--at", "2030-01-01T00:00:00Z"}, "not both"},
	} {
		args := append([]string{"produce", "--server", addr, "--topic", "rem"}, c.args...)
		requireOneLineError(t, cli(t, t.Context(), "", append(args, "x")...), c.want)
	}
}

func TestParseDays(t *testing.T) {
	for in, want := range map[string]time.Duration{"90s": 90 * time.Second, "7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "-2d": -48 * time.Hour} {
		got, err := parseDays(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "d", "xd", "1d-1h", "1dd", strings.Repeat("9", 20) + "d"} {
		_, err := parseDays(bad)
		require.Error(t, err, bad)
	}
}

func TestMsgTransactions(t *testing.T) {
	env := servertest.Start(t, servertest.Options{Txn: txn.Options{FirstCheck: time.Hour}})
	r := mustCLI(t, "", "msg", "transactions", "--server", env.Addr)
	require.Equal(t, "no transactions pending\n", r.out)
	half, err := env.Txn.SendHalf(t.Context(), "order-svc", &core.Message{Topic: "orders", Body: []byte("o")})
	require.NoError(t, err)
	r = mustCLI(t, "", "msg", "transactions", "--server", env.Addr)
	require.Contains(t, r.out, half.ID.String())
	require.Contains(t, r.out, "order-svc")
	var p wire.TxnPending
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "", "msg", "transactions", "--server", env.Addr, "--json").lines()[0]), &p))
	require.Equal(t, "orders", p.Topic)
	require.Zero(t, p.Checks)
}
