package engine

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"testing"
)

// The two decoders of what precedes or wraps MQTT on a socket — the PROXY
// header and WebSocket framing — fuzzed on their own (FuzzEngine drives
// MQTT through a real socket). Seeds: testdata/fuzz/FuzzProxyHeader and
// FuzzWebSocket, and the f.Add calls below.
//
//	go test -run '^$' -fuzz FuzzProxyHeader -fuzztime 60s ./gateway/engine/
//	go test -run '^$' -fuzz FuzzWebSocket -fuzztime 60s ./gateway/engine/

// FuzzProxyHeader: parseProxy never panics, never claims more bytes than
// it was given, names a valid host:port or nothing, and a header it
// accepts is "incomplete" (not an error) at every shorter prefix — the
// engine may receive it a byte at a time.
func FuzzProxyHeader(f *testing.F) {
	f.Add([]byte("PROXY TCP4 192.0.2.1 198.51.100.2 56324 1883\r\n\x10"))
	f.Add([]byte("PROXY TCP6 2001:db8::1 2001:db8::2 4000 1883\r\n"))
	f.Add([]byte("PROXY UNKNOWN\r\n"))
	f.Add([]byte("PROXY TCP4 192.0.2.1 198.51.100.2 056324 1883\r\n"))
	f.Add(proxyV2(0x21, 0x11, []byte{192, 0, 2, 1, 198, 51, 100, 2, 0xDB, 0xC4, 0x07, 0x5B}))
	f.Add(proxyV2(0x20, 0x00, nil))
	f.Add(proxyV2(0x21, 0x21, make([]byte, 36)))
	f.Add(proxyV2(0x21, 0x11, []byte{1, 2, 3}))
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, src, err := parseProxy(b)
		if err != nil {
			if !errors.Is(err, errProxy) {
				t.Fatalf("error %v is not errProxy", err)
			}
			return
		}
		if n < 0 || n > len(b) {
			t.Fatalf("claims %d of %d bytes", n, len(b))
		}
		if src != "" {
			if _, _, err := net.SplitHostPort(src); err != nil {
				t.Fatalf("source %q: %v", src, err)
			}
		}
		if n == 0 {
			return
		}
		for k := range n {
			if m, s, err := parseProxy(b[:k]); m != 0 || s != "" || err != nil {
				t.Fatalf("prefix of %d bytes of a %d-byte header: %d %q %v", k, n, m, s, err)
			}
		}
	})
}

func proxyV2(verCmd, fam byte, addr []byte) []byte {
	b := append([]byte{}, proxyV2Sig...)
	b = append(b, verCmd, fam)
	b = binary.BigEndian.AppendUint16(b, uint16(len(addr)))
	return append(b, addr...)
}

// recorder is a transport under test: decode passes bytes through, writes
// are kept.
type recorder struct{ written [][]byte }

func (r *recorder) decode(raw []byte) ([]byte, error) { return raw, nil }
func (r *recorder) write(b []byte) error {
	r.written = append(r.written, append([]byte(nil), b...))
	return nil
}
func (r *recorder) closeWrite()                    {}
func (r *recorder) close()                         {}
func (r *recorder) tlsState() *tls.ConnectionState { return nil }

const wsUpgrade = "GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
	"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"

// maskedFrame is a client frame (masked, as RFC 6455 requires).
func maskedFrame(op byte, payload []byte) []byte {
	b := []byte{0x80 | op}
	switch n := len(payload); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n < 1<<16:
		b = append(b, 0x80|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	key := []byte{1, 2, 3, 4}
	b = append(b, key...)
	for i, c := range payload {
		b = append(b, c^key[i%4])
	}
	return b
}

// FuzzWebSocket: the WebSocket transport never panics on any bytes, split
// at any point into two reads, never returns more MQTT bytes than it was
// given, and — for an upgrade followed by binary frames — returns exactly
// the frames' payloads, however the bytes were split.
func FuzzWebSocket(f *testing.F) {
	valid := append([]byte(wsUpgrade), maskedFrame(wsOpBinary, []byte{0x10, 0x0C, 0, 4, 'M', 'Q', 'T', 'T', 4, 2, 0, 60, 0, 0})...)
	valid = append(valid, maskedFrame(wsOpPing, []byte("hi"))...)
	valid = append(valid, maskedFrame(wsOpBinary, bytes.Repeat([]byte{0xC0, 0}, 100))...)
	f.Add(valid, uint16(10))
	f.Add(valid, uint16(len(wsUpgrade)+3))
	f.Add(append([]byte(wsUpgrade), maskedFrame(wsOpText, []byte("x"))...), uint16(0))
	f.Add(append([]byte(wsUpgrade), 0x82, 0x05, 'h', 'e', 'l', 'l', 'o'), uint16(0)) // unmasked
	f.Add(append([]byte(wsUpgrade), maskedFrame(wsOpClose, []byte{3, 0xE8})...), uint16(1))
	f.Add([]byte("GET /other HTTP/1.1\r\n\r\n"), uint16(5))
	f.Fuzz(func(t *testing.T, b []byte, split uint16) {
		k := int(split) % (len(b) + 1)
		ws := newWSTransport(&recorder{}, "/mqtt", 1<<20)
		var out []byte
		for _, part := range [][]byte{b[:k], b[k:]} {
			got, err := ws.decode(append([]byte(nil), part...)) // decode may reuse its input's buffer
			out = append(out, got...)
			if err != nil {
				break
			}
		}
		if len(out) > len(b) {
			t.Fatalf("%d MQTT bytes out of %d", len(out), len(b))
		}
		want, ok := binaryPayloads(b)
		if ok && !bytes.Equal(out, want) {
			t.Fatalf("split at %d: got %q, want %q", k, out, want)
		}
	})
}

// binaryPayloads: the payloads of b's frames if b is wsUpgrade followed by
// whole masked binary or ping frames only.
func binaryPayloads(b []byte) ([]byte, bool) {
	if !bytes.HasPrefix(b, []byte(wsUpgrade)) {
		return nil, false
	}
	b = b[len(wsUpgrade):]
	var out []byte
	for len(b) > 0 {
		if len(b) < 2 || b[0]&0x70 != 0 || b[1]&0x80 == 0 {
			return nil, false
		}
		op := b[0] & 0x0F
		if b[0]&0x80 == 0 || (op != wsOpBinary && op != wsOpPing) {
			return nil, false
		}
		n, h := int(b[1]&0x7F), 2
		switch n {
		case 126:
			if len(b) < 4 {
				return nil, false
			}
			n, h = int(binary.BigEndian.Uint16(b[2:4])), 4
		case 127:
			return nil, false
		}
		if op == wsOpPing && n > 125 {
			return nil, false
		}
		if len(b) < h+4+n {
			return nil, false
		}
		key := b[h : h+4]
		for i := range n {
			if op == wsOpBinary {
				out = append(out, b[h+4+i]^key[i%4])
			}
		}
		b = b[h+4+n:]
	}
	return out, true
}

// TestWebSocketSeedIsChecked: the fuzz target's model of a valid stream
// recognises its seed (else the target would compare nothing).
func TestWebSocketSeedIsChecked(t *testing.T) {
	b := append([]byte(wsUpgrade), maskedFrame(wsOpBinary, []byte("abc"))...)
	b = append(b, maskedFrame(wsOpPing, []byte("p"))...)
	b = append(b, maskedFrame(wsOpBinary, bytes.Repeat([]byte("d"), 300))...)
	want, ok := binaryPayloads(b)
	if !ok || string(want) != "abc"+string(bytes.Repeat([]byte("d"), 300)) {
		t.Fatalf("model: %v %q", ok, want)
	}
	tr := &recorder{}
	ws := newWSTransport(tr, "/mqtt", 1<<20)
	got, err := ws.decode(append([]byte(nil), b...))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("decode: %v %q", err, got)
	}
	if len(tr.written) != 2 || !bytes.HasPrefix(tr.written[0], []byte("HTTP/1.1 101")) {
		t.Fatalf("written: %q", tr.written)
	}
}
