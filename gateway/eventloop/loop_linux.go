//go:build linux

package eventloop

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Handler is told what happens to the loop's sockets. Its methods run on a
// poller's goroutine (Written also on the goroutine that called Write) and
// must not block: a poller serves many sockets.
type Handler interface {
	// Readable: s may have bytes to read, or its peer hung up or it failed
	// (Socket.Hup); reading until EAGAIN, 0 (the end) or an error tells.
	// The edge is reported once: bytes left unread raise no new call.
	Readable(s *Socket)
	// Written: n more bytes of what was given to Write went to the kernel.
	Written(s *Socket, n int)
	// Failed: writing what Write had queued failed; s refuses writes from
	// now on. The owner still closes it.
	Failed(s *Socket, err error)
}

// Loop is a set of pollers and the sockets they watch.
type Loop struct {
	h       Handler
	pollers []*poller
	// slots holds the open sockets by descriptor: a descriptor is one
	// socket's at a time, and the generation in each event tells a stale
	// event from a new socket's.
	slots []atomic.Pointer[Socket]
	gen   atomic.Uint32

	closed    atomic.Bool
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type poller struct {
	l    *Loop
	epfd int
	file *os.File // epfd on Go's netpoller
	rc   syscall.RawConn
}

// eventsPerWait bounds what one epoll_wait returns.
const eventsPerWait = 256

// maxSlots bounds the socket table when the open-file limit is unlimited.
const maxSlots = 1 << 24

// MaxFDs is the size of a loop's socket table: the process's open-file
// limit (Go raises it to the hard limit at start), at most 1<<24. Only the
// pages of descriptors in use are ever touched.
func MaxFDs() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > maxSlots {
		return maxSlots
	}
	return int(lim.Cur)
}

// New starts pollers goroutines (at least one) that report to h.
func New(pollers int, h Handler) (*Loop, error) {
	if pollers < 1 {
		pollers = 1
	}
	l := &Loop{h: h, slots: make([]atomic.Pointer[Socket], MaxFDs())}
	for range pollers {
		p, err := newPoller(l)
		if err != nil {
			for _, p := range l.pollers {
				_ = p.file.Close()
			}
			return nil, err
		}
		l.pollers = append(l.pollers, p)
	}
	for _, p := range l.pollers {
		l.wg.Go(p.run)
	}
	return l, nil
}

func newPoller(l *Loop) (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventloop: epoll_create1: %w", err)
	}
	f, rc, err := onNetpoller(epfd, "epoll")
	if err != nil {
		return nil, err
	}
	return &poller{l: l, epfd: epfd, file: f, rc: rc}, nil
}

// onNetpoller puts fd, which it takes over (closed on error), on Go's
// netpoller: its RawConn's Read then parks the goroutine until fd is
// readable. name says what fd is, in the file's name and in errors.
func onNetpoller(fd int, name string) (*os.File, syscall.RawConn, error) {
	// Non-blocking before os.NewFile: then the file goes on the netpoller.
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, nil, fmt.Errorf("eventloop: %s descriptor non-blocking: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("eventloop: %s descriptor on the netpoller: %w", name, err)
	}
	return f, rc, nil
}

// run reports events until the loop closes. It asks epoll for events
// without waiting; when there are none, RawConn.Read parks the goroutine
// on the netpoller until the epoll set becomes readable again. Events that
// arrive between the empty epoll_wait and the park make the set readable
// after the park began (its readiness is edge-triggered on the
// netpoller), so none is missed.
func (p *poller) run() {
	events := make([]unix.EpollEvent, eventsPerWait)
	for {
		var n int
		var werr error
		err := p.rc.Read(func(fd uintptr) bool {
			n, werr = unix.EpollWait(int(fd), events, 0)
			if werr != nil {
				n = 0
				return true
			}
			return n > 0
		})
		if err != nil {
			return // the loop closed
		}
		if werr != nil {
			if errors.Is(werr, unix.EINTR) {
				continue
			}
			return // EBADF: closed under us
		}
		p.dispatch(events[:n])
	}
}

const (
	evRead  = unix.EPOLLIN | unix.EPOLLPRI | unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR
	evHup   = unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR
	evWrite = unix.EPOLLOUT
	// watched: an edge-triggered epoll reports the socket's whole state at
	// each event, so EPOLLOUT comes with most events (flushQueued is a
	// flag test then).
	watched = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET
)

func (p *poller) dispatch(events []unix.EpollEvent) {
	l := p.l
	for i := range events {
		ev := &events[i]
		fd := int(ev.Fd)
		if fd < 0 || fd >= len(l.slots) {
			continue
		}
		s := l.slots[fd].Load()
		if s == nil || s.gen != uint32(ev.Pad) {
			continue // for a socket closed since
		}
		if ev.Events&evHup != 0 {
			s.hup.Store(true)
		}
		if ev.Events&evWrite != 0 && s.queued.Load() {
			s.flushQueued()
		}
		if ev.Events&evRead != 0 {
			l.h.Readable(s)
		}
	}
}

// Add takes a connected, non-blocking socket descriptor (Accept's) into the
// loop. It is not watched until Watch: the owner records the socket first,
// so that the first event finds it. On error fd is still the caller's.
func (l *Loop) Add(fd int) (*Socket, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if fd < 0 || fd >= len(l.slots) {
		return nil, fmt.Errorf("%w: %d", ErrTooManyFDs, fd)
	}
	s := &Socket{l: l, fd: int32(fd), gen: l.gen.Add(1)}
	l.slots[fd].Store(s)
	return s, nil
}

// Watch puts s on its poller: from now on its events are reported. A
// socket that is already readable is reported at once.
func (s *Socket) Watch() error {
	p := s.l.pollers[int(s.fd)%len(s.l.pollers)]
	ev := unix.EpollEvent{Events: watched, Fd: s.fd, Pad: int32(s.gen)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, int(s.fd), &ev); err != nil {
		return fmt.Errorf("eventloop: watch socket %d: %w", s.fd, err)
	}
	return nil
}

// Close stops the pollers, closes every socket still open, and returns
// once the pollers' goroutines have ended.
func (l *Loop) Close() error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		for _, p := range l.pollers {
			_ = p.file.Close() // wakes its goroutine with an error
		}
		l.wg.Wait()
		for i := range l.slots {
			if s := l.slots[i].Load(); s != nil {
				_ = s.Close()
			}
		}
	})
	return nil
}

// Goroutines returns how many goroutines the loop runs.
func (l *Loop) Goroutines() int { return len(l.pollers) }
