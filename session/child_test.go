package session

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// childEnv turns the test binary into a gateway process — an engine over
// the log store of the folder it names — for the kill -9 tests.
const childEnv = "FERRYMQ_SESSIONTEST_CHILD"

// maybeChild runs the test binary as that child process when asked to
// (it prints "addr <host:port>", then serves until killed or orphaned);
// otherwise it returns at once.
func maybeChild() {
	dir, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "session child:", err)
		os.Exit(1)
	}
	s, err := Open(dir, Options{})
	if err != nil {
		fail(err)
	}
	e, err := engine.New(engine.Options{Listeners: []engine.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}}, Hooks: engine.Hooks{Sessions: s}})
	if err != nil {
		fail(err)
	}
	s.Attach(e)
	if err := e.Start(); err != nil {
		fail(err)
	}
	fmt.Printf("addr %s\n", e.Addr("tcp"))
	parent := os.Getppid()
	for os.Getppid() == parent {
		time.Sleep(200 * time.Millisecond) // the orphan watch of a child process (no test to poll with): one whose test died must not linger
	}
	os.Exit(1)
}

// startChild starts a gateway process over dir and returns it with its
// MQTT address.
func startChild(t testing.TB, dir string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "addr "); ok {
				lines <- addr
				return
			}
		}
		close(lines)
	}()
	select {
	case addr, ok := <-lines:
		require.True(t, ok, "the child ended before serving")
		return cmd, addr
	case <-time.After(30 * time.Second):
		t.Fatal("the child did not start")
		return nil, ""
	}
}

func kill9(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err := cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
}
