package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// conn wraps every client socket before mochi sees it. Its Read follows the
// MQTT framing of the byte stream — without buffering or copying — so that:
//
//   - the first packet must be CONNECT, and must arrive within the connect
//     timeout (mochi sets no deadline before CONNECT);
//   - no packet may declare more than MaxPacketBytes, refused from the
//     fixed header before mochi allocates the body;
//   - a remaining length longer than 4 bytes is refused [MQTT-1.5.5];
//   - the CONNECT protocol level is known, so an MQTT 3 client never gets
//     an MQTT 5 CONNACK code (mochi passes some through).
//
// Writes get their own deadline (WriteTimeout) instead of sharing the
// keepalive read deadline mochi sets, so a client that stops reading is
// dropped without holding up the writer.
type conn struct {
	net.Conn
	maxPacket    int
	writeTimeout time.Duration
	client       atomic.Pointer[mqtt.Client] // set once CONNECT is accepted

	// Read-side framing state, owned by the connection's read goroutine.
	st        uint8
	typ       byte
	shift     uint8
	remaining int
	connected bool // the first CONNECT is complete
	hdrN      uint8
	hdr       [10]byte // start of the CONNECT variable header

	version    atomic.Uint32 // protocol level from CONNECT: 3, 4 or 5
	wroteFirst atomic.Bool
	stopping   atomic.Bool // the gateway shuts down: writes get shutdownWriteTimeout
}

// shutdownWriteTimeout bounds each write once shutdown began, so a client
// that stopped reading cannot hold up the DISCONNECT to everyone.
const shutdownWriteTimeout = time.Second

const (
	stHeader = iota
	stLength
	stBody
)

// Framing errors. A connection that hits one is closed.
var (
	// ErrNotConnect is returned when the first packet is not CONNECT [MQTT-3.1.0-1].
	ErrNotConnect = errors.New("gateway: first packet is not CONNECT")
	// ErrPacketTooLarge is returned for a packet over MaxPacketBytes.
	ErrPacketTooLarge = errors.New("gateway: packet too large")
	// ErrMalformedLength is returned for a remaining length over 4 bytes.
	ErrMalformedLength = errors.New("gateway: malformed remaining length")
	// ErrReservedType is returned for packet type 0.
	ErrReservedType = errors.New("gateway: reserved packet type")
)

func newConn(c net.Conn, o *Options) *conn {
	gc := &conn{Conn: c, maxPacket: o.MaxPacketBytes, writeTimeout: o.WriteTimeout}
	if o.ConnectTimeout > 0 {
		_ = c.SetReadDeadline(time.Now().Add(o.ConnectTimeout))
	}
	return gc
}

// Read reads from the socket and checks the framing of what it read.
func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if ferr := c.track(p[:n]); ferr != nil {
			return 0, ferr
		}
	}
	return n, err
}

// track advances the framing state machine over b.
func (c *conn) track(b []byte) error {
	for i := 0; i < len(b); {
		switch c.st {
		case stHeader:
			c.typ = b[i] >> 4
			switch {
			case c.typ == 0:
				return ErrReservedType
			case !c.connected && c.typ != 1:
				return ErrNotConnect
			}
			c.remaining, c.shift, c.hdrN = 0, 0, 0
			c.st = stLength
			i++
		case stLength:
			x := b[i]
			i++
			c.remaining |= int(x&0x7F) << c.shift
			c.shift += 7
			if x&0x80 != 0 {
				if c.shift >= 28 {
					return ErrMalformedLength
				}
				continue
			}
			if c.remaining+1+int(c.shift/7) > c.maxPacket {
				return fmt.Errorf("%w: %d bytes declared, limit %d", ErrPacketTooLarge, c.remaining, c.maxPacket)
			}
			if c.remaining == 0 {
				c.endPacket()
			} else {
				c.st = stBody
			}
		case stBody:
			take := min(c.remaining, len(b)-i)
			if !c.connected && c.typ == 1 && int(c.hdrN) < len(c.hdr) {
				c.hdrN += uint8(copy(c.hdr[c.hdrN:], b[i:i+take]))
			}
			i += take
			c.remaining -= take
			if c.remaining == 0 {
				c.endPacket()
			}
		}
	}
	return nil
}

func (c *conn) endPacket() {
	if !c.connected && c.typ == 1 {
		c.connected = true
		c.version.Store(uint32(connectLevel(c.hdr[:c.hdrN])))
	}
	c.st = stHeader
}

// connectLevel returns the protocol level of a CONNECT variable header
// ("MQTT" → 4 or 5, "MQIsdp" → 3), or 0 if it cannot tell.
func connectLevel(h []byte) byte {
	if len(h) < 2 {
		return 0
	}
	at := 2 + (int(h[0])<<8 | int(h[1]))
	if at >= len(h) {
		return 0
	}
	return h[at]
}

// Write writes with the write timeout. The first packet mochi writes is
// the CONNACK; for MQTT 3 its return code is mapped into the 3.1.1 range
// (mochi's own mapping turns 0x86 into 5, "not authorized", where 3.1.1
// says 4, "bad user name or password"; 5 comes from nothing else).
func (c *conn) Write(p []byte) (int, error) {
	if !c.wroteFirst.Load() && c.wroteFirst.CompareAndSwap(false, true) {
		if v := c.version.Load(); v > 0 && v < 5 && len(p) >= 4 && p[0] == 0x20 && p[1] == 2 && p[3] >= 5 {
			q := append([]byte(nil), p...)
			q[3] = v3ConnackCode(p[3])
			if _, err := c.write(q); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return c.write(p)
}

func (c *conn) write(p []byte) (int, error) {
	if c.stopping.Load() {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(shutdownWriteTimeout))
	} else if c.writeTimeout > 0 {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	return c.Conn.Write(p)
}

// v3ConnackCode maps an MQTT 5 CONNACK reason code onto the 3.1.1 return
// codes 1–5 [MQTT-3.2.2-4].
func v3ConnackCode(code byte) byte {
	switch code {
	case 0x84: // unsupported protocol version
		return 1
	case 0x85: // client identifier not valid
		return 2
	case 0x86, 5: // bad user name or password (mochi writes 5 for 0x86 to MQTT 3 clients; 3.1.1 says 4)
		return 4
	case 0x87, 0x8A, 0x8C: // not authorized, banned, bad authentication method
		return 5
	}
	return 3 // server unavailable: everything else is the server's refusal
}

// ConnectionState reports the TLS state of a TLS connection (ok false for
// plain TCP and WebSocket), for hooks that authenticate by certificate.
func (c *conn) ConnectionState() (tls.ConnectionState, bool) {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		return tc.ConnectionState(), true
	}
	return tls.ConnectionState{}, false
}

// SetDeadline is called by mochi with the keepalive deadline; it applies
// to reads only (writes have WriteTimeout).
func (c *conn) SetDeadline(t time.Time) error { return c.Conn.SetReadDeadline(t) }
