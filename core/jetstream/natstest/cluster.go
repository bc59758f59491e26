package natstest

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// readyTimeout bounds how long a cluster may take to elect a meta leader
// and bring every node up to date.
const readyTimeout = 30 * time.Second

// pollInterval is how often the wait helpers look again.
const pollInterval = 25 * time.Millisecond

// Cluster is an in-process JetStream cluster. Servers[i] is node n<i+1>; a
// stopped node stays in the slice (not Running) and Restart replaces it.
type Cluster struct {
	// Servers are the nodes, in name order.
	Servers []*Server

	t     testing.TB
	specs []nodeSpec
	opts  []Option
}

// RunCluster starts an n-node JetStream cluster on loopback, waits until it
// has a meta leader and every node is current, and shuts it down when the
// test ends.
func RunCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: cluster needs at least one node, got %d", n)
	}
	specs, err := clusterSpecs(n, t.TempDir, false)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	c := &Cluster{Servers: make([]*Server, n), t: t, specs: specs, opts: opts}
	t.Cleanup(c.Shutdown)
	for i := range specs {
		if c.Servers[i], err = c.startNode(i); err != nil {
			t.Fatalf("natstest: %v", err)
		}
	}
	c.waitReady(readyTimeout)
	return c
}

// startNode starts node i from its spec and the cluster's options.
func (c *Cluster) startNode(i int) (*Server, error) {
	o := c.specs[i].options()
	for _, opt := range c.opts {
		opt(o)
	}
	return start(o)
}

// URLs returns the client URLs of all nodes, comma-separated, as
// nats.Connect accepts them.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.specs))
	for i, sp := range c.specs {
		urls[i] = sp.clientURL()
	}
	return strings.Join(urls, ",")
}

// Shutdown stops every node and waits for them. It may be called more than
// once.
func (c *Cluster) Shutdown() {
	for _, s := range c.Servers {
		if s != nil {
			s.Shutdown()
		}
	}
}

// Stop shuts node i down and waits until it has stopped.
func (c *Cluster) Stop(i int) {
	c.t.Helper()
	c.checkIndex(i)
	c.Servers[i].Shutdown()
}

// Restart starts the stopped node i again with the same ports, name, store
// and routes, then waits until the cluster is ready again.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.checkIndex(i)
	if c.Servers[i].Running() {
		c.t.Fatalf("natstest: restart %s: still running", c.specs[i].Name)
	}
	s, err := c.startNode(i)
	if err != nil {
		c.t.Fatalf("natstest: restart: %v", err)
	}
	c.Servers[i] = s
	c.waitReady(readyTimeout)
}

// MetaLeader returns the index of the JetStream meta leader, or -1 while
// there is none (or, during an election, more than one claims it).
func (c *Cluster) MetaLeader() int {
	return c.only(func(s *Server) bool { return s.JetStreamIsLeader() })
}

// StreamLeader returns the index of the node that leads the stream in the
// account, or -1 while there is none.
func (c *Cluster) StreamLeader(account, stream string) int {
	return c.only(func(s *Server) bool { return s.JetStreamIsStreamLeader(account, stream) })
}

// WaitMetaLeader waits until the cluster has a meta leader and returns its
// index; it fails the test after timeout.
func (c *Cluster) WaitMetaLeader(t testing.TB, timeout time.Duration) int {
	t.Helper()
	return waitIndex(t, timeout, "meta leader", c.MetaLeader)
}

// WaitStreamLeader waits until the stream in the global account has a
// leader and returns its index; it fails the test after timeout.
func (c *Cluster) WaitStreamLeader(t testing.TB, stream string, timeout time.Duration) int {
	t.Helper()
	return waitIndex(t, timeout, "leader of stream "+stream, func() int {
		return c.StreamLeader(GlobalAccount, stream)
	})
}

// only returns the index of the single running server for which is holds,
// or -1.
func (c *Cluster) only(is func(*Server) bool) int {
	found := -1
	for i, s := range c.Servers {
		if s == nil || !s.Running() || !is(s) {
			continue
		}
		if found >= 0 {
			return -1
		}
		found = i
	}
	return found
}

// waitReady polls until ready reports no error; it fails the test after
// timeout.
func (c *Cluster) waitReady(timeout time.Duration) {
	c.t.Helper()
	if err := poll(timeout, c.ready); err != nil {
		c.t.Fatalf("natstest: cluster not ready after %v: %v", timeout, err)
	}
}

// ready reports why the cluster is not ready: it needs a meta leader that
// sees every running node as a JetStream peer, and every running node must
// be healthy (current with the meta leader and with its streams).
func (c *Cluster) ready() error {
	running := 0
	for _, s := range c.Servers {
		if s.Running() {
			running++
		}
	}
	l := c.MetaLeader()
	if l < 0 {
		return errors.New("no meta leader")
	}
	if peers := c.Servers[l].JetStreamClusterPeers(); len(peers) != running {
		return fmt.Errorf("meta leader %s sees peers %v, want %d", c.specs[l].Name, peers, running)
	}
	for i, s := range c.Servers {
		if !s.Running() {
			continue
		}
		if h := s.Healthz(nil); h.StatusCode != http.StatusOK {
			return fmt.Errorf("%s not healthy: %s %s", c.specs[i].Name, h.Status, h.Error)
		}
	}
	return nil
}

func (c *Cluster) checkIndex(i int) {
	c.t.Helper()
	if i < 0 || i >= len(c.Servers) {
		c.t.Fatalf("natstest: node index %d out of range [0,%d)", i, len(c.Servers))
	}
}

// waitIndex polls get until it returns an index >= 0; it fails the test
// after timeout.
func waitIndex(t testing.TB, timeout time.Duration, what string, get func() int) int {
	t.Helper()
	idx := -1
	err := poll(timeout, func() error {
		if idx = get(); idx < 0 {
			return fmt.Errorf("no %s", what)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("natstest: %v after %v", err, timeout)
	}
	return idx
}

// poll calls check until it returns nil or a permanentError, or timeout
// passes, and then returns check's last error.
func poll(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		var perm permanentError
		if errors.As(err, &perm) {
			return perm.err
		}
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(pollInterval)
	}
}

// permanentError makes poll give up at once.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }
