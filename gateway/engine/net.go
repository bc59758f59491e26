package engine

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	ltls "github.com/lesismal/llib/std/crypto/tls"
	"github.com/lesismal/nbio"
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
	ln   net.Listener
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
	// No TCP keepalive: every connection has an MQTT keepalive on the
	// wheel (a client asking for none gets the server's maximum), and the
	// four setsockopt calls per accepted socket were ~6 % of a connect
	// storm's CPU. Go sets TCP_NODELAY on every accepted socket itself.
	lc := net.ListenConfig{KeepAlive: -1}
	ln, err := lc.Listen(e.ctx, "tcp", cfg.Addr)
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
		nc, err := l.ln.Accept()
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
		l.accept(nc)
	}
}

func (l *listener) accept(nc net.Conn) {
	e := l.e
	remote := nc.RemoteAddr().String()
	var release func()
	if lim := e.opts.Hooks.Limits; lim != nil && !l.cfg.ProxyProtocol {
		r, err := lim.Admit(remote)
		if err != nil {
			e.m.admissionRefused.Add(1)
			_ = nc.Close()
			e.log.Debug().Err(err).Str(logRemote, remote).Msg("connection refused")
			return
		}
		release = r
	}
	nbc, err := nbio.NBConn(nc)
	if err != nil {
		_ = nc.Close()
		if release != nil {
			release()
		}
		return
	}
	c := newConn(e, nil, l, remote)
	c.release = release
	c.proxyPending = l.cfg.ProxyProtocol
	t := &tcpTransport{nc: nbc}
	c.t = t
	if l.tls != nil {
		c.t = newTLSTransport(t, l.tls)
	}
	if l.cfg.Type == "ws" {
		c.t = newWSTransport(c.t, l.cfg.Path, e.opts.MaxPacketBytes)
	}
	c.nbc = nbc
	// The connect timeout first: c's first turn (the event loop finds c
	// in the table) is then ordered after what watch read of c.
	c.watch()
	if !e.conns.add(c) { // the event loop finds c here
		_ = nbc.Close()
		if release != nil {
			release()
		}
		return
	}
	if _, err := e.nb.AddConn(nbc); err != nil {
		e.log.Warn().Err(err).Str(logRemote, remote).Msg("add connection to the event loop")
		c.kill(Success, reasonLost, err)
		return
	}
	c.schedule(wRead) // bytes may have arrived before the socket was watched
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
	nc *nbio.Conn
}

func (t *tcpTransport) decode(raw []byte) ([]byte, error) { return raw, nil }

func (t *tcpTransport) write(b []byte) error {
	_, err := t.nc.Write(b)
	return err
}

func (t *tcpTransport) closeWrite() { _ = shutdownSocket(t.nc, syscall.SHUT_WR) }

func (t *tcpTransport) close() { closeSocket(t.nc) }

// closeSocket ends a socket the event loop watches without closing its
// descriptor on this goroutine: it is shut down both ways, the event loop
// sees the hang-up and closes it, on its own goroutine. Closing it here
// would free the descriptor's number while the event loop may still hold
// an event read for it (the client's own hang-up, as it leaves after our
// last packet); a socket accepted meanwhile gets the number, and the
// event loop, which knows sockets by number, would apply that event to it
// and close a new connection before its CONNACK. (nbio closes a socket
// here itself when a write fails: that rarer case remains.)
func closeSocket(nc *nbio.Conn) {
	if err := shutdownSocket(nc, syscall.SHUT_RDWR); err != nil && !errors.Is(err, syscall.ENOTCONN) {
		_ = nc.Close() // not a socket the event loop will hear of again
	}
}

// shutdownSocket shuts nc's socket down (how: SHUT_WR, SHUT_RDWR) unless
// the event loop closed it: its lock keeps the descriptor ours meanwhile.
// ENOTCONN: the peer reset it, the event loop heard that and closes it.
func shutdownSocket(nc *nbio.Conn, how int) error {
	rc, err := nc.SyscallConn()
	if err != nil {
		return err
	}
	nc.Lock()
	defer nc.Unlock()
	if closed, _ := nc.IsClosed(); closed {
		return nil
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = syscall.Shutdown(int(fd), how) }); err != nil {
		return err
	}
	return serr
}

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
	c.t.close()
	c.e.conns.remove(c)
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
