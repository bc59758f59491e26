//go:build linux

package eventloop

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Listener is a listening TCP socket whose connections are accepted as
// bare descriptors. It waits on Go's netpoller; Close ends Accept.
type Listener struct {
	f    *os.File
	rc   syscall.RawConn
	addr net.Addr
}

// Listen binds addr as net.Listen("tcp", addr) does, and keeps the
// listening socket outside the net package (its RawConn cannot wait for
// readability of a listener).
func Listen(addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("eventloop: listener descriptor: %w", err)
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, fmt.Errorf("eventloop: listener descriptor: %w", err)
	}
	if derr != nil {
		return nil, fmt.Errorf("eventloop: duplicate listener descriptor: %w", derr)
	}
	f, frc, err := onNetpoller(fd, "listener")
	if err != nil {
		return nil, err
	}
	return &Listener{f: f, rc: frc, addr: ln.Addr()}, nil
}

// Addr returns the bound address.
func (l *Listener) Addr() net.Addr { return l.addr }

// Close stops listening; a waiting Accept returns net.ErrClosed.
func (l *Listener) Close() error { return l.f.Close() }

// Accept waits for a connection and returns its descriptor —
// non-blocking, close-on-exec, TCP_NODELAY set — and the peer's address.
// After the listener's Close it returns net.ErrClosed. Other errors
// (EMFILE and the like) are the caller's to back off from.
func (a *Listener) Accept() (int, netip.AddrPort, error) {
	for {
		var nfd int
		var sa unix.Sockaddr
		var aerr error
		err := a.rc.Read(func(fd uintptr) bool {
			nfd, sa, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			return !errors.Is(aerr, unix.EAGAIN)
		})
		if err != nil {
			return -1, netip.AddrPort{}, fmt.Errorf("eventloop: accept: %w", errors.Join(net.ErrClosed, err))
		}
		switch {
		case aerr == nil:
		case errors.Is(aerr, unix.EINTR), errors.Is(aerr, unix.ECONNABORTED):
			continue // the client left before we took it
		default:
			return -1, netip.AddrPort{}, fmt.Errorf("eventloop: accept: %w", aerr)
		}
		// Small MQTT packets go out at once (Go's own accept does the same).
		_ = unix.SetsockoptInt(nfd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		return nfd, addrPort(sa), nil
	}
}

func addrPort(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	}
	return netip.AddrPort{}
}
