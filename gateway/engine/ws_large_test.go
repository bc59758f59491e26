package engine

import (
	"bytes"
	"testing"
)

// wsLargeFrame is an upgrade then one masked binary frame of n bytes, as
// reads of 32 KiB (the engine's read buffer).
func wsLargeFrame(n int) (payload []byte, reads [][]byte) {
	payload = bytes.Repeat([]byte("0123456789abcdef"), n/16)
	b := append([]byte(wsUpgrade), maskedFrame(wsOpBinary, payload)...)
	for len(b) > 0 {
		k := min(len(b), 32<<10)
		reads = append(reads, b[:k])
		b = b[k:]
	}
	return payload, reads
}

// TestWebSocketLargeFrameInSmallReads: a 4 MiB frame arriving 32 KiB at a
// time comes out whole, once, and nothing is left pending after it.
func TestWebSocketLargeFrameInSmallReads(t *testing.T) {
	payload, reads := wsLargeFrame(4 << 20)
	ws := newWSTransport(&recorder{}, "/mqtt", 4<<20+256<<10)
	var out []byte
	for _, r := range reads {
		got, err := ws.decode(append([]byte(nil), r...))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got...)
	}
	if !bytes.Equal(out, payload) {
		t.Fatalf("got %d bytes, want the %d-byte payload", len(out), len(payload))
	}
	if ws.pending != nil {
		t.Fatalf("%d bytes pending after a whole frame", len(ws.pending))
	}
}

// BenchmarkWebSocketLargeFrame decodes a 4 MiB frame that arrives in
// 32 KiB reads.
//
//	go test -run '^$' -bench WebSocketLargeFrame ./gateway/engine/
func BenchmarkWebSocketLargeFrame(b *testing.B) {
	payload, reads := wsLargeFrame(4 << 20)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		ws := newWSTransport(&recorder{}, "/mqtt", 4<<20+256<<10)
		for _, r := range reads {
			if _, err := ws.decode(r); err != nil {
				b.Fatal(err)
			}
		}
	}
}
