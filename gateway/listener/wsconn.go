package listener

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// wsConn presents a websocket connection as the byte stream mochi reads MQTT
// from. Read returns the payloads of binary messages back to back, so an MQTT
// packet may span messages and a message may hold several packets
// [MQTT-6.0.0-2]; Write sends each call as one binary message. Like any
// net.Conn its methods may be called from several goroutines.
type wsConn struct {
	ws *websocket.Conn

	// rmu serialises reads: gorilla allows one reader at a time.
	rmu  sync.Mutex
	r    io.Reader // the message being read; nil between messages
	rerr error     // sticky: gorilla panics on reads after a failed one

	// wmu serialises writes and gorilla's write deadline: gorilla allows
	// one writer at a time.
	wmu sync.Mutex
	// wdl is the write deadline in Unix nanoseconds, 0 for none. It is
	// kept here so SetWriteDeadline never waits behind a blocked Write.
	wdl atomic.Int64
}

var _ net.Conn = (*wsConn)(nil)

func newWSConn(ws *websocket.Conn) *wsConn { return &wsConn{ws: ws} }

// Read reads MQTT bytes, moving on to the next message when one is used up.
// A text message is an error [MQTT-6.0.0-1]; a close frame with a normal
// status reads as io.EOF.
func (c *wsConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for c.rerr == nil {
		if c.r == nil {
			typ, r, err := c.ws.NextReader()
			switch {
			case err != nil:
				c.rerr = readError(err)
			case typ != websocket.BinaryMessage:
				c.rerr = ErrNotBinary
			default:
				c.r = r
			}
			continue
		}
		n, err := c.r.Read(p)
		if err == io.EOF {
			c.r = nil
			err = nil
		}
		if err != nil {
			c.rerr = readError(err)
		}
		if n > 0 {
			return n, nil
		}
	}
	return 0, c.rerr
}

func readError(err error) error {
	if websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseNoStatusReceived) {
		return io.EOF
	}
	return err
}

// Write sends p as one binary message.
func (c *wsConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var dl time.Time
	if ns := c.wdl.Load(); ns != 0 {
		dl = time.Unix(0, ns)
	}
	_ = c.ws.SetWriteDeadline(dl) // only stores it; gorilla applies it per frame
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close closes the network connection without a close handshake.
func (c *wsConn) Close() error { return c.ws.Close() }

// closeFrameTimeout bounds CloseWrite's close frame.
const closeFrameTimeout = time.Second

// CloseWrite starts the closing handshake (RFC 6455 §7.1.2): it sends a
// close frame with status 1000 and nothing after it; the connection stays
// open for reading. The gateway calls it, then shuts the layers under it
// (NetConn), for a lingering close after a server-side DISCONNECT.
func (c *wsConn) CloseWrite() error {
	msg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")
	return c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(closeFrameTimeout))
}

// NetConn returns the connection the websocket runs on (TCP, or TLS for
// wss).
func (c *wsConn) NetConn() net.Conn { return c.ws.NetConn() }

// LocalAddr returns the local network address.
func (c *wsConn) LocalAddr() net.Addr { return c.ws.LocalAddr() }

// RemoteAddr returns the peer's network address.
func (c *wsConn) RemoteAddr() net.Addr { return c.ws.RemoteAddr() }

// SetDeadline sets the read and write deadlines.
func (c *wsConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline for Read, including one blocked now.
func (c *wsConn) SetReadDeadline(t time.Time) error {
	return c.ws.NetConn().SetReadDeadline(t)
}

// SetWriteDeadline sets the deadline for Write, including one blocked now.
func (c *wsConn) SetWriteDeadline(t time.Time) error {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	c.wdl.Store(ns)
	// Gorilla sets the network deadline at the start of each frame, so this
	// reaches only a write already under way; Write passes t on for the rest.
	return c.ws.NetConn().SetWriteDeadline(t)
}
