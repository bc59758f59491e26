package listener

import (
	"bufio"
	"context"
	"crypto/tls"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/rs/zerolog"
)

// httpShutdownTimeout bounds Close's wait for net/http's own connection
// goroutines. By then every connection is closed, so it is rarely reached.
const httpShutdownTimeout = 5 * time.Second

// Websocket is a mochi listener for MQTT over websockets ("ws"), or over
// websockets over TLS ("wss") when its Config has TLS set. Its methods are
// safe for concurrent use.
type Websocket struct {
	bound    // its mu also guards the fields below its ln
	cfg      WSConfig
	log      zerolog.Logger
	upgrader websocket.Upgrader

	srvLn     net.Listener // ln, wrapped in TLS when configured
	srv       *http.Server
	establish listeners.EstablishFn
}

var _ listeners.Listener = (*Websocket)(nil)

// NewWebsocket returns a websocket listener for cfg. Nothing is bound until
// Init.
func NewWebsocket(cfg WSConfig) *Websocket {
	cfg = cfg.withDefaults()
	return &Websocket{
		bound: newBound(cfg.ID, cfg.Address),
		cfg:   cfg,
		log:   cfg.Log.With().Str(fieldListener, cfg.ID).Logger(),
		upgrader: websocket.Upgrader{
			HandshakeTimeout: cfg.HandshakeTimeout,
			ReadBufferSize:   cfg.ReadBufferSize,
			WriteBufferSize:  cfg.WriteBufferSize,
			WriteBufferPool:  new(sync.Pool),
			// [MQTT-6.0.0-3] has clients offer "mqtt"; older ones say
			// "mqttv3.1". The first of these the client offers is selected,
			// so "mqtt" whenever offered [MQTT-6.0.0-4]. A client that offers
			// neither is still served.
			Subprotocols: []string{"mqtt", "mqttv3.1"},
			// MQTT authenticates in CONNECT, never by cookie, so a
			// cross-origin page gains nothing a direct client lacks.
			CheckOrigin: func(*http.Request) bool { return true },
		},
	}
}

// Protocol returns "wss" when the listener speaks TLS, else "ws".
func (l *Websocket) Protocol() string {
	if l.cfg.TLS != nil {
		return "wss"
	}
	return "ws"
}

// Init validates the config, binds the address and prepares the HTTP
// server. Mochi's logger is not used: the listener logs to Config.Log.
func (l *Websocket) Init(*slog.Logger) error {
	if err := l.cfg.validate(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ln, err := l.bindLocked()
	if err != nil {
		return err
	}
	if l.cfg.TLS != nil {
		tc := l.cfg.TLS.Clone()
		// HTTP/1.1 only: websockets upgrade from it, not from HTTP/2.
		tc.NextProtos = []string{"http/1.1"}
		ln = tls.NewListener(ln, tc)
	}
	l.srv = &http.Server{
		Handler: http.HandlerFunc(l.serveHTTP),
		// ReadHeaderTimeout bounds the TLS handshake and the upgrade
		// request. No read or write timeout: after the upgrade mochi owns
		// the deadlines.
		ReadHeaderTimeout: l.cfg.HandshakeTimeout,
		IdleTimeout:       l.cfg.HandshakeTimeout,
		ConnState:         l.connState,
		ErrorLog:          log.New(httpLog{l.log}, "", 0),
	}
	l.srvLn = ln
	return nil
}

// Serve runs the HTTP server until Close; each upgraded connection is handed
// to establish in its HTTP handler's goroutine. It returns at once if Init
// has not succeeded or the listener is closed. Call it once.
func (l *Websocket) Serve(establish listeners.EstablishFn) {
	l.mu.Lock()
	srv, ln := l.srv, l.srvLn
	l.establish = establish
	l.mu.Unlock()
	if srv == nil || !l.conns.enter() {
		return
	}
	defer l.conns.leave()
	if err := srv.Serve(ln); !l.conns.isClosed() {
		l.log.Error().Err(err).Msg("serve")
	}
}

// connState tracks each raw connection from accept to close, so Close can
// reach those net/http holds as well as those it handed over by hijacking.
func (l *Websocket) connState(c net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		l.conns.add(rawConn(c))
	case http.StateClosed:
		if tc, ok := c.(*tls.Conn); ok && !tc.ConnectionState().HandshakeComplete {
			l.conns.handshakeFailures.Add(1)
		}
		l.conns.drop(rawConn(c))
	}
}

// serveHTTP upgrades a request for the MQTT path and runs mochi's client on
// it; it returns when the client is gone.
func (l *Websocket) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != l.cfg.Path {
		http.NotFound(w, r)
		return
	}
	if !l.conns.enter() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	defer l.conns.leave()

	hw := &hijackWatch{ResponseWriter: w}
	ws, err := l.upgrader.Upgrade(hw, r, nil)
	if hw.conn != nil {
		// Hijacked: net/http has let go of the connection and will not
		// report its close.
		defer l.conns.drop(rawConn(hw.conn))
	}
	if err != nil {
		l.log.Debug().Err(err).Str(fieldRemote, r.RemoteAddr).Msg("websocket upgrade")
		return
	}
	ws.SetReadLimit(l.cfg.MaxMessageSize)

	l.mu.Lock()
	establish := l.establish
	l.mu.Unlock()
	if err := establish(l.cfg.ID, newWSConn(ws)); err != nil {
		l.log.Debug().Err(err).Str(fieldRemote, r.RemoteAddr).Msg("connection ended")
	}
}

// Close stops accepting, calls closeClients once so mochi can disconnect the
// clients that completed CONNECT, closes every connection still open, and
// returns when every HTTP handler and the Serve loop have returned, and
// net/http's own connection goroutines too. Calls after the first return
// once the first has finished.
func (l *Websocket) Close(closeClients listeners.CloseFn) {
	l.conns.shutdown(func() {
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

	l.mu.Lock()
	srv := l.srv
	l.mu.Unlock()
	if srv == nil {
		return
	}
	// Every connection is closed by now; this waits for net/http's
	// goroutines to notice.
	ctx, cancel := context.WithTimeout(context.Background(), httpShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		l.log.Warn().Err(err).Msg("http shutdown")
	}
}

// hijackWatch records the connection the upgrader hijacks, so the handler
// closes it even when the upgrade fails after the hijack.
type hijackWatch struct {
	http.ResponseWriter
	conn net.Conn
}

func (h *hijackWatch) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err == nil {
		h.conn = c
	}
	return c, rw, err
}

// httpLog turns net/http's error log into events. Most lines are a peer's
// fault (a failed TLS handshake, a malformed request) and go out at debug;
// accept errors are the host's and go out at warn.
type httpLog struct{ log zerolog.Logger }

func (h httpLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	ev := h.log.Debug()
	if strings.HasPrefix(msg, "http: Accept error") {
		ev = h.log.Warn()
	}
	ev.Str(zerolog.ErrorFieldName, msg).Msg("http server")
	return len(p), nil
}
