package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// conn wraps every client socket before mochi sees it. Its Read follows the
// MQTT framing of the byte stream — without buffering or copying — so that:
//
//   - the first packet must be CONNECT [MQTT-3.1.0-1], and must arrive
//     within the connect timeout (mochi sets no deadline before CONNECT);
//   - no packet may declare more than MaxPacketBytes, refused from the
//     fixed header before mochi allocates the body [MQTT-3.2.2-15];
//   - a remaining length longer than 4 bytes is refused (MQTT 5 §1.5.5,
//     3.1.1 §2.2.3: "the maximum number of bytes … is four");
//   - packet type 0, reserved in both versions, is refused;
//   - the CONNECT protocol level is known, so an MQTT 3 client never gets
//     an MQTT 5 CONNACK code (mochi passes some through).
//
// A connection that breaks one of these is closed [MQTT-4.8.0-1]
// [MQTT-4.13.1-1]; an MQTT 5 client past its CONNACK is first told why with
// a DISCONNECT (0x95 Packet too large, else 0x81 Malformed Packet).
//
// Writes get their own deadline (WriteTimeout) instead of sharing the
// keepalive read deadline mochi sets, so a client that stops reading is
// dropped without holding up the writer. Write also notes the packets that
// end a connection — DISCONNECT, or a CONNACK that refuses — and writes
// nothing after them [MQTT-3.14.4-1]; Close then closes lingeringly (see
// Close and linger).
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

	version     atomic.Uint32 // protocol level from CONNECT: 3, 4 or 5
	wroteFirst  atomic.Bool
	stopping    atomic.Bool // the gateway shuts down: writes get shutdownWriteTimeout
	established atomic.Bool // a CONNACK accepting the connection was written
	closing     atomic.Bool // Close was called: reads and writes fail
	lingering   atomic.Bool // Close shut the write side only; linger finishes

	// wmu serialises Write, so that no packet follows the one that ends the
	// connection.
	wmu   sync.Mutex
	final atomic.Bool // written under wmu: a DISCONNECT or refusing CONNACK went out
}

// shutdownWriteTimeout bounds each write once shutdown began, so a client
// that stopped reading cannot hold up the DISCONNECT to everyone.
const shutdownWriteTimeout = time.Second

// Lingering close. After the gateway sent the packet that ends a connection
// (a DISCONNECT, or a CONNACK refusing it), closing the socket at once would
// make the kernel answer the client's next bytes — or bytes already
// received and not read — with a TCP reset, and a client that is still
// writing (answering PUBRECs with PUBRELs, say) gets the reset before it
// reads the DISCONNECT. So the gateway shuts its write side (after TLS
// close_notify or a websocket close frame), reads and discards what the
// client still sends until it closes too, and then closes — within these
// bounds.
const (
	lingerTimeout      = 2 * time.Second
	lingerMaxBytes     = 1 << 20
	lingerWriteTimeout = time.Second // bounds the close_notify or close frame
)

const (
	stHeader = iota
	stLength
	stBody
)

// Framing errors. A connection that hits one is closed.
var (
	// ErrNotConnect is returned when the first packet is not CONNECT [MQTT-3.1.0-1].
	ErrNotConnect = errors.New("gateway: first packet is not CONNECT")
	// ErrPacketTooLarge is returned for a packet over MaxPacketBytes [MQTT-3.2.2-15].
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
	if c.closing.Load() {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		if ferr := c.track(p[:n]); ferr != nil {
			c.refuse(ferr)
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
			case c.typ == 0: // reserved (MQTT 5 §2.1.2, 3.1.1 §2.2.1)
				return ErrReservedType
			case !c.connected && c.typ != 1:
				return ErrNotConnect // [MQTT-3.1.0-1]
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
				if c.shift >= 28 { // a fifth length byte would follow
					return ErrMalformedLength
				}
				continue
			}
			if c.remaining+1+int(c.shift/7) > c.maxPacket { // [MQTT-3.2.2-15]
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

// refuse tells an MQTT 5 client which framing rule it broke before the
// connection closes: DISCONNECT 0x95 (Packet too large, MQTT 5
// §3.2.2.3.6) or 0x81 (Malformed Packet), as MQTT 5 §4.13.1 asks. Only
// after a CONNACK that accepted the connection: a DISCONNECT may not come
// earlier [MQTT-3.14.0-1], and a CONNECT that breaks a rule is refused by
// closing. MQTT 3 has no server DISCONNECT; its clients see the close.
func (c *conn) refuse(err error) {
	if c.version.Load() != 5 || !c.established.Load() {
		return
	}
	code := packets.ErrMalformedPacket.Code
	if errors.Is(err, ErrPacketTooLarge) {
		code = packets.ErrPacketTooLarge.Code
	}
	// Fixed header, remaining length 2, reason code, no properties.
	_, _ = c.Write([]byte{packets.Disconnect << 4, 2, code, 0})
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
// says 4, "bad user name or password"; 5 comes from nothing else). Once a
// packet that ends the connection was written, Write writes nothing more
// [MQTT-3.14.4-1] and returns net.ErrClosed.
func (c *conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.final.Load() || c.closing.Load() {
		return 0, net.ErrClosed
	}
	out := p
	if !c.wroteFirst.Load() && c.wroteFirst.CompareAndSwap(false, true) {
		if v := c.version.Load(); v > 0 && v < 5 && len(p) >= 4 && p[0] == 0x20 && p[1] == 2 && p[3] >= 5 {
			out = append([]byte(nil), p...)
			out[3] = v3ConnackCode(p[3])
		}
	}
	w := scanWrite(out)
	if v := c.version.Load(); v > 0 && v < 5 && w.disconnectAt >= 0 {
		// MQTT 3.1.1 has no server DISCONNECT (§3.14: "the final Control
		// Packet sent from the Client to the Server"); mochi sends one on a
		// session takeover and at shutdown. An MQTT 3 client sees the close.
		if w.disconnectAt > 0 {
			if n, err := c.write(out[:w.disconnectAt]); err != nil {
				return n, err
			}
		}
		c.final.Store(true)
		return len(p), nil
	}
	n, err := c.write(out)
	if err != nil {
		return n, err
	}
	c.note(w)
	return len(p), nil
}

// note records what a written write held. c.wmu must be held.
func (c *conn) note(w writeScan) {
	if w.established {
		c.established.Store(true)
	}
	if w.final {
		c.final.Store(true)
	}
}

// writeScan is what one write holds, by scanWrite.
type writeScan struct {
	established  bool // a CONNACK accepting the connection
	final        bool // a packet after which the connection ends
	disconnectAt int  // offset of the first DISCONNECT, or -1
}

// scanWrite walks the packets of one write — mochi and the bridge write
// whole packets — up to the first that ends the connection: DISCONNECT,
// or a CONNACK with a non-zero code, after which the server closes
// [MQTT-3.2.2-5] (3.1.1) [MQTT-3.2.2-7] (5). It stops at a length it
// cannot read.
func scanWrite(p []byte) writeScan {
	w := writeScan{disconnectAt: -1}
	for off := 0; off+1 < len(p); {
		rem, lenBytes, ok := remainingLength(p[off+1:])
		if !ok {
			return w
		}
		body := p[off+1+lenBytes:]
		if len(body) > rem {
			body = body[:rem]
		}
		switch p[off] >> 4 {
		case packets.Connack:
			if len(body) >= 2 {
				if body[1] != 0 {
					w.final = true
					return w
				}
				w.established = true
			}
		case packets.Disconnect:
			w.final, w.disconnectAt = true, off
			return w
		}
		off += 1 + lenBytes + rem
	}
	return w
}

func (c *conn) write(p []byte) (int, error) {
	if c.stopping.Load() {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(shutdownWriteTimeout))
	} else if c.writeTimeout > 0 {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	return c.Conn.Write(p)
}

// remainingLength decodes the Variable Byte Integer at the start of b: the
// value and the bytes it took, ok false if b ends first or it runs past
// four bytes.
func remainingLength(b []byte) (n, size int, ok bool) {
	for i := 0; i < len(b) && i < 4; i++ {
		n |= int(b[i]&0x7F) << (7 * i)
		if b[i]&0x80 == 0 {
			return n, i + 1, true
		}
	}
	return 0, 0, false
}

// v3ConnackCode maps an MQTT 5 CONNACK reason code onto the return codes
// 3.1.1 defines, 1–5 for a refusal (3.1.1 §3.2.2.3, Table 3.1: 6–255 are
// reserved).
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

// Close closes the connection, at once unless a packet that ends the
// connection was written. Then it only shuts the write side — TLS
// close_notify, websocket close frame, TCP FIN, whichever layers there are
// — and wakes the reader with an expired read deadline; the connection's
// goroutine then drains what the client still sends (linger) and closes the
// socket. The client so reads the DISCONNECT, not a reset; the connection
// is still closed as MQTT requires [MQTT-3.14.4-2] [MQTT-4.13.2-1], within
// lingerTimeout.
func (c *conn) Close() error {
	if !c.closing.CompareAndSwap(false, true) {
		return nil
	}
	if !c.final.Load() {
		return c.Conn.Close()
	}
	c.lingering.Store(true)
	shutWrite(c.Conn)
	return c.Conn.SetReadDeadline(time.Now()) // mochi's reader returns; no other read follows
}

// closeNow closes the connection without lingering.
func (c *conn) closeNow() error {
	c.closing.Store(true)
	return c.Conn.Close()
}

// linger finishes a lingering close on the connection's own goroutine,
// after mochi is done with the connection (so no one else reads): it
// discards what the client sends until the client closes, lingerTimeout
// passes or lingerMaxBytes were read, then closes the socket. Closing the
// listener closes the socket under it, which ends the wait at once; the
// listener waits for this goroutine like for any connection's.
func (c *conn) linger() {
	if !c.lingering.Load() {
		return
	}
	raw := netConn(c.Conn)
	defer raw.Close()
	if err := raw.SetReadDeadline(time.Now().Add(lingerTimeout)); err != nil {
		return
	}
	var buf [512]byte
	for n := 0; n < lingerMaxBytes; {
		k, err := raw.Read(buf[:])
		n += k
		if err != nil {
			return
		}
	}
}

// shutWrite shuts the write side of every layer of c, from the top: a
// websocket sends its close frame, TLS its close_notify, TCP its FIN. The
// read side stays open. A write blocked on a client that stopped reading is
// cut after lingerWriteTimeout.
func shutWrite(c net.Conn) {
	_ = netConn(c).SetWriteDeadline(time.Now().Add(lingerWriteTimeout))
	for {
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return
		}
		c = u.NetConn()
	}
}

// netConn returns the network connection under c's layers (TLS, websocket).
func netConn(c net.Conn) net.Conn {
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return c
		}
		c = u.NetConn()
	}
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
// to reads only (writes have WriteTimeout). After Close it does nothing, so
// it cannot undo the expired deadline that wakes the reader.
func (c *conn) SetDeadline(t time.Time) error {
	if c.closing.Load() {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}
