package mqttbench

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The lean client's WebSocket (RFC 6455): the opening handshake, binary
// frames out (masked, as a client must [RFC 6455 §5.3]), frames in
// unwrapped on Read. A wsConn keeps the bytes left of the frame being
// read and nothing else: no goroutine, no buffer.

// wsGUID is appended to the key to make Sec-WebSocket-Accept (§1.3).
const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// wsMaxResponseBytes bounds the server's handshake response.
const wsMaxResponseBytes = 4096

// Errors of the WebSocket layer.
var (
	// errWSHandshake is returned when the server does not upgrade the
	// connection (status other than 101, wrong Sec-WebSocket-Accept).
	errWSHandshake = errors.New("websocket handshake refused")
	// errWSFrame is returned when the server sends a frame a client
	// must not get (masked) or that is too large to be MQTT.
	errWSFrame = errors.New("websocket frame malformed")
)

// wsHandshake upgrades conn with GET path, offering the "mqtt"
// subprotocol [MQTT-6.0.0-3], within timeout.
func wsHandshake(ctx context.Context, conn net.Conn, host, path string, timeout time.Duration) (*wsConn, error) {
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	req := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: " + key + "\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return nil, fmt.Errorf("write websocket upgrade: %w", err)
	}
	// Read up to the blank line, a byte at a time: the server sends
	// nothing more before CONNECT, and nothing of it may be lost.
	resp := make([]byte, 0, 256)
	var b [1]byte
	for !bytes.HasSuffix(resp, []byte("\r\n\r\n")) {
		if len(resp) >= wsMaxResponseBytes {
			return nil, fmt.Errorf("%w: response longer than %d bytes", errWSHandshake, wsMaxResponseBytes)
		}
		if _, err := io.ReadFull(conn, b[:]); err != nil {
			return nil, fmt.Errorf("read websocket upgrade: %w", err)
		}
		resp = append(resp, b[0])
	}
	status, rest, _ := bytes.Cut(resp, []byte("\r\n"))
	if f := bytes.Fields(status); len(f) < 2 || string(f[1]) != "101" {
		return nil, fmt.Errorf("%w: %q", errWSHandshake, status)
	}
	sum := sha1.Sum([]byte(key + wsGUID))
	accept := base64.StdEncoding.EncodeToString(sum[:])
	ok := false
	for _, line := range bytes.Split(rest, []byte("\r\n")) {
		name, value, found := bytes.Cut(line, []byte(":"))
		if found && bytes.EqualFold(bytes.TrimSpace(name), []byte("Sec-WebSocket-Accept")) {
			ok = string(bytes.TrimSpace(value)) == accept
		}
	}
	if !ok {
		return nil, fmt.Errorf("%w: no or wrong Sec-WebSocket-Accept", errWSHandshake)
	}
	if !stop() {
		return nil, ctx.Err()
	}
	return &wsConn{Conn: conn}, conn.SetDeadline(time.Time{})
}

// wsConn is MQTT over a WebSocket: Write sends one binary frame, Read
// returns the payloads of data frames (skipping ping, pong; a close
// frame is the end of the stream). Deadlines are the TCP connection's.
type wsConn struct {
	net.Conn
	left int64 // payload bytes of the current data frame not yet read
}

// NetConn is the TCP connection under the WebSocket.
func (c *wsConn) NetConn() net.Conn { return c.Conn }

// Write sends p as one masked binary frame (FIN, opcode 2):
//
//	width  field
//	1      0x82: FIN, opcode binary
//	1      0x80 | length (< 126), or 0x80|126 + 2 bytes, or 0x80|127 + 8
//	4      masking key
//	n      payload XOR the key
func (c *wsConn) Write(p []byte) (int, error) {
	b := make([]byte, 0, 14+len(p))
	b = append(b, 0x82)
	switch n := len(p); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n <= 0xFFFF:
		b = append(b, 0x80|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	b = append(b, mask[:]...)
	for i, x := range p {
		b = append(b, x^mask[i%4])
	}
	if _, err := c.Conn.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Read reads payload bytes of the server's data frames.
func (c *wsConn) Read(p []byte) (int, error) {
	for c.left == 0 {
		var h [2]byte
		if _, err := io.ReadFull(c.Conn, h[:]); err != nil {
			return 0, err
		}
		if h[1]&0x80 != 0 {
			return 0, fmt.Errorf("%w: masked frame from the server", errWSFrame)
		}
		n := int64(h[1] & 0x7F)
		switch n {
		case 126:
			var e [2]byte
			if _, err := io.ReadFull(c.Conn, e[:]); err != nil {
				return 0, err
			}
			n = int64(binary.BigEndian.Uint16(e[:]))
		case 127:
			var e [8]byte
			if _, err := io.ReadFull(c.Conn, e[:]); err != nil {
				return 0, err
			}
			v := binary.BigEndian.Uint64(e[:])
			if v > 256<<20 {
				return 0, fmt.Errorf("%w: %d-byte frame", errWSFrame, v)
			}
			n = int64(v)
		}
		switch op := h[0] & 0x0F; op {
		case 0x0, 0x1, 0x2: // continuation, text, binary: MQTT bytes
			c.left = n
		case 0x8: // close
			return 0, io.EOF
		default: // ping, pong: skip (an idle client owes no pong to stay)
			if _, err := io.CopyN(io.Discard, c.Conn, n); err != nil {
				return 0, err
			}
		}
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.Conn.Read(p)
	c.left -= int64(n)
	return n, err
}
