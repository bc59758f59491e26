//go:build linux || darwin

package mqttbench

import (
	"errors"
	"net"
	"syscall"
)

// alive reports whether the server still holds conn open, without
// blocking: it reads and discards what has arrived (PINGRESPs), then sees
// whether the stream has ended.
//
// A TLS or WebSocket connection is looked at through its TCP connection:
// what it discards there is lost to the upper layer, so call alive only
// when nothing more is to be read.
func alive(conn net.Conn) bool {
	for {
		u, ok := conn.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		conn = u.NetConn()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := true
	var buf [256]byte
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_DONTWAIT)
			switch {
			case errors.Is(err, syscall.EINTR):
				continue
			case errors.Is(err, syscall.EAGAIN):
				// Nothing more to read: open.
			case err != nil || n == 0: // reset, or end of stream
				open = false
			default:
				continue
			}
			return true // done: do not wait for readability
		}
	})
	return open && err == nil
}
