package natstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// logFileName is the nats-server log of a child, in its node folder.
	logFileName = "nats-server.log"
	// stderrFileName receives a child's stderr (panics, race reports).
	stderrFileName = "stderr.log"
	// exitTimeout bounds how long a killed child may take to be reaped.
	exitTimeout = 10 * time.Second
	// requestTimeout bounds each network probe of a child.
	requestTimeout = 2 * time.Second
	// statusMaxAge is how old a child's status report may be and still
	// count; a child rewrites it every statusInterval.
	statusMaxAge = 2 * time.Second
)

// ProcNode is one nats-server running as a child process of the test
// binary. Kill and Start can cycle it any number of times; it keeps its
// name, ports and store folder.
type ProcNode struct {
	// Name is the server name (n1, n2, ...).
	Name string
	// URL is the client URL (nats://127.0.0.1:port).
	URL string
	// MonitorURL is the HTTP monitoring URL (http://127.0.0.1:port).
	MonitorURL string
	// Dir is the node folder: JetStream store, nats-server.log, stderr.log
	// and status.json (the child's own report, for readiness checks).
	Dir string

	t    testing.TB
	spec nodeSpec
	run  *procRun
}

// procRun is one started child process.
type procRun struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait has returned
	err    error         // cmd.Wait's result, readable after exited
	killed bool          // the test killed it (kill, KillAll): its exit is expected
}

// died reports a child that exited by itself after it started (a crash,
// a fatal error of nats-server): nil while it runs or when the test
// killed it. Waiting for such a node cannot succeed, so readiness checks
// fail at once with what the child left behind.
func (p *ProcNode) died() error {
	if p.run == nil || p.run.killed || p.Running() {
		return nil
	}
	return fmt.Errorf("%s exited by itself (%v); stderr: %s; log tail: %s", p.Name, p.run.err, p.stderrHead(), p.logTail())
}

// logTail returns the end of the child's nats-server log, for error reports.
func (p *ProcNode) logTail() string {
	const limit = 4096
	b, err := os.ReadFile(p.spec.LogFile)
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return strings.TrimSpace(string(b))
}

// ProcCluster is a JetStream cluster whose nodes are child processes.
// Nodes[i] is node n<i+1>.
type ProcCluster struct {
	// Nodes are the nodes, in name order.
	Nodes []*ProcNode

	t testing.TB
}

// RunProcessServer starts a single-node JetStream server as a child process
// and waits until JetStream answers. The test package must call MaybeChild
// in TestMain. The child is killed when the test ends.
func RunProcessServer(t testing.TB, opts ...Option) *ProcNode {
	t.Helper()
	ports, err := freePorts(2)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	sp := nodeSpec{Name: "n1", Port: ports[0], HTTPPort: ports[1], StoreDir: t.TempDir()}
	sp.applyOptions(opts)
	p := newProcNode(t, sp)
	p.Start()
	p.WaitReady(t, readyTimeout)
	return p
}

// RunProcessCluster starts an n-node JetStream cluster whose nodes are
// child processes and waits until it is ready (see WaitReady). The test
// package must call MaybeChild in TestMain. The children are killed when
// the test ends.
func RunProcessCluster(t testing.TB, n int, opts ...Option) *ProcCluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: cluster needs at least one node, got %d", n)
	}
	specs, err := clusterSpecs(n, t.TempDir, true)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	c := &ProcCluster{Nodes: make([]*ProcNode, n), t: t}
	for i := range specs {
		specs[i].applyOptions(opts)
		c.Nodes[i] = newProcNode(t, specs[i])
	}
	c.StartAll()
	c.WaitReady(t, readyTimeout)
	return c
}

// newProcNode prepares a node that is not started yet and registers its
// kill for the end of the test.
func newProcNode(t testing.TB, sp nodeSpec) *ProcNode {
	sp.LogFile = filepath.Join(sp.StoreDir, logFileName)
	p := &ProcNode{Name: sp.Name, URL: sp.clientURL(), MonitorURL: sp.monitorURL(), Dir: sp.StoreDir, t: t, spec: sp}
	t.Cleanup(func() {
		if err := p.kill(); err != nil {
			t.Errorf("natstest: %v", err)
		}
	})
	return p
}

// Running reports whether the child process is alive.
func (p *ProcNode) Running() bool {
	if p.run == nil {
		return false
	}
	select {
	case <-p.run.exited:
		return false
	default:
		return true
	}
}

// Pid returns the child's process id, or 0 when it is not running.
func (p *ProcNode) Pid() int {
	if !p.Running() {
		return 0
	}
	return p.run.cmd.Process.Pid
}

// Start starts the child process and waits until it accepts client
// connections. JetStream may not be ready yet: use WaitReady for that.
func (p *ProcNode) Start() {
	p.t.Helper()
	if err := p.start(); err != nil {
		p.t.Fatalf("natstest: %v", err)
	}
}

// Kill sends SIGKILL to the child process and waits until it has exited.
// Killing a node that is not running does nothing.
func (p *ProcNode) Kill() {
	p.t.Helper()
	if err := p.kill(); err != nil {
		p.t.Fatalf("natstest: %v", err)
	}
}

// WaitReady waits until the node is healthy (as /healthz) and its
// JetStream answers an account info request; it fails the test after
// timeout.
func (p *ProcNode) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := poll(timeout, p.ready); err != nil {
		t.Fatalf("natstest: node %s not ready after %v: %v", p.Name, timeout, err)
	}
}

func (p *ProcNode) start() error {
	if p.Running() {
		return fmt.Errorf("start %s: already running (pid %d)", p.Name, p.run.cmd.Process.Pid)
	}
	if err := p.spawn(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	if err := p.waitListening(startTimeout); err != nil {
		return errors.Join(fmt.Errorf("start %s: %w", p.Name, err), p.kill())
	}
	return nil
}

// spawn re-executes the test binary as a child running this node. Its
// reaper goroutine ends when the process exits.
func (p *ProcNode) spawn() error {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	raw, err := json.Marshal(p.spec)
	if err != nil {
		return fmt.Errorf("encode node spec: %w", err)
	}
	stderr, err := os.OpenFile(filepath.Join(p.Dir, stderrFileName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open child stderr: %w", err)
	}
	defer stderr.Close() // the child holds its own copy

	// -test.run=^$ keeps a binary whose TestMain forgot MaybeChild from
	// running the tests again; it exits and start reports the hint.
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	cmd.Stderr = stderr
	cmd.SysProcAttr = childSysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec %s: %w", exe, err)
	}
	run := &procRun{cmd: cmd, exited: make(chan struct{})}
	go func() {
		run.err = cmd.Wait()
		close(run.exited)
	}()
	p.run = run
	return nil
}

// waitListening waits until the client port accepts TCP connections, or
// fails early when the child exits.
func (p *ProcNode) waitListening(timeout time.Duration) error {
	addr := hostPort(p.spec.Port)
	return poll(timeout, func() error {
		if !p.Running() {
			return permanentError{fmt.Errorf("child exited (%v) before listening (a clean exit means TestMain does not call natstest.MaybeChild); stderr: %s",
				p.run.err, p.stderrHead())}
		}
		conn, err := net.DialTimeout("tcp", addr, requestTimeout)
		if err != nil {
			return fmt.Errorf("dial %s: %w", addr, err)
		}
		return conn.Close()
	})
}

// kill sends SIGKILL and waits for the reaper; it is a no-op when the node
// is not running.
func (p *ProcNode) kill() error {
	if !p.Running() {
		return nil
	}
	p.run.killed = true
	if err := p.run.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.Name, err)
	}
	select {
	case <-p.run.exited:
		return nil
	case <-time.After(exitTimeout):
		return fmt.Errorf("kill %s: pid %d still running after %v", p.Name, p.run.cmd.Process.Pid, exitTimeout)
	}
}

// ready reports why the node is not ready: it must report itself healthy
// and answer a JetStream account info request over the network.
func (p *ProcNode) ready() error {
	if err := p.died(); err != nil {
		return permanentError{err}
	}
	if _, err := p.status(); err != nil {
		return err
	}
	return withJetStream(p.URL, func(ctx context.Context, js jetstream.JetStream) error {
		if _, err := js.AccountInfo(ctx); err != nil {
			return fmt.Errorf("%s account info: %w", p.Name, err)
		}
		return nil
	})
}

// status returns the running child's fresh, healthy status report.
func (p *ProcNode) status() (childStatus, error) {
	if !p.Running() {
		return childStatus{}, fmt.Errorf("%s is not running", p.Name)
	}
	st, err := readStatus(filepath.Join(p.Dir, statusFileName), p.run.cmd.Process.Pid, statusMaxAge)
	if err != nil {
		return st, fmt.Errorf("%s: %w", p.Name, err)
	}
	if st.Health != "" {
		return st, fmt.Errorf("%s not healthy: %s", p.Name, st.Health)
	}
	return st, nil
}

// stderrHead returns the start of the child's stderr file (where a panic
// begins), for error reports.
func (p *ProcNode) stderrHead() string {
	const limit = 4096
	b, err := os.ReadFile(filepath.Join(p.Dir, stderrFileName))
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	if len(b) > limit {
		b = b[:limit]
	}
	return strings.TrimSpace(string(b))
}

// URLs returns the client URLs of all nodes, comma-separated, as
// nats.Connect accepts them.
func (c *ProcCluster) URLs() string {
	urls := make([]string, len(c.Nodes))
	for i, p := range c.Nodes {
		urls[i] = p.URL
	}
	return strings.Join(urls, ",")
}

// Kill sends SIGKILL to node i and waits until it has exited.
func (c *ProcCluster) Kill(i int) {
	c.t.Helper()
	c.node(i).Kill()
}

// Start starts node i again with the same ports, name and store, and waits
// until it accepts client connections (not for JetStream: see WaitReady).
func (c *ProcCluster) Start(i int) {
	c.t.Helper()
	c.node(i).Start()
}

// KillAll sends SIGKILL to every running node at once, then waits until
// they have all exited.
func (c *ProcCluster) KillAll() {
	c.t.Helper()
	for _, p := range c.Nodes {
		if p.Running() {
			// An error here means the process is gone already; the wait
			// below settles it.
			p.run.killed = true
			_ = p.run.cmd.Process.Kill()
		}
	}
	var errs []error
	for _, p := range c.Nodes {
		errs = append(errs, p.kill())
	}
	if err := errors.Join(errs...); err != nil {
		c.t.Fatalf("natstest: %v", err)
	}
}

// StartAll starts every node that is not running and waits until each
// accepts client connections (not for JetStream: see WaitReady).
func (c *ProcCluster) StartAll() {
	c.t.Helper()
	var started []*ProcNode
	for _, p := range c.Nodes {
		if p.Running() {
			continue
		}
		if err := p.spawn(); err != nil {
			c.t.Fatalf("natstest: start %s: %v", p.Name, err)
		}
		started = append(started, p)
	}
	for _, p := range started {
		if err := p.waitListening(startTimeout); err != nil {
			c.t.Fatalf("natstest: start %s: %v", p.Name, err)
		}
	}
}

// StreamLeader asks the cluster over the network which node leads the
// stream in the global account and returns its index, or -1 when there is
// no leader or no answer.
func (c *ProcCluster) StreamLeader(stream string) int {
	var urls []string
	for _, p := range c.Nodes {
		if p.Running() {
			urls = append(urls, p.URL)
		}
	}
	if len(urls) == 0 {
		return -1
	}
	var leader string
	err := withJetStream(strings.Join(urls, ","), func(ctx context.Context, js jetstream.JetStream) error {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return fmt.Errorf("stream info %s: %w", stream, err)
		}
		if ci := s.CachedInfo().Cluster; ci != nil {
			leader = ci.Leader
		}
		return nil
	})
	if err != nil {
		return -1
	}
	return c.index(leader)
}

// WaitStreamLeader waits until the stream in the global account has a
// leader and returns its index; it fails the test after timeout.
func (c *ProcCluster) WaitStreamLeader(t testing.TB, stream string, timeout time.Duration) int {
	t.Helper()
	return waitIndex(t, timeout, "leader of stream "+stream, func() int { return c.StreamLeader(stream) })
}

// WaitReady waits until every running node is healthy (as /healthz) and
// answers JetStream requests, and the meta leader can place streams on
// every running node; it fails the test after timeout.
func (c *ProcCluster) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := poll(timeout, c.ready); err != nil {
		t.Fatalf("natstest: cluster not ready after %v: %v", timeout, err)
	}
}

func (c *ProcCluster) ready() error {
	var running []*ProcNode
	for _, p := range c.Nodes {
		if err := p.died(); err != nil {
			return permanentError{err}
		}
		if p.Running() {
			running = append(running, p)
		}
	}
	if len(running) == 0 {
		return errors.New("no node is running")
	}
	for _, p := range running {
		if err := p.ready(); err != nil {
			return err
		}
	}
	return c.metaReady(running)
}

// metaReady checks that one running node is the meta leader and can place
// streams on every running node.
func (c *ProcCluster) metaReady(running []*ProcNode) error {
	for _, p := range running {
		st, err := p.status()
		if err != nil {
			return err
		}
		if !st.MetaLeader {
			continue
		}
		if len(st.Peers) != len(running) {
			return fmt.Errorf("meta leader %s sees peers %v, want %d", p.Name, st.Peers, len(running))
		}
		return nil
	}
	return errors.New("no running node is the meta leader")
}

func (c *ProcCluster) node(i int) *ProcNode {
	c.t.Helper()
	if i < 0 || i >= len(c.Nodes) {
		c.t.Fatalf("natstest: node index %d out of range [0,%d)", i, len(c.Nodes))
	}
	return c.Nodes[i]
}

// index returns the index of the node with the server name, or -1.
func (c *ProcCluster) index(name string) int {
	for i, p := range c.Nodes {
		if p.Name == name {
			return i
		}
	}
	return -1
}

// withJetStream connects to urls without reconnecting, runs f with a
// bounded context and closes the connection.
func withJetStream(urls string, f func(context.Context, jetstream.JetStream) error) error {
	nc, err := nats.Connect(urls, nats.Timeout(requestTimeout), nats.NoReconnect())
	if err != nil {
		return fmt.Errorf("connect %s: %w", urls, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream on %s: %w", urls, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	return f(ctx, js)
}
