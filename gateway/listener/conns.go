package listener

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Log field names.
const (
	fieldListener = "listener"
	fieldRemote   = "remote"
	fieldDelay    = "delay"
)

// disconnectGrace bounds how long Close lets mochi's closeClients run before
// it closes every connection anyway: mochi writes each DISCONNECT without a
// deadline, so one peer that stopped reading would otherwise hold shutdown.
const disconnectGrace = 5 * time.Second

// connSet owns the connections and goroutines of one listener: every raw
// connection from accept to close, and every goroutine the listener runs
// (its Serve loop and each connection's). Once shut, it takes no new
// connection and starts no new goroutine.
type connSet struct {
	accepted          atomic.Uint64
	handshakeFailures atomic.Uint64

	grace    time.Duration // disconnectGrace; shorter in tests
	shutOnce sync.Once

	// wg counts the listener's goroutines. Add happens only under mu while
	// not closed, so no Add can race with shutdown's Wait.
	wg sync.WaitGroup

	mu     sync.Mutex
	closed bool
	open   map[net.Conn]struct{} // raw connections, never a *tls.Conn
}

func newConnSet() *connSet {
	return &connSet{open: make(map[net.Conn]struct{}), grace: disconnectGrace}
}

// add counts and tracks a newly accepted raw connection. After shutdown it
// closes the connection instead and returns false.
func (s *connSet) add(raw net.Conn) bool {
	s.accepted.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = raw.Close()
		return false
	}
	s.open[raw] = struct{}{}
	return true
}

// drop stops tracking a raw connection and closes it.
func (s *connSet) drop(raw net.Conn) {
	s.mu.Lock()
	delete(s.open, raw)
	s.mu.Unlock()
	_ = raw.Close()
}

// spawn runs f in a new tracked goroutine, unless shut.
func (s *connSet) spawn(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Go(f)
	return true
}

// enter tracks the calling goroutine, which was started by someone else
// (mochi's Serve goroutine, net/http's connection goroutine), unless shut.
// A true return must be paired with leave.
func (s *connSet) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *connSet) leave() { s.wg.Done() }

func (s *connSet) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// shutdown runs a listener's Close: it marks the set shut, calls
// stopAccepting, lets closeClients disconnect the MQTT clients, closes every
// connection still open, and waits for every tracked goroutine to return.
// Only the first call does this; later calls wait for it to finish.
func (s *connSet) shutdown(stopAccepting, closeClients func()) {
	s.shutOnce.Do(func() { s.shutdownOnce(stopAccepting, closeClients) })
}

func (s *connSet) shutdownOnce(stopAccepting, closeClients func()) {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()

	stopAccepting()

	fired := make(chan struct{})
	grace := time.AfterFunc(s.grace, func() {
		defer close(fired)
		s.closeAll()
	})
	closeClients()
	if !grace.Stop() {
		<-fired
	}

	// Clients that never sent CONNECT, connections mid-handshake, and any
	// closeClients missed.
	s.closeAll()
	s.wg.Wait()
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	open := make([]net.Conn, 0, len(s.open))
	for c := range s.open {
		open = append(open, c)
	}
	s.mu.Unlock()
	// Raw connections: closing a *tls.Conn would first try to send
	// close_notify, which can block on a peer that stopped reading.
	for _, c := range open {
		_ = c.Close()
	}
}

func (s *connSet) stats() Stats {
	s.mu.Lock()
	active := len(s.open)
	s.mu.Unlock()
	return Stats{
		Accepted:          s.accepted.Load(),
		Active:            active,
		HandshakeFailures: s.handshakeFailures.Load(),
	}
}

// listen binds a TCP address with keep-alive on accepted connections.
func listen(address string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: keepAlive}
	return lc.Listen(context.Background(), "tcp", address)
}

// rawConn returns the network connection beneath a *tls.Conn, or c itself.
func rawConn(c net.Conn) net.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c
}
