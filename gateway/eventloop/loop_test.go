//go:build linux

package eventloop_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/ferrymq/ferrymq/gateway/eventloop"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a Handler that reads what a socket has into a per-socket
// buffer and counts what was written.
type recorder struct {
	mu      sync.Mutex
	got     map[*eventloop.Socket]*bytes.Buffer
	eof     map[*eventloop.Socket]bool
	readErr map[*eventloop.Socket]error
	failed  map[*eventloop.Socket]error
	written atomic.Int64
	echo    bool
}

func newRecorder() *recorder {
	return &recorder{got: map[*eventloop.Socket]*bytes.Buffer{}, eof: map[*eventloop.Socket]bool{},
		readErr: map[*eventloop.Socket]error{}, failed: map[*eventloop.Socket]error{}}
}

func (r *recorder) Readable(s *eventloop.Socket) {
	buf := make([]byte, 4096)
	for {
		n, err := s.Read(buf)
		r.mu.Lock()
		if n > 0 {
			if r.got[s] == nil {
				r.got[s] = &bytes.Buffer{}
			}
			r.got[s].Write(buf[:n])
		}
		switch {
		case err == nil && n == 0:
			r.eof[s] = true
		case err != nil && !errors.Is(err, unix.EAGAIN):
			r.readErr[s] = err
		}
		r.mu.Unlock()
		if r.echo && n > 0 {
			_, _ = s.Write(buf[:n])
		}
		if err != nil || n == 0 {
			return
		}
	}
}

func (r *recorder) Written(_ *eventloop.Socket, n int) { r.written.Add(int64(n)) }

func (r *recorder) Failed(s *eventloop.Socket, err error) {
	r.mu.Lock()
	r.failed[s] = err
	r.mu.Unlock()
}

func (r *recorder) received(s *eventloop.Socket) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.got[s]; b != nil {
		return bytes.Clone(b.Bytes())
	}
	return nil
}

func (r *recorder) sawEOF(s *eventloop.Socket) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eof[s]
}

// server is a loop with a listener on loopback whose accepted sockets
// come out of accepted.
type server struct {
	loop     *eventloop.Loop
	ln       *eventloop.Listener
	accepted chan *eventloop.Socket
	done     chan struct{}
}

func newServer(t *testing.T, h eventloop.Handler, pollers int) *server {
	t.Helper()
	loop, err := eventloop.New(pollers, h)
	require.NoError(t, err)
	ln, err := eventloop.Listen("127.0.0.1:0")
	require.NoError(t, err)
	acc := ln
	s := &server{loop: loop, ln: ln, accepted: make(chan *eventloop.Socket, 64), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			fd, _, err := acc.Accept()
			if err != nil {
				return
			}
			sock, err := loop.Add(fd)
			if err != nil {
				_ = unix.Close(fd)
				continue
			}
			if err := sock.Watch(); err != nil {
				_ = sock.Close()
				continue
			}
			s.accepted <- sock
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-s.done
		require.NoError(t, loop.Close())
	})
	return s
}

func (s *server) dial(t *testing.T) (net.Conn, *eventloop.Socket) {
	t.Helper()
	c, err := net.Dial("tcp", s.ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	select {
	case sock := <-s.accepted:
		return c, sock
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted")
		return nil, nil
	}
}

func TestEchoThroughThePoller(t *testing.T) {
	r := newRecorder()
	r.echo = true
	srv := newServer(t, r, 2)
	for range 4 {
		c, _ := srv.dial(t)
		msg := bytes.Repeat([]byte("ferrymq "), 1000)
		_, err := c.Write(msg)
		require.NoError(t, err)
		back := make([]byte, len(msg))
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err = io.ReadFull(c, back)
		require.NoError(t, err)
		require.Equal(t, msg, back)
	}
}

func TestReadableBeforeWatchIsReported(t *testing.T) {
	r := newRecorder()
	loop, err := eventloop.New(1, r)
	require.NoError(t, err)
	defer loop.Close()
	ln, err := eventloop.Listen("127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	acc := ln
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("early"))
	require.NoError(t, err)
	fd, remote, err := acc.Accept()
	require.NoError(t, err)
	require.Equal(t, c.LocalAddr().String(), remote.String())
	sock, err := loop.Add(fd)
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the bytes are in the socket before it is watched
		var b [1]byte
		n, _, _ := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return n == 1
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, sock.Watch())
	require.Eventually(t, func() bool { return string(r.received(sock)) == "early" }, 5*time.Second, time.Millisecond)
}

func TestWritesQueueAndDrainInOrder(t *testing.T) {
	r := newRecorder()
	srv := newServer(t, r, 1)
	c, sock := srv.dial(t)
	// Far more than the socket buffers hold while the peer reads nothing.
	chunk := make([]byte, 64<<10)
	var want bytes.Buffer
	for i := range 128 {
		for j := range chunk {
			chunk[j] = byte(i + j)
		}
		want.Write(chunk)
		n, err := sock.Write(chunk)
		require.NoError(t, err)
		require.Equal(t, len(chunk), n)
	}
	require.Positive(t, sock.Queued(), "8 MiB unread fit the socket buffers")
	require.Less(t, r.written.Load(), int64(want.Len()))

	got := make([]byte, want.Len())
	require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want.Bytes(), got), "bytes out of order or lost")
	require.Eventually(t, func() bool { return r.written.Load() == int64(want.Len()) }, 5*time.Second, time.Millisecond)
	require.Zero(t, sock.Queued())
}

func TestPeerHangUpAfterDataIsReadToTheEnd(t *testing.T) {
	r := newRecorder()
	srv := newServer(t, r, 1)
	c, sock := srv.dial(t)
	_, err := c.Write([]byte("last words"))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return r.sawEOF(sock) }, 5*time.Second, time.Millisecond)
	require.Equal(t, "last words", string(r.received(sock)))
	require.True(t, sock.Hup())
}

func TestQueuedWriteToAResetPeerFails(t *testing.T) {
	r := newRecorder()
	srv := newServer(t, r, 1)
	c, sock := srv.dial(t)
	for range 256 { // until the kernel stops taking it
		_, err := sock.Write(make([]byte, 64<<10))
		require.NoError(t, err)
		if sock.Queued() > 0 {
			break
		}
	}
	require.Positive(t, sock.Queued())
	require.NoError(t, c.(*net.TCPConn).SetLinger(0)) // close sends a reset
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.failed[sock] != nil || r.readErr[sock] != nil
	}, 5*time.Second, time.Millisecond)
	// Whichever the poller noticed first, the socket refuses writes once
	// the queue's write failed.
	require.Eventually(t, func() bool {
		_, err := sock.Write([]byte("x"))
		return err != nil
	}, 5*time.Second, time.Millisecond)
}

func TestClosedSocketIsNeverTouchedAgain(t *testing.T) {
	r := newRecorder()
	srv := newServer(t, r, 1)
	_, old := srv.dial(t)
	oldFD := old.Fd()
	require.NoError(t, old.Close())
	require.NoError(t, old.Close(), "Close is idempotent")
	n, err := old.Read(make([]byte, 1))
	require.ErrorIs(t, err, eventloop.ErrClosed)
	require.Zero(t, n)
	_, err = old.Write([]byte("x"))
	require.ErrorIs(t, err, eventloop.ErrClosed)

	// The next socket most likely gets the same descriptor number: what
	// arrives for it is its own, never the closed socket's.
	c, sock := srv.dial(t)
	_, err = c.Write([]byte("mine"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return string(r.received(sock)) == "mine" }, 5*time.Second, time.Millisecond)
	require.Nil(t, r.received(old))
	t.Logf("old descriptor %d, new %d", oldFD, sock.Fd())
}

func TestCloseEndsPollersAndClosesSockets(t *testing.T) {
	r := newRecorder()
	loop, err := eventloop.New(3, r)
	require.NoError(t, err)
	require.Equal(t, 3, loop.Goroutines())
	ln, err := eventloop.Listen("127.0.0.1:0")
	require.NoError(t, err)
	acc := ln
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	fd, _, err := acc.Accept()
	require.NoError(t, err)
	sock, err := loop.Add(fd)
	require.NoError(t, err)
	require.NoError(t, sock.Watch())

	require.NoError(t, loop.Close())
	require.NoError(t, loop.Close())
	_, err = sock.Write([]byte("x"))
	require.ErrorIs(t, err, eventloop.ErrClosed)
	_, err = loop.Add(fd)
	require.ErrorIs(t, err, eventloop.ErrClosed)
	// The peer sees the close.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)

	require.NoError(t, ln.Close())
	_, _, err = acc.Accept()
	require.ErrorIs(t, err, net.ErrClosed)
}
