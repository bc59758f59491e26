//go:build linux

package eventloop

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Socket is one non-blocking socket of a Loop. Reads, writes, shutdown and
// close are serialized by its lock, and none touches the descriptor after
// Close: a descriptor number freed by Close and given to a new socket is
// never read or written through the old one.
type Socket struct {
	l   *Loop
	fd  int32
	gen uint32 // tells this socket's events from a later socket's on the same descriptor

	hup    atomic.Bool // the peer hung up, or the socket failed
	queued atomic.Bool // queue is not empty

	mu     sync.Mutex
	closed bool
	werr   error  // a queued write failed: every later write fails
	queue  []byte // what the kernel did not take yet
}

// Fd returns the descriptor (until Close).
func (s *Socket) Fd() int { return int(s.fd) }

// Hup reports whether the poller saw the peer hang up (or an error): what
// is still in the socket ends with 0 or an error.
func (s *Socket) Hup() bool { return s.hup.Load() }

// Read reads what the socket has, without waiting: 0 with a nil error is
// the end of the stream, unix.EAGAIN means nothing now (a later arrival is
// reported to Handler.Readable).
func (s *Socket) Read(b []byte) (int, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, ErrClosed
	}
	var n int
	var err error
	for {
		n, err = unix.Read(int(s.fd), b)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	s.mu.Unlock()
	if n < 0 {
		n = 0
	}
	return n, err
}

// Write hands b to the kernel, and queues what it does not take at once
// (written when the socket becomes writable); it never blocks, and always
// takes all of b unless the socket is closed or failed. Bytes written are
// reported to Handler.Written, those written now before Write returns.
// The queue is not bounded here: the owner bounds what it writes.
func (s *Socket) Write(b []byte) (int, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, ErrClosed
	}
	if s.werr != nil {
		err := s.werr
		s.mu.Unlock()
		return 0, err
	}
	n := 0
	if len(s.queue) == 0 {
		var err error
		n, err = s.writeLocked(b)
		if err != nil {
			s.werr = err
			s.mu.Unlock()
			if n > 0 {
				s.l.h.Written(s, n)
			}
			return n, err
		}
	}
	if n < len(b) {
		s.queue = append(s.queue, b[n:]...)
		s.queued.Store(true)
	}
	s.mu.Unlock()
	if n > 0 {
		s.l.h.Written(s, n)
	}
	return len(b), nil
}

// writeLocked writes b until the kernel takes no more (EAGAIN: not an
// error) or fails.
func (s *Socket) writeLocked(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Write(int(s.fd), b[n:])
		if m > 0 {
			n += m
		}
		switch {
		case err == nil:
			if m == 0 {
				return n, nil
			}
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EAGAIN):
			return n, nil
		default:
			return n, err
		}
	}
	return n, nil
}

// flushQueued writes what is queued: the poller's, when the socket is
// writable.
func (s *Socket) flushQueued() {
	s.mu.Lock()
	if s.closed || s.werr != nil || len(s.queue) == 0 {
		s.mu.Unlock()
		return
	}
	n, err := s.writeLocked(s.queue)
	if err != nil {
		s.werr = err
		s.queue = nil
	} else if n == len(s.queue) {
		s.queue = nil // an idle socket keeps no buffer
	} else {
		s.queue = append(s.queue[:0], s.queue[n:]...)
	}
	s.queued.Store(len(s.queue) > 0)
	s.mu.Unlock()
	if n > 0 {
		s.l.h.Written(s, n)
	}
	if err != nil {
		s.l.h.Failed(s, err)
	}
}

// Queued returns how many bytes wait for the socket to become writable.
func (s *Socket) Queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// Shutdown shuts down the reading (unix.SHUT_RD), writing (SHUT_WR) or
// both sides; after Close it does nothing.
func (s *Socket) Shutdown(how int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	return unix.Shutdown(int(s.fd), how)
}

// Close closes the socket, dropping what is queued. It is idempotent.
func (s *Socket) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.queue = nil
	s.queued.Store(false)
	s.l.slots[s.fd].CompareAndSwap(s, nil) // before the number can be reused
	return unix.Close(int(s.fd))
}

// LocalAddr returns the socket's own address (nil if unknown).
func (s *Socket) LocalAddr() net.Addr { return s.addr(unix.Getsockname) }

// RemoteAddr returns the peer's address (nil if unknown).
func (s *Socket) RemoteAddr() net.Addr { return s.addr(unix.Getpeername) }

func (s *Socket) addr(get func(int) (unix.Sockaddr, error)) net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	sa, err := get(int(s.fd))
	if err != nil {
		return nil
	}
	return tcpAddr(sa)
}

func tcpAddr(sa unix.Sockaddr) *net.TCPAddr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: append(net.IP(nil), a.Addr[:]...), Port: a.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: append(net.IP(nil), a.Addr[:]...), Port: a.Port}
	}
	return nil
}
