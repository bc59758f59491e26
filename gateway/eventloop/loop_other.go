//go:build !linux

package eventloop

import (
	"net"
	"net/netip"
)

// The event loop is epoll's; elsewhere New refuses, and the types exist so
// that their users build.

type Handler interface {
	Readable(s *Socket)
	Written(s *Socket, n int)
	Failed(s *Socket, err error)
}

type Loop struct{}

func New(int, Handler) (*Loop, error) { return nil, ErrUnsupported }

func MaxFDs() int { return 0 }

func (*Loop) Add(int) (*Socket, error) { return nil, ErrUnsupported }
func (*Loop) Close() error             { return nil }
func (*Loop) Goroutines() int          { return 0 }

type Socket struct{}

func (*Socket) Watch() error              { return ErrUnsupported }
func (*Socket) Fd() int                   { return -1 }
func (*Socket) Hup() bool                 { return true }
func (*Socket) Read([]byte) (int, error)  { return 0, ErrUnsupported }
func (*Socket) Write([]byte) (int, error) { return 0, ErrUnsupported }
func (*Socket) Queued() int               { return 0 }
func (*Socket) Shutdown(int) error        { return ErrUnsupported }
func (*Socket) Close() error              { return nil }
func (*Socket) LocalAddr() net.Addr       { return nil }
func (*Socket) RemoteAddr() net.Addr      { return nil }

type Listener struct{}

func Listen(string) (*Listener, error) { return nil, ErrUnsupported }

func (*Listener) Accept() (int, netip.AddrPort, error) { return -1, netip.AddrPort{}, ErrUnsupported }
func (*Listener) Addr() net.Addr                       { return nil }
func (*Listener) Close() error                         { return nil }
