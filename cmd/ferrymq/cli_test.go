package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/server/servertest"
)

// Helpers shared by the tests of the client commands: they run the real
// command tree in process against a real server (servertest) on a loopback
// port.

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// cliResult is what one run of the command line printed and returned.
type cliResult struct {
	out, err string
	runErr   error
}

// lines returns the non-empty lines of stdout.
func (r cliResult) lines() []string { return nonEmptyLines(r.out) }

func nonEmptyLines(s string) []string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// cli runs `ferrymq args...` in process with stdin and returns its output.
func cli(t testing.TB, ctx context.Context, stdin string, args ...string) cliResult {
	t.Helper()
	var out, errOut syncBuffer
	err := execCLI(ctx, &out, &errOut, stdin, args...)
	return cliResult{out: out.String(), err: errOut.String(), runErr: err}
}

func execCLI(ctx context.Context, out, errOut *syncBuffer, stdin string, args ...string) error {
	cmd := newRootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	cmd.SetIn(strings.NewReader(stdin))
	return cmd.ExecuteContext(ctx)
}

// mustCLI is cli that requires success and no stderr output.
func mustCLI(t testing.TB, stdin string, args ...string) cliResult {
	t.Helper()
	r := cli(t, t.Context(), stdin, args...)
	require.NoError(t, r.runErr, "ferrymq %s\nstderr: %s", strings.Join(args, " "), r.err)
	require.Empty(t, r.err, "ferrymq %s", strings.Join(args, " "))
	return r
}

// requireOneLineError checks a failed run: an error, and stderr exactly
// one line "Error: …" containing want.
func requireOneLineError(t testing.TB, r cliResult, want string) {
	t.Helper()
	require.Error(t, r.runErr)
	require.True(t, strings.HasSuffix(r.err, "\n"), "stderr %q", r.err)
	require.Equal(t, 1, strings.Count(r.err, "\n"), "one line on stderr, got %q", r.err)
	require.True(t, strings.HasPrefix(r.err, "Error: "), "stderr %q", r.err)
	require.Contains(t, r.err, want)
}

// background runs a long-lived command (a consumer) until stop is called.
type background struct {
	out, err syncBuffer
	cancel   context.CancelFunc
	done     chan error
}

func startCLI(t testing.TB, args ...string) *background {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	b := &background{cancel: cancel, done: make(chan error, 1)}
	go func() { b.done <- execCLI(ctx, &b.out, &b.err, "", args...) }()
	t.Cleanup(func() { _ = b.stop(t) })
	return b
}

// stop interrupts the command, as SIGINT would, and returns its error.
func (b *background) stop(t testing.TB) error {
	t.Helper()
	b.cancel()
	select {
	case err, ok := <-b.done:
		if ok {
			close(b.done)
		}
		return err
	case <-time.After(15 * time.Second):
		t.Fatalf("command did not stop after its context ended")
		return nil
	}
}

// newServer starts a server for one test and returns its address.
func newServer(t testing.TB) string {
	t.Helper()
	return servertest.Start(t, servertest.Options{}).Addr
}

// record is a parsed line of --json message output.
type record struct {
	ID         string            `json:"id"`
	Topic      string            `json:"topic"`
	Queue      int               `json:"queue"`
	Offset     int64             `json:"offset"`
	Key        string            `json:"key"`
	Tags       []string          `json:"tags"`
	Props      map[string]string `json:"props"`
	Body       string            `json:"body"`
	BodyBase64 bool              `json:"body_base64"`
	BornAt     time.Time         `json:"born_at"`
	StoredAt   time.Time         `json:"stored_at"`
	Reconsume  int               `json:"reconsume"`
}

// contractKeys are the keys of every JSON message record.
var contractKeys = []string{"body", "born_at", "id", "key", "offset", "props", "queue", "reconsume", "stored_at", "tags", "topic"}

// parseRecords parses JSON Lines of message records, checking each line's
// keys against the contract.
func parseRecords(t testing.TB, out string) []record {
	t.Helper()
	var recs []record
	for _, l := range nonEmptyLines(out) {
		var raw map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(l), &raw), "line %q", l)
		keys := make([]string, 0, len(raw))
		for k := range raw {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		want := contractKeys
		if _, ok := raw["body_base64"]; ok {
			want = append(slices.Clone(contractKeys), "body_base64")
			slices.Sort(want)
			require.JSONEq(t, "true", string(raw["body_base64"]))
		}
		require.Equal(t, want, keys, "keys of %s", l)
		var r record
		require.NoError(t, json.Unmarshal([]byte(l), &r))
		recs = append(recs, r)
	}
	return recs
}

func bodiesOf(recs []record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Body
	}
	return out
}

func idsOf(recs []record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// TestClientCommandsHaveExamples checks every client command documents
// itself with examples.
func TestClientCommandsHaveExamples(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		require.NotEmpty(t, c.Example, "%s has no examples", c.CommandPath())
		require.NotEmpty(t, c.Short, c.CommandPath())
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	seen := 0
	for _, c := range newRootCmd().Commands() {
		if slices.Contains([]string{"produce", "consume", "topic", "group", "msg"}, c.Name()) {
			walk(c)
			seen++
		}
	}
	require.Equal(t, 5, seen)

	r := mustCLI(t, "", "consume", "--help")
	require.Contains(t, r.out, "Examples:")
	require.Contains(t, r.out, "--idle-timeout")
}

func TestUnknownCommandIsOneLine(t *testing.T) {
	requireOneLineError(t, cli(t, t.Context(), "", "frobnicate"), `unknown command "frobnicate"`)
	requireOneLineError(t, cli(t, t.Context(), "", "topic", "frobnicate"), `unknown command "frobnicate" for "ferrymq topic"`)
	requireOneLineError(t, cli(t, t.Context(), "", "topic", "list", "--bogus"), "unknown flag: --bogus")
}

func TestOneLine(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`ferrymq: core: topic not found: "x" (code 10)`, `topic not found: "x"`},
		{`lag of g: ferrymq: group: unknown member; send a heartbeat first (code 30)`, `lag of g: unknown member; send a heartbeat first`},
		{"consumer: invalid options: a\nb", "invalid options: a; b"},
		{"plain", "plain"},
	} {
		require.Equal(t, tc.want, oneLine(errorString(tc.in)).Error())
	}
	require.NoError(t, oneLine(nil))
	require.ErrorIs(t, oneLine(context.DeadlineExceeded), context.DeadlineExceeded)
	require.Contains(t, oneLine(context.DeadlineExceeded).Error(), "--timeout")
}

type errorString string

func (e errorString) Error() string { return string(e) }

func TestParsePosition(t *testing.T) {
	p, err := parsePosition("--from", "earliest")
	require.NoError(t, err)
	require.Equal(t, position{}, p)
	p, err = parsePosition("--from", "latest")
	require.NoError(t, err)
	require.True(t, p.latest)
	p, err = parsePosition("--from", "2024-05-01T12:00:00.5+02:00")
	require.NoError(t, err)
	require.True(t, p.at.Equal(time.Date(2024, 5, 1, 10, 0, 0, 5e8, time.UTC)))
	_, err = parsePosition("--from", "yesterday")
	require.ErrorContains(t, err, `--from "yesterday": want earliest, latest or an RFC 3339 time`)
}

func TestEnvironmentNamesTheServer(t *testing.T) {
	addr := newServer(t)
	t.Setenv(envServer, addr)
	mustCLI(t, "", "topic", "create", "from-env")
	r := mustCLI(t, "", "topic", "list")
	require.Contains(t, r.out, "from-env")

	// A flag wins over the environment.
	t.Setenv(envServer, "127.0.0.1:1")
	mustCLI(t, "", "topic", "list", "--server", addr)
	requireOneLineError(t, cli(t, t.Context(), "", "topic", "list", "--timeout", "2s"), "connect to 127.0.0.1:1")
}

func TestTokenIsPresented(t *testing.T) {
	env := servertest.Start(t, servertest.Options{Token: "s3cret"})
	requireOneLineError(t, cli(t, t.Context(), "", "topic", "list", "--server", env.Addr), "bad token")
	mustCLI(t, "", "topic", "list", "--server", env.Addr, "--token", "s3cret")
	t.Setenv(envToken, "s3cret")
	mustCLI(t, "", "topic", "list", "--server", env.Addr)
}
