package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBinaryEndToEnd builds the ferrymq binary and drives it as users and
// scripts do: `serve` as a child process, then `produce`, `consume --json
// --count`, a long-running `consume` and `group lag` against it, and SIGINT
// to stop the consumer and the server.
func TestBinaryEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	srv := startProcess(t, bin, "serve", "--data", filepath.Join(t.TempDir(), "data"), "--core", "127.0.0.1:0", "--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "127.0.0.1:0")
	var addr string
	require.Eventually(t, func() bool {
		for _, l := range nonEmptyLines(srv.out.String()) {
			if rest, ok := strings.CutPrefix(l, "core "); ok {
				addr = strings.TrimSpace(rest)
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond, "serve prints its core address")

	// run runs one client command to completion.
	run := func(stdin string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append(args, "--server", addr)...)
		cmd.Stdin = strings.NewReader(stdin)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "ferrymq %s: %s", strings.Join(args, " "), stderr.String())
		require.Empty(t, stderr.String())
		return string(out)
	}

	ids := nonEmptyLines(run("", "produce", "--topic", "e2e", "--count", "20", "--size", "64"))
	require.Len(t, ids, 20)
	ids = append(ids, nonEmptyLines(run("a\nb\nc\n", "produce", "--topic", "e2e", "--key", "k", "--prop", "via=stdin", "-"))...)
	require.Len(t, ids, 23)

	recs := parseRecords(t, run("", "consume", "--topic", "e2e", "--group", "g", "--json", "--count", "23"))
	require.Len(t, recs, 23)
	got := idsOf(recs)
	slices.Sort(got)
	slices.Sort(ids)
	require.Equal(t, ids, got)

	// A consumer that keeps running: its group shows in `group lag`.
	consumer := startProcess(t, bin, "consume", "--topic", "e2e", "--group", "g", "--json", "--server", addr)
	run("", "produce", "--topic", "e2e", "--count", "3", "--size", "8", "--quiet")
	require.Eventually(t, func() bool { return len(nonEmptyLines(consumer.out.String())) == 3 }, 20*time.Second, 10*time.Millisecond,
		"the running consumer gets only the new messages")
	require.Eventually(t, func() bool {
		lags := lagOf(t, addr, "g", "", "e2e") // in process, against the child server
		for _, l := range lags {
			if l.Owner == "" {
				return false
			}
		}
		return caughtUp(lags)
	}, 20*time.Second, 50*time.Millisecond, "group lag shows the group caught up")
	lag := run("", "group", "lag", "--group", "g")
	require.Contains(t, lag, "total lag 0\n")

	consumer.interrupt(t)
	require.Empty(t, consumer.errOut.String())

	srv.interrupt(t)
	require.Contains(t, srv.out.String(), "ferrymq ")
	alarming := regexp.MustCompile(`"level":"(warn|error|fatal|panic)"|panic:|DATA RACE`)
	logged := strings.ReplaceAll(srv.errOut.String(), `"level":"warn","component":"gateway"`, "") // the auth-off warning is expected here
	require.False(t, alarming.MatchString(logged), "serve logged:\n%s", srv.errOut.String())
	require.Contains(t, srv.errOut.String(), `"message":"store closed"`)
}

// buildBinary builds ./cmd/ferrymq into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ferrymq")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// process is a child process whose output the test reads as it comes.
type process struct {
	cmd         *exec.Cmd
	out, errOut syncBuffer
	exited      chan error
}

func startProcess(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(bin, args...), exited: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errOut
	p.cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "FERRYMQ_") })
	require.NoError(t, p.cmd.Start())
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-p.exited: // ended already
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// interrupt sends SIGINT and requires a clean exit (status 0) in time.
func (p *process) interrupt(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-p.exited:
		require.NoError(t, err, "%s exit; stderr:\n%s", p.cmd.Args[1], p.errOut.String())
		p.exited <- err // for Cleanup
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not exit after SIGINT", p.cmd.Args[1])
	}
}
