package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/server/servertest"
)

// runBench runs `ferrymq bench <args>` in-process and returns stdout and
// stderr.
func runBench(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newBenchCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	require.NoError(t, cmd.ExecuteContext(t.Context()), "stderr: %s", errOut.String())
	return out.String(), errOut.String()
}

func decodeRow(t *testing.T, s string) benchResult {
	t.Helper()
	var r benchResult
	require.NoError(t, json.Unmarshal([]byte(s), &r), s)
	return r
}

func TestBenchCoreProduce(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	out, progress := runBench(t, "core", "--server", env.Addr, "--count", "2000", "--producers", "4",
		"--pipeline", "16", "--size", "256", "--keys", "10", "--label", "async", "--json")
	r := decodeRow(t, out)
	require.Equal(t, "ferrymq", r.Target)
	require.Equal(t, "produce", r.Mode)
	require.Equal(t, "async", r.Label)
	require.Equal(t, 4, r.Producers)
	require.Equal(t, 256, r.Size)
	require.EqualValues(t, 2000, r.Messages)
	require.Positive(t, r.Seconds)
	require.Positive(t, r.MsgsPerSec)
	require.Positive(t, r.P50us)
	require.LessOrEqual(t, r.P50us, r.P99us)
	require.LessOrEqual(t, r.P99us, r.P999us)
	require.Contains(t, progress, "ferrymq produce")

	info, err := env.Store.Topic(t.Context(), "bench")
	require.NoError(t, err)
	var stored int64
	for _, q := range info.Ranges {
		stored += q.Max - q.Min
	}
	require.EqualValues(t, 2000, stored, "every acknowledged message is stored once")
}

func TestBenchCoreConsume(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	// A message stored before is not part of the backlog the run consumes.
	runBench(t, "core", "--server", env.Addr, "--count", "300", "--json")

	out, progress := runBench(t, "core", "--server", env.Addr, "--mode", "consume", "--count", "2000",
		"--consumers", "2", "--producers", "2", "--json")
	r := decodeRow(t, out)
	require.Equal(t, "consume", r.Mode)
	require.Equal(t, 2, r.Consumers)
	require.EqualValues(t, 2000, r.Messages)
	require.Positive(t, r.MsgsPerSec)
	require.Zero(t, r.P50us, "no latency for consumption")
	require.Contains(t, progress, "ferrymq fill")
	require.Contains(t, progress, "ferrymq consume")
}

// --ordered: orderly consumers (ferrymq) and one durable per consumer
// over its share of the subjects (JetStream); every delivery is checked
// against its partition's store order.
func TestBenchCoreConsumeOrdered(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	out, _ := runBench(t, "core", "--server", env.Addr, "--mode", "consume", "--ordered", "--count", "3000",
		"--keys", "50", "--consumers", "3", "--producers", "4", "--json")
	r := decodeRow(t, out)
	require.True(t, r.Ordered)
	require.EqualValues(t, 3000, r.Messages)
	require.Zero(t, r.OutOfOrder)

	ns := natstest.RunServer(t)
	out, _ = runBench(t, "core", "--target", "jetstream", "--server", strings.TrimPrefix(ns.URL, "nats://"), "--mode", "consume", "--ordered",
		"--count", "3000", "--keys", "50", "--consumers", "3", "--producers", "4", "--json")
	r = decodeRow(t, out)
	require.Equal(t, "jetstream", r.Target)
	require.True(t, r.Ordered)
	require.EqualValues(t, 3000, r.Messages)
	require.Zero(t, r.OutOfOrder)
}

func TestBenchCoreDuration(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	out, _ := runBench(t, "core", "--server", env.Addr, "--duration", "300ms", "--producers", "2", "--json")
	r := decodeRow(t, out)
	require.Positive(t, r.Messages)
}

func TestBenchCoreTable(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	out, _ := runBench(t, "core", "--server", env.Addr, "--count", "500", "--producers", "2", "--label", "sync")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	for _, col := range []string{"TARGET", "MODE", "LABEL", "MSGS/S", "MB/S", "P50", "P99", "P99.9"} {
		require.Contains(t, lines[0], col)
	}
	require.Contains(t, lines[1], "ferrymq")
	require.Contains(t, lines[1], "sync")
	require.Contains(t, lines[1], " 500 ")
}

func TestBenchTable(t *testing.T) {
	rows := `{"target":"ferrymq","mode":"produce","label":"async","producers":16,"pipeline":64,"size":1024,"messages":1000,"seconds":0.5,"msgs_per_sec":2000,"mb_per_sec":2.048,"p50_us":412.3,"p99_us":1520,"p999_us":2300000,"server":"x"}

{"target":"jetstream","mode":"consume","consumers":4,"size":1024,"messages":1000,"seconds":1,"msgs_per_sec":1000,"mb_per_sec":1.024,"server":"y"}
`
	var out bytes.Buffer
	cmd := newBenchCmd()
	cmd.SetIn(strings.NewReader(rows))
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"table", "--markdown"})
	require.NoError(t, cmd.Execute())
	want := `| TARGET | MODE | LABEL | CLIENTS | PIPELINE | SIZE | MESSAGES | SECONDS | MSGS/S | MB/S | P50 | P99 | P99.9 |
|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| ferrymq | produce | async | 16 | 64 | 1024 | 1000 | 0.50 | 2000 | 2.0 | 412µs | 1.52ms | 2.30s |
| jetstream | consume | - | 4 | - | 1024 | 1000 | 1.00 | 1000 | 1.0 | - | - | - |
`
	require.Equal(t, want, out.String())
}

func TestBenchCoreRejectsBadOptions(t *testing.T) {
	cmd := newBenchCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"core", "--target", "kafka", "--mode", "both", "--producers", "0"})
	err := cmd.ExecuteContext(t.Context())
	require.ErrorContains(t, err, `unknown target "kafka"`)
	require.ErrorContains(t, err, `unknown mode "both"`)
	require.ErrorContains(t, err, "--producers")
}

func TestDeliverySet(t *testing.T) {
	var s deliverySet
	for _, d := range []struct {
		part  int
		pos   uint64
		first bool
	}{{0, 0, true}, {0, 1, true}, {1, 5, true}, {0, 3, true}, {0, 2, true}, {0, 1, false}, {1, 200, true}, {1, 5, false}} {
		require.Equal(t, d.first, s.add(d.part, d.pos), "%+v", d)
	}
	require.EqualValues(t, 1, s.outOfOrder.Load(), "2 after 3")
	require.EqualValues(t, 2, s.duplicates.Load())
}
