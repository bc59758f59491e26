package delay

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
)

// The child half of TestKill9WithPendingTimers: the test binary re-executes
// itself with killChildEnv set; TestMain calls runKillChild first. The child
// schedules killMessages delayed messages (sync flush: acknowledged means
// fsynced), cancels every tenth, prints "ready" and waits to be killed.
const (
	killChildEnv  = "FERRYMQ_DELAY_KILL_CHILD"
	killMessages  = 500
	killTopic     = "jobs"
	killStoreOpts = store.FlushSync
)

// killDelay is message i's delay from when the child produces it: 4 s to
// 4.98 s, so every first copy waits in the 4 s level and none moves on
// before the kill (under 3.9 s after the child started) — a kill inside a
// hop would deliver that message twice, the documented at-least-once
// window, which this test does not probe.
func killDelay(i int) time.Duration {
	return 4*time.Second + time.Duration(i%50)*20*time.Millisecond
}

func runKillChild() bool {
	dir := os.Getenv(killChildEnv)
	if dir == "" {
		return false
	}
	fail := func(err error) bool {
		fmt.Println("error:", err)
		os.Exit(2)
		return true
	}
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{FlushPolicy: killStoreOpts, DefaultQueues: 4})
	if err != nil {
		return fail(err)
	}
	svc, err := New(st, filepath.Join(dir, "delay"), Options{})
	if err != nil {
		return fail(err)
	}
	svc.Start()
	b := svc.Broker()
	for i := range killMessages {
		res, err := b.Produce(context.Background(), &core.Message{Topic: killTopic, ShardingKey: "k" + strconv.Itoa(i%7),
			Body: []byte(strconv.Itoa(i)), DeliverAt: time.Now().Add(killDelay(i))})
		if err != nil {
			return fail(err)
		}
		if i%10 == 0 {
			if _, err := svc.Cancel(context.Background(), res.ID); err != nil {
				return fail(err)
			}
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Hour) // held until the parent's SIGKILL, the scenario; an orphan ends after the hour
	return true
}

// TestKill9WithPendingTimers schedules 500 delayed messages in a child
// process, cancels 50, kills it with SIGKILL before any is due, restarts on
// the same folder after their due time and checks: the 450 arrive, the 50
// cancelled ones never do, none before its due time.
func TestKill9WithPendingTimers(t *testing.T) {
	dir := t.TempDir()
	base := time.Now()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), killChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	require.Less(t, time.Since(base), 3900*time.Millisecond, "the child was slow: copies may have moved before the kill")

	// Wait until every message is due, then restart: delivered promptly.
	time.Sleep(time.Until(base.Add(9 * time.Second))) // down while every message comes due on the real clock: the scenario, not a wait
	restart := time.Now()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{FlushPolicy: killStoreOpts, DefaultQueues: 4})
	require.NoError(t, err)
	defer st.Close()
	svc, err := New(st, filepath.Join(dir, "delay"), Options{PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	svc.Start()
	defer svc.Close()
	want := killMessages - killMessages/10
	var got [][]*core.StoredMessage
	require.Eventually(t, func() bool {
		got = readAll(t, st, killTopic)
		return count(got) >= want
	}, waitFor, 20*time.Millisecond)
	t.Logf("%d overdue messages delivered %v after the restart", want, time.Since(restart))
	seen := map[int]int{}
	for _, q := range got {
		for _, m := range q {
			i, err := strconv.Atoi(string(m.Body))
			require.NoError(t, err)
			require.NotZero(t, i%10, "cancelled message %d delivered", i)
			require.False(t, m.StoredAt.Before(m.DeliverAt), "message %d early", i)
			seen[i]++
		}
	}
	require.Len(t, seen, want)
	for i, n := range seen {
		require.Equal(t, 1, n, "message %d delivered %d times", i, n)
	}
}
