//go:build unix

package engine

import (
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/lesismal/nbio"
)

// nbio's Stop is lost on a poller whose goroutine has not started its
// loop yet: the loop clears the poller's shutdown flag as it starts, and
// Stop then waits for it forever (a Shutdown soon after Start hung). So
// Start returns only once every poller has handled an event: a probe
// socket on each, written once.

const pollerStartTimeout = 5 * time.Second

// awaitPollers returns once every poller of the event loop runs its loop.
func (e *Engine) awaitPollers() error {
	n := e.opts.Pollers
	seen := make([]bool, n)
	left := n
	var open []probe
	var spacers []int
	defer func() {
		for _, p := range open {
			e.probes.Delete(p.nc)
			_ = p.nc.Close()
			_ = syscall.Close(p.peer)
		}
		for _, fd := range spacers {
			_ = syscall.Close(fd)
		}
	}()
	deadline := time.NewTimer(pollerStartTimeout)
	defer deadline.Stop()
	// A probe lands on the poller its descriptor's number picks; probes are
	// kept open until the end, and a spare descriptor shifts the numbers
	// after a poller already probed, so that they go round the pollers.
	for left > 0 && len(open) < 16*n+64 {
		p, err := e.newProbe()
		if err != nil {
			return fmt.Errorf("engine: probe the event loop: %w", err)
		}
		open = append(open, p)
		i := p.nc.Hash() % n
		if seen[i] {
			if fd, err := syscall.Dup(p.peer); err == nil {
				spacers = append(spacers, fd)
			}
			continue
		}
		if _, err := syscall.Write(p.peer, []byte{0}); err != nil {
			return fmt.Errorf("engine: probe the event loop: %w", err)
		}
		select {
		case <-p.ch:
			seen[i] = true
			left--
		case <-deadline.C:
			return fmt.Errorf("engine: event loop poller %d did not start in %s", i, pollerStartTimeout)
		}
	}
	if left > 0 {
		return fmt.Errorf("engine: %d event loop pollers not reached by a probe", left)
	}
	return nil
}

type probe struct {
	nc   *nbio.Conn
	peer int
	ch   chan struct{}
}

// newProbe adds one end of a socket pair to the event loop.
func (e *Engine) newProbe() (probe, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return probe{}, err
	}
	f := os.NewFile(uintptr(fds[0]), "engine-probe")
	c, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		_ = syscall.Close(fds[1])
		return probe{}, err
	}
	nc, err := e.nb.AddConn(c)
	if err != nil {
		_ = c.Close()
		_ = syscall.Close(fds[1])
		return probe{}, err
	}
	p := probe{nc: nc, peer: fds[1], ch: make(chan struct{})}
	e.probes.Store(nc, p.ch)
	return p, nil
}

// probed reports whether nc is a probe, and tells its waiter it was read.
func (e *Engine) probed(nc *nbio.Conn) bool {
	ch, ok := e.probes.LoadAndDelete(nc)
	if ok {
		close(ch.(chan struct{}))
	}
	return ok
}
