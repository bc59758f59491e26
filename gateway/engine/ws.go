package engine

import (
	"bytes"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
)

// MQTT over WebSocket (MQTT 3.1.1 §6, MQTT 5 §6) as a transport of the
// event loop: the server side of RFC 6455, decoded incrementally from what
// the socket delivers in the connection's turn, like TLS. The HTTP/1.1
// upgrade request is read (bounded), answered 101 with the "mqtt"
// subprotocol [MQTT-6.0.0-3], and from then on MQTT bytes are the
// concatenated payloads of binary frames: a frame may hold several MQTT
// packets or part of one [MQTT-6.0.0-2]. Text frames are refused
// [MQTT-6.0.0-1]. Client frames must be masked (RFC 6455 §5.1); control
// frames are answered (ping → pong, close → close). Each write is one
// binary frame.
//
// Why not a library: the maintained event-driven WebSocket for nbio
// (nbhttp) runs its own engine that owns its connections' reads and calls
// back per message, so it cannot share this engine's read model — one
// poller set for every listener, reads paused for backpressure, one turn
// decoding TLS and then WebSocket. gorilla/websocket needs a goroutine per
// connection. The protocol part needed here is small and is fuzzed
// (FuzzWebSocket).

// WebSocket limits.
const (
	wsMaxRequest  = 8 << 10 // the upgrade request
	wsMaxControl  = 125     // RFC 6455 §5.5
	wsOpBinary    = 0x2
	wsOpCont      = 0x0
	wsOpText      = 0x1
	wsOpClose     = 0x8
	wsOpPing      = 0x9
	wsOpPong      = 0xA
	wsGUID        = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
	wsCloseNormal = 1000
	wsCloseProto  = 1002
	wsCloseData   = 1003
	wsCloseBig    = 1009
)

// errWSClosed is the client's close frame: the end of the stream.
var errWSClosed = errors.New("websocket: closed by the client")

// wsTransport is WebSocket over TCP or TLS.
type wsTransport struct {
	inner    transport
	path     string
	maxFrame int
	open     atomic.Bool // the upgrade was answered (writes come from other goroutines too)
	closing  atomic.Bool // a close frame was sent
	pending  []byte      // an incomplete request or frame (nil when none)
	want     int         // the whole length of the incomplete frame frame last saw, when known
}

func newWSTransport(inner transport, path string, maxPacket int) *wsTransport {
	return &wsTransport{inner: inner, path: path, maxFrame: maxPacket + 16}
}

func (t *wsTransport) decode(raw []byte) ([]byte, error) {
	in, err := t.inner.decode(raw)
	if err != nil {
		return nil, err
	}
	b := in
	if t.pending != nil {
		t.pending = append(t.pending, in...)
		b = t.pending
	}
	if !t.open.Load() {
		end := bytes.Index(b, []byte("\r\n\r\n"))
		if end < 0 {
			if len(b) > wsMaxRequest {
				t.refuse(http.StatusRequestHeaderFieldsTooLarge)
				return nil, fmt.Errorf("websocket: upgrade request over %d bytes", wsMaxRequest)
			}
			t.keep(b)
			return nil, nil
		}
		if err := t.upgrade(b[:end+4]); err != nil {
			return nil, err
		}
		b = b[end+4:]
	}
	// Payloads are unmasked and moved down in place (w ≤ pos): the result
	// lives in b's buffer, which is ours until the turn ends.
	w, pos := 0, 0
	for pos < len(b) {
		n, payload, op, err := t.frame(b[pos:])
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break // incomplete
		}
		switch op {
		case wsOpBinary, wsOpCont:
			w += copy(b[w:], payload)
		case wsOpPing:
			_ = t.inner.write(wsFrame(wsOpPong, payload))
		case wsOpPong:
		case wsOpClose:
			if t.closing.CompareAndSwap(false, true) {
				_ = t.inner.write(wsFrame(wsOpClose, closePayload(wsCloseNormal)))
			}
			t.pending = nil
			return b[:w], errWSClosed
		}
		pos += n
	}
	rest := b[pos:]
	switch {
	case len(rest) == 0:
		t.pending = nil
	case pos == 0 && t.pending != nil && &b[0] == &t.pending[0] && cap(t.pending) >= t.want:
		// A frame still arriving, in the buffer it grows in: a copy per
		// read would cost a 4 MiB frame its size squared.
	default:
		// Room for the whole frame once its length is known (at most
		// maxFrame and its header), as conn.consume does for packets.
		t.pending = append(make([]byte, 0, max(len(rest), t.want)), rest...)
	}
	return b[:w], nil
}

// keep holds an incomplete request or frame for the next read.
func (t *wsTransport) keep(b []byte) {
	switch {
	case len(b) == 0:
		t.pending = nil
	case t.pending == nil || &b[0] != &t.pending[0]:
		t.pending = append(make([]byte, 0, len(b)), b...)
	}
}

// frame parses one frame at the start of b: its length (0 while
// incomplete, with t.want its whole length once the header says it), its
// unmasked payload and opcode.
func (t *wsTransport) frame(b []byte) (n int, payload []byte, op byte, err error) {
	t.want = 0
	if len(b) < 2 {
		return 0, nil, 0, nil
	}
	fin, rsv, op := b[0]&0x80 != 0, b[0]&0x70, b[0]&0x0F
	masked, l := b[1]&0x80 != 0, int(b[1]&0x7F)
	if rsv != 0 {
		return 0, nil, 0, t.fail(wsCloseProto, "reserved bits set (no extension was negotiated)")
	}
	if !masked {
		return 0, nil, 0, t.fail(wsCloseProto, "unmasked client frame")
	}
	switch op {
	case wsOpBinary, wsOpCont:
	case wsOpText:
		return 0, nil, 0, t.fail(wsCloseData, "text frame: MQTT travels in binary frames [MQTT-6.0.0-1]")
	case wsOpClose, wsOpPing, wsOpPong:
		if !fin || l > wsMaxControl {
			return 0, nil, 0, t.fail(wsCloseProto, "fragmented or long control frame")
		}
	default:
		return 0, nil, 0, t.fail(wsCloseProto, fmt.Sprintf("opcode %#x", op))
	}
	h := 2
	switch l {
	case 126:
		if len(b) < 4 {
			return 0, nil, 0, nil
		}
		l, h = int(binary.BigEndian.Uint16(b[2:])), 4
	case 127:
		if len(b) < 10 {
			return 0, nil, 0, nil
		}
		v := binary.BigEndian.Uint64(b[2:])
		if v > uint64(t.maxFrame) {
			return 0, nil, 0, t.fail(wsCloseBig, fmt.Sprintf("frame of %d bytes", v))
		}
		l, h = int(v), 10
	}
	if l > t.maxFrame {
		return 0, nil, 0, t.fail(wsCloseBig, fmt.Sprintf("frame of %d bytes", l))
	}
	if len(b) < h+4+l {
		t.want = h + 4 + l
		return 0, nil, 0, nil
	}
	mask := b[h : h+4]
	payload = b[h+4 : h+4+l]
	for i := range payload {
		payload[i] ^= mask[i&3]
	}
	return h + 4 + l, payload, op, nil
}

// fail sends a close frame with code and returns the error.
func (t *wsTransport) fail(code uint16, why string) error {
	if t.closing.CompareAndSwap(false, true) {
		_ = t.inner.write(wsFrame(wsOpClose, closePayload(code)))
	}
	return fmt.Errorf("websocket: %s", why)
}

// upgrade checks the HTTP request and answers 101 [MQTT-6.0.0-3].
func (t *wsTransport) upgrade(req []byte) error {
	lines := strings.Split(string(req[:len(req)-4]), "\r\n")
	method, rest, _ := strings.Cut(lines[0], " ")
	target, proto, _ := strings.Cut(rest, " ")
	if method != http.MethodGet || !strings.HasPrefix(proto, "HTTP/1.") {
		t.refuse(http.StatusBadRequest)
		return fmt.Errorf("websocket: request %q", lines[0])
	}
	if p, _, _ := strings.Cut(target, "?"); p != t.path {
		t.refuse(http.StatusNotFound)
		return fmt.Errorf("websocket: path %q, want %q", p, t.path)
	}
	h := http.Header{}
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			t.refuse(http.StatusBadRequest)
			return errors.New("websocket: malformed header line")
		}
		h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	key := h.Get("Sec-Websocket-Key")
	if !tokenIn(h.Values("Upgrade"), "websocket") || !tokenIn(h.Values("Connection"), "upgrade") ||
		h.Get("Sec-Websocket-Version") != "13" || len(key) != 24 {
		t.refuse(http.StatusBadRequest)
		return errors.New("websocket: not a version 13 upgrade request")
	}
	if dk, err := base64.StdEncoding.DecodeString(key); err != nil || len(dk) != 16 {
		t.refuse(http.StatusBadRequest)
		return errors.New("websocket: bad Sec-WebSocket-Key")
	}
	offered := h.Values("Sec-Websocket-Protocol")
	sub := ""
	switch {
	case tokenIn(offered, "mqtt"):
		sub = "mqtt"
	case tokenIn(offered, "mqttv3.1"):
		sub = "mqttv3.1"
	case len(offered) > 0:
		t.refuse(http.StatusBadRequest)
		return fmt.Errorf("websocket: subprotocols %q offered, no mqtt", offered)
	}
	sum := sha1.Sum([]byte(key + wsGUID))
	resp := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
		base64.StdEncoding.EncodeToString(sum[:]) + "\r\n"
	if sub != "" {
		resp += "Sec-WebSocket-Protocol: " + sub + "\r\n"
	}
	resp += "\r\n"
	t.open.Store(true)
	return t.inner.write([]byte(resp))
}

func (t *wsTransport) refuse(status int) {
	_ = t.inner.write([]byte(fmt.Sprintf("HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", status, http.StatusText(status))))
	t.closing.Store(true)
}

// tokenIn reports whether a comma-separated header holds token (any case).
func tokenIn(values []string, token string) bool {
	for _, v := range values {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

func (t *wsTransport) write(b []byte) error {
	if !t.open.Load() || t.closing.Load() {
		return nil
	}
	return t.inner.write(wsFrame(wsOpBinary, b))
}

func (t *wsTransport) closeWrite() {
	if t.open.Load() && t.closing.CompareAndSwap(false, true) {
		_ = t.inner.write(wsFrame(wsOpClose, closePayload(wsCloseNormal)))
	}
	t.inner.closeWrite()
}

func (t *wsTransport) close() { t.inner.close() }

func (t *wsTransport) tlsState() *tls.ConnectionState { return t.inner.tlsState() }

// wsFrame encodes an unmasked server frame.
func wsFrame(op byte, payload []byte) []byte {
	n := len(payload)
	var b []byte
	switch {
	case n < 126:
		b = make([]byte, 2, 2+n)
		b[1] = byte(n)
	case n <= 0xFFFF:
		b = make([]byte, 4, 4+n)
		b[1] = 126
		binary.BigEndian.PutUint16(b[2:], uint16(n))
	default:
		b = make([]byte, 10, 10+n)
		b[1] = 127
		binary.BigEndian.PutUint64(b[2:], uint64(n))
	}
	b[0] = 0x80 | op
	return append(b, payload...)
}

func closePayload(code uint16) []byte { return binary.BigEndian.AppendUint16(nil, code) }
