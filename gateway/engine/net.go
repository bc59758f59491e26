package engine

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	ltls "github.com/lesismal/llib/std/crypto/tls"
	"golang.org/x/sys/unix"

	"github.com/ferrymq/ferrymq/gateway/eventloop"
)

// transport is what lies between the socket and MQTT's bytes: nothing
// for plain TCP, TLS, WebSocket. The connection reads the socket itself;
// the transport decodes what was read and encodes what is written. Every
// call is made from the connection's turn except close (also from
// Shutdown).
type transport interface {
	// decode turns bytes read from the socket into MQTT bytes (it may write:
	// TLS handshakes, WebSocket pongs and the upgrade answer). The result
	// is valid until the next call.
	decode(raw []byte) ([]byte, error)
	// write queues b and never blocks.
	write(b []byte) error
	// closeWrite shuts the write side once what is queued went out (FIN,
	// TLS close_notify, WebSocket close frame).
	closeWrite()
	close()
	tlsState() *tls.ConnectionState
}

// listener is one bound listener and its accept loop.
type listener struct {
	e    *Engine
	cfg  Listener
	name string
	ln   *eventloop.Listener
	tls  *ltls.Config
}

func (e *Engine) listen(cfg *Listener) (*listener, error) {
	l := &listener{e: e, cfg: *cfg, name: cfg.Name}
	if cfg.TLS != nil {
		tc, err := llibConfig(cfg.TLS)
		if err != nil {
			return nil, fmt.Errorf("engine: listener %s: %w", cfg.Name, err)
		}
		l.tls = tc
	}
	// Connections are accepted as bare descriptors (eventloop.Listener:
	// accept4, TCP_NODELAY, nothing else). No TCP keepalive: every
	// connection has an MQTT keepalive on the wheel (a client asking for
	// none gets the server's maximum).
	ln, err := eventloop.Listen(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("engine: listener %s on %s: %w", cfg.Name, cfg.Addr, err)
	}
	l.ln = ln
	return l, nil
}

// serve accepts until the listener closes. Each socket is checked by the
// Limits hook (unless a PROXY header must name the client first), handed
// to the event loop, and watched for its connect timeout; no goroutine is
// left behind for it.
func (l *listener) serve() {
	e := l.e
	backoff := time.Millisecond
	for {
		fd, remote, err := l.ln.Accept()
		if err != nil {
			if e.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			e.log.Warn().Err(err).Str(logListener, l.name).Msg("accept")
			time.Sleep(backoff) // EMFILE and the like: do not spin
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		e.m.accepted.Add(1)
		l.accept(fd, remote.String())
	}
}

func (l *listener) accept(fd int, remote string) {
	e := l.e
	var release func()
	if lim := e.opts.Hooks.Limits; lim != nil && !l.cfg.ProxyProtocol {
		r, err := lim.Admit(remote)
		if err != nil {
			e.m.admissionRefused.Add(1)
			_ = unix.Close(fd)
			e.log.Debug().Err(err).Str(logRemote, remote).Msg("connection refused")
			return
		}
		release = r
	}
	sock, err := e.loop.Add(fd)
	if err != nil {
		_ = unix.Close(fd)
		if release != nil {
			release()
		}
		e.log.Warn().Err(err).Str(logRemote, remote).Msg("add connection to the event loop")
		return
	}
	c := newConn(e, nil, l, remote)
	c.release = release
	c.proxyPending = l.cfg.ProxyProtocol
	t := &tcpTransport{sock: sock}
	c.t = t
	if l.tls != nil {
		c.t = newTLSTransport(t, l.tls)
	}
	if l.cfg.Type == "ws" {
		c.t = newWSTransport(c.t, l.cfg.Path, e.opts.MaxPacketBytes)
	}
	c.sock = sock
	// The connect timeout first: c's first turn (the event loop finds c
	// in the table) is then ordered after what watch read of c.
	c.watch()
	if !e.conns.add(c) { // the event loop finds c here
		_ = sock.Close()
		if release != nil {
			release()
		}
		return
	}
	// Bytes that arrived before the socket was watched are reported at
	// once (epoll polls a socket as it is added).
	if err := sock.Watch(); err != nil {
		e.log.Warn().Err(err).Str(logRemote, remote).Msg("add connection to the event loop")
		c.kill(Success, reasonLost, err)
	}
}

// transportClosed is the event loop's news that the socket closed.
func (c *conn) transportClosed(err error) {
	c.mu.Lock()
	c.eof = true
	if c.rdErr == nil && err != nil {
		c.rdErr = err
	}
	c.mu.Unlock()
	c.schedule(wGone) // a closed connection's turn ignores it
}

// tcpTransport is a plain socket on the event loop.
type tcpTransport struct {
	sock *eventloop.Socket
}

func (t *tcpTransport) decode(raw []byte) ([]byte, error) { return raw, nil }

func (t *tcpTransport) write(b []byte) error {
	_, err := t.sock.Write(b)
	return err
}

func (t *tcpTransport) closeWrite() { _ = t.sock.Shutdown(unix.SHUT_WR) }

func (t *tcpTransport) close() { _ = t.sock.Close() }

func (t *tcpTransport) tlsState() *tls.ConnectionState { return nil }

// Lingering close (conn.linger): the write side is shut once the socket
// took our last bytes; reads are discarded until the client closes,
// lingerFor passes or lingerMax bytes arrived.
const (
	lingerFor = 2 * time.Second
	lingerMax = 1 << 20
)

func (e *Engine) lingerStart(c *conn) {
	c.lingerUntil.Store(time.Now().Add(lingerFor).UnixNano())
	c.lingerShut = false
	c.lingerStep()
	c.watch()
}

// lingerStep shuts the write side when nothing is left to write, and
// closes when the linger is over.
func (c *conn) lingerStep() {
	if !c.lingerShut && !c.backlogged() {
		c.lingerShut = true
		c.t.closeWrite()
	}
	if c.lingerRead >= lingerMax || time.Now().UnixNano() >= c.lingerUntil.Load() {
		c.lingerDone()
	}
}

// lingerDone closes a lingering connection for good.
func (c *conn) lingerDone() {
	if !c.lingering.Load() {
		return
	}
	c.lingering.Store(false)
	c.e.conns.remove(c) // first: the descriptor is not reused while c is in the table
	c.t.close()
}

// drainLingering discards what a lingering connection's client sent; a
// close (gone) ends the linger.
func (c *conn) drainLingering(gone bool) {
	c.mu.Lock()
	raw := c.inbox
	c.inbox = nil
	eof := c.eof
	c.mu.Unlock()
	c.lingerRead += len(raw)
	if raw != nil {
		putInbox(raw)
	}
	if gone || eof || c.lingerRead >= lingerMax {
		c.lingerDone()
	}
}
