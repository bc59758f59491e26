package mqttbench

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// The lean client: just enough MQTT 3.1.1 to open a connection (over
// TCP, TLS or WebSocket, with a username and password if asked),
// subscribe once, keep it alive and close it, for tens of thousands of
// connections in one process. A connection is a bare net.Conn (or a
// tls.Conn, or a wsConn around one): no goroutine, no buffer of ours.

// Fixed headers of the packets the lean client sends without a body.
var (
	pingreq    = []byte{0xC0, 0x00} // PINGREQ, MQTT 3.1.1 §3.12
	disconnect = []byte{0xE0, 0x00} // DISCONNECT, §3.14
)

// appendConnect appends an MQTT 3.1.1 CONNECT packet (§3.1) to b:
//
//	width  field
//	1      0x10: packet type CONNECT, flags 0 [MQTT-2.2.2-1]
//	1–4    remaining length, variable byte integer (§2.2.3)
//	6      0x00 0x04 "MQTT": protocol name [MQTT-3.1.2-1]
//	1      0x04: protocol level 3.1.1 [MQTT-3.1.2-2]
//	1      connect flags: 0x80 user name, 0x40 password, 0x02 clean
//	       session; no will
//	2      keep alive, seconds
//	2+n    client identifier: length, UTF-8 [MQTT-3.1.3-3]
//	2+n    user name, if flagged [MQTT-3.1.3-11]
//	2+n    password, if flagged (binary) [MQTT-3.1.3-12]
//
// clientID, username and password must be at most 65,535 bytes each; a
// password goes only with a username [MQTT-3.1.2-22].
func appendConnect(b []byte, clientID string, keepAlive uint16, clean bool, username, password string) []byte {
	var flags byte
	if clean {
		flags |= 0x02
	}
	n := 10 + 2 + len(clientID)
	if username != "" {
		flags |= 0x80
		n += 2 + len(username)
	}
	if password != "" {
		flags |= 0x40
		n += 2 + len(password)
	}
	b = append(b, 0x10)
	b = appendVarint(b, n)
	b = append(b, 0x00, 0x04, 'M', 'Q', 'T', 'T', 0x04, flags)
	b = binary.BigEndian.AppendUint16(b, keepAlive)
	b = appendString(b, clientID)
	if username != "" {
		b = appendString(b, username)
	}
	if password != "" {
		b = appendString(b, password)
	}
	return b
}

// appendString appends s with its 2-byte length (§1.5.3).
func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// appendVarint appends n as an MQTT variable byte integer: 7 bits a byte,
// least significant first, the top bit set on all but the last.
func appendVarint(b []byte, n int) []byte {
	for {
		c := byte(n % 128)
		n /= 128
		if n == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// connackCodes name the CONNACK return codes (§3.2.2.3).
var connackCodes = [...]string{
	0: "accepted",
	1: "unacceptable protocol version",
	2: "identifier rejected",
	3: "server unavailable",
	4: "bad user name or password",
	5: "not authorized",
}

// parseConnack checks a 4-byte CONNACK (§3.2): 0x20, remaining length 2,
// the acknowledge flags (only bit 0, session present, may be set) and
// return code 0.
func parseConnack(b [4]byte) error {
	if b[0] != 0x20 || b[1] != 0x02 || b[2]&^0x01 != 0 {
		return fmt.Errorf("%w: % x", ErrConnackMalformed, b)
	}
	if code := b[3]; code != 0 {
		name := "unknown"
		if int(code) < len(connackCodes) {
			name = connackCodes[code]
		}
		return fmt.Errorf("%w: return code %d (%s)", ErrConnackRefused, code, name)
	}
	return nil
}

// leanDialer opens lean connections.
type leanDialer struct {
	addr      string // host:port
	scheme    string // "tcp", "tls" or "ws"; "" is tcp
	wsPath    string // ws: the request path
	tls       *tls.Config
	prefix    string // of client identifiers
	keepAlive uint16
	clean     bool
	username  string
	password  string
	subscribe string // filter, %i the index; "": none
	subQoS    byte
	timeout   time.Duration
	source    netip.Addr // first source address; invalid: let the kernel pick
	perSource int
}

// sourceOf is the local address of connection i: the first source
// address plus i/perSource.
func (d *leanDialer) sourceOf(i int) netip.Addr {
	if !d.source.IsValid() {
		return netip.Addr{}
	}
	a := d.source.As4()
	n := binary.BigEndian.Uint32(a[:]) + uint32(i/d.perSource)
	binary.BigEndian.PutUint32(a[:], n)
	return netip.AddrFrom4(a)
}

// sources is the number of source addresses n connections use.
func (d *leanDialer) sources(n int) int {
	if !d.source.IsValid() {
		return 1
	}
	return (n + d.perSource - 1) / d.perSource
}

// connect opens connection i: dial, CONNECT, CONNACK, all within the
// timeout. It returns the time from writing CONNECT to reading CONNACK.
func (d *leanDialer) connect(ctx context.Context, i int) (net.Conn, time.Duration, error) {
	dl := net.Dialer{
		Timeout:   d.timeout,
		KeepAlive: -1, // MQTT keeps the connection alive, not TCP
	}
	if src := d.sourceOf(i); src.IsValid() {
		dl.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
		dl.Control = bindNoPort
	}
	conn, err := dl.DialContext(ctx, "tcp", d.addr)
	if err != nil {
		return nil, 0, err
	}
	if conn, err = d.upgrade(ctx, conn); err != nil {
		return nil, 0, err
	}
	lat, err := d.handshake(ctx, conn, fmt.Sprintf("%s%d", d.prefix, i))
	if err == nil && d.subscribe != "" {
		err = subscribeLean(conn, strings.ReplaceAll(d.subscribe, "%i", strconv.Itoa(i)), d.subQoS, d.timeout)
	}
	if err != nil {
		_ = conn.Close()
		return nil, 0, err
	}
	return conn, lat, nil
}

// upgrade runs the TLS or WebSocket handshake on a fresh TCP connection,
// within the timeout; on failure it closes conn.
func (d *leanDialer) upgrade(ctx context.Context, conn net.Conn) (net.Conn, error) {
	switch d.scheme {
	case "tls":
		cfg := d.tls
		if cfg == nil {
			cfg = &tls.Config{}
		}
		if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
			cfg = cfg.Clone()
			cfg.ServerName, _, _ = net.SplitHostPort(d.addr)
		}
		tc := tls.Client(conn, cfg)
		hctx, cancel := context.WithTimeout(ctx, d.timeout)
		defer cancel()
		if err := tc.HandshakeContext(hctx); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("tls handshake: %w", err)
		}
		return tc, nil
	case "ws":
		wc, err := wsHandshake(ctx, conn, d.addr, d.wsPath, d.timeout)
		if err != nil {
			_ = conn.Close()
			return nil, err
		}
		return wc, nil
	}
	return conn, nil
}

func (d *leanDialer) handshake(ctx context.Context, conn net.Conn, clientID string) (time.Duration, error) {
	if err := conn.SetDeadline(time.Now().Add(d.timeout)); err != nil {
		return 0, err
	}
	// Ending ctx ends a wait for CONNACK.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	var buf [128]byte
	begin := time.Now()
	if _, err := conn.Write(appendConnect(buf[:0], clientID, d.keepAlive, d.clean, d.username, d.password)); err != nil {
		return 0, fmt.Errorf("write CONNECT: %w", err)
	}
	var ack [4]byte
	if _, err := io.ReadFull(conn, ack[:]); err != nil {
		return 0, fmt.Errorf("read CONNACK: %w", err)
	}
	lat := time.Since(begin)
	if err := parseConnack(ack); err != nil {
		return 0, err
	}
	if !stop() {
		return 0, ctx.Err()
	}
	return lat, conn.SetDeadline(time.Time{})
}
