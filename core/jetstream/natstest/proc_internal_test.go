package natstest

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// A child that exits by itself after it started (here: killed behind the
// harness's back, as a crash would end it) is reported at once by the
// readiness checks, naming the exit; one the test killed is not. Without
// the report a restarted node that crashed made ProcCluster.WaitReady
// wait its whole timeout and then blame the meta leader's peer count.
func TestDiedNodeIsReportedAtOnce(t *testing.T) {
	p := RunProcessServer(t, Limits(64<<20, 256<<20))
	if err := p.died(); err != nil {
		t.Fatalf("running node reported dead: %v", err)
	}
	if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.run.exited:
	case <-time.After(exitTimeout):
		t.Fatal("child still running after SIGKILL")
	}
	c := &ProcCluster{Nodes: []*ProcNode{p}, t: t}
	start := time.Now()
	err := poll(time.Minute, c.ready)
	if err == nil || !strings.Contains(err.Error(), "exited by itself") || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("ready after a crash: %v, want an 'exited by itself … killed' report", err)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("the report took %v: the check waited instead of giving up", waited)
	}
	if err := poll(time.Minute, p.ready); err == nil || !strings.Contains(err.Error(), "exited by itself") {
		t.Fatalf("node ready after a crash: %v", err)
	}

	p.Start()
	p.WaitReady(t, readyTimeout)
	p.Kill()
	if err := p.died(); err != nil {
		t.Fatalf("a node the test killed is reported as dead: %v", err)
	}
}
