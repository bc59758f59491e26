// Package eventloop is the gateway's readiness loop: many non-blocking
// sockets watched by a few goroutines, none per socket, so that an idle
// connection costs its socket and a small struct, never a goroutine.
//
// Each poller owns an edge-triggered epoll set. Its goroutine does not
// block an OS thread in epoll_wait: the epoll descriptor is itself put on
// Go's own netpoller (an epoll set is readable while it has events), and
// the poller asks it for events without waiting (epoll_wait with a zero
// timeout), parking on the netpoller when there are none. So the Go
// scheduler waits for the network in one place, for the poller and for
// every other goroutine alike, and a socket's readiness wakes the poller
// on the thread that noticed it. A loop that blocks in epoll_wait (nbio's,
// gnet's) holds a thread in a system call: at a few thousand messages a
// second on two cores each wake-up moved work between threads, and the
// gateway spent a third of its CPU on context switches (docs/gateway.md).
//
// The poller only reports: a socket is readable (or its peer hung up, or
// it failed) — the owner reads it, on the poller's goroutine or its own;
// bytes a Write could not hand to the kernel at once are queued on the
// socket and written by the poller when the socket becomes writable.
// Nothing is closed behind the owner's back: a socket closes when its
// owner calls Close, and events still in flight for a closed socket are
// told apart from those of a new socket that got the same descriptor
// number by a generation carried in each epoll event.
//
// Listener is the accepting side: accept4(2) straight from a listening
// socket on Go's netpoller, so an accepted connection is never registered
// with the netpoller, duplicated or given a Go net.Conn first.
//
// All methods are safe for concurrent use. Linux only (epoll); New returns
// ErrUnsupported elsewhere.
package eventloop
