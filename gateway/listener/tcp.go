package listener

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/rs/zerolog"
)

// Accept backs off on errors other than a closed listener (EMFILE, ENFILE,
// ECONNABORTED …) from minAcceptDelay, doubling, to maxAcceptDelay.
const (
	minAcceptDelay = 5 * time.Millisecond
	maxAcceptDelay = time.Second
)

// TCP is a mochi listener for MQTT over TCP, or over TLS when its Config has
// TLS set. Its methods are safe for concurrent use.
type TCP struct {
	bound
	cfg  Config
	log  zerolog.Logger
	done chan struct{} // closed by Close; ends an accept back-off
}

var _ listeners.Listener = (*TCP)(nil)

// NewTCP returns a TCP listener for cfg. Nothing is bound until Init.
func NewTCP(cfg Config) *TCP {
	cfg = cfg.withDefaults()
	return &TCP{
		bound: newBound(cfg.ID, cfg.Address),
		cfg:   cfg,
		log:   cfg.Log.With().Str(fieldListener, cfg.ID).Logger(),
		done:  make(chan struct{}),
	}
}

// Protocol returns "tls" when the listener speaks TLS, else "tcp".
func (l *TCP) Protocol() string {
	if l.cfg.TLS != nil {
		return "tls"
	}
	return "tcp"
}

// Init validates the config and binds the address. Mochi's logger is not
// used: the listener logs to Config.Log.
func (l *TCP) Init(*slog.Logger) error {
	if err := errors.Join(l.cfg.validate()...); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := l.bindLocked()
	return err
}

// Serve accepts connections until Close, handing each to establish in a
// goroutine of its own. It returns at once if Init has not succeeded or the
// listener is closed.
func (l *TCP) Serve(establish listeners.EstablishFn) {
	l.mu.Lock()
	ln := l.ln
	l.mu.Unlock()
	if ln == nil || !l.conns.enter() {
		return
	}
	defer l.conns.leave()

	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || l.conns.isClosed() {
				return
			}
			delay = nextDelay(delay)
			l.log.Warn().Err(err).Dur(fieldDelay, delay).Msg("accept")
			select {
			case <-time.After(delay):
				continue
			case <-l.done:
				return
			}
		}
		delay = 0
		if !l.conns.add(c) {
			return
		}
		if l.cfg.TLS == nil {
			l.start(c, c, establish)
		} else if !l.conns.spawn(func() { l.handshake(c, establish) }) {
			l.conns.drop(c)
		}
	}
}

// handshake runs the TLS handshake of raw under HandshakeTimeout, then hands
// the connection to a fresh goroutine. The handshake grows this goroutine's
// stack, which Go would keep for most of the connection's life; ending here
// lets an idle MQTT connection live on a small stack (see the package doc).
func (l *TCP) handshake(raw net.Conn, establish listeners.EstablishFn) {
	tc := tls.Server(raw, l.cfg.TLS)
	err := raw.SetDeadline(time.Now().Add(l.cfg.HandshakeTimeout))
	if err == nil {
		err = tc.Handshake()
	}
	if err == nil {
		err = raw.SetDeadline(time.Time{})
	}
	if err != nil {
		l.conns.handshakeFailures.Add(1)
		l.log.Debug().Err(err).Str(fieldRemote, raw.RemoteAddr().String()).Msg("tls handshake")
		l.conns.drop(raw)
		return
	}
	l.start(raw, tc, establish)
}

// start runs establish for conn, whose network connection is raw, in a new
// goroutine that closes raw when establish returns.
func (l *TCP) start(raw, conn net.Conn, establish listeners.EstablishFn) {
	ok := l.conns.spawn(func() {
		defer l.conns.drop(raw)
		if err := establish(l.cfg.ID, conn); err != nil {
			l.log.Debug().Err(err).Str(fieldRemote, raw.RemoteAddr().String()).Msg("connection ended")
		}
	})
	if !ok {
		l.conns.drop(raw)
	}
}

// Close stops accepting, calls closeClients once so mochi can disconnect the
// clients that completed CONNECT, closes every connection still open, and
// returns when every goroutine the listener started has returned. Calls
// after the first return at once; concurrent calls wait for the first.
func (l *TCP) Close(closeClients listeners.CloseFn) {
	l.conns.shutdown(func() {
		close(l.done)
		l.mu.Lock()
		ln := l.ln
		l.mu.Unlock()
		if ln != nil {
			_ = ln.Close()
		}
	}, func() {
		if closeClients != nil {
			closeClients(l.cfg.ID)
		}
	})
}

// nextDelay returns the accept back-off after d.
func nextDelay(d time.Duration) time.Duration {
	if d == 0 {
		return minAcceptDelay
	}
	return min(2*d, maxAcceptDelay)
}
