package gateway

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// scanWrite reads the packets of each write: a CONNACK with code 0
// establishes the connection; DISCONNECT, or a CONNACK with any other code,
// ends it [MQTT-3.14.4-1] [MQTT-3.2.2-5] [MQTT-3.2.2-7].
func TestNoteWrites(t *testing.T) {
	publish := []byte{0x30, 5, 0, 1, 'a', 'x', 'y'}
	bigPublish := append([]byte{0x30, 0x80, 0x01}, make([]byte, 128)...) // remaining length 128: two bytes
	v5Connack := append([]byte{0x20, 0x84, 0x01, 0x00, 0x00, 0x80, 0x01}, make([]byte, 128)...)
	cases := []struct {
		name               string
		writes             [][]byte
		established, final bool
	}{
		{"connack accepts", [][]byte{{0x20, 2, 0, 0}}, true, false},
		{"v3 connack refuses", [][]byte{{0x20, 2, 0, 5}}, false, true},
		{"v5 connack refuses", [][]byte{{0x20, 3, 0, 0x87, 0}}, false, true},
		{"v5 connack with long properties", [][]byte{v5Connack}, true, false},
		{"publishes only", [][]byte{{0x20, 2, 0, 0}, publish, append(bigPublish, publish...)}, true, false},
		{"disconnect alone", [][]byte{{0x20, 2, 0, 0}, {0xE0, 2, 0x93, 0}}, true, true},
		{"disconnect after publishes in one write", [][]byte{{0x20, 2, 0, 0}, bytes.Join([][]byte{publish, bigPublish, {0xE0, 1, 0x8B}}, nil)}, true, true},
		{"v3 disconnect", [][]byte{{0xE0, 0}}, false, true},
		{"truncated length", [][]byte{{0x30, 0x80}}, false, false},
		{"length past 4 bytes", [][]byte{{0xE0, 0x80, 0x80, 0x80, 0x80, 0x01}}, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &conn{}
			for _, w := range tc.writes {
				c.note(scanWrite(w))
			}
			require.Equal(t, tc.established, c.established.Load(), "established")
			require.Equal(t, tc.final, c.final.Load(), "final")
		})
	}
}

// FuzzNoteWrites: scanWrite never panics, whatever a write holds, and a
// DISCONNECT it finds is inside the write.
func FuzzNoteWrites(f *testing.F) {
	f.Add([]byte{0x20, 2, 0, 0})
	f.Add([]byte{0x30, 5, 0, 1, 'a', 'x', 'y', 0xE0, 0})
	f.Add([]byte{0x20, 0xFF, 0xFF, 0xFF, 0x7F})
	f.Fuzz(func(t *testing.T, b []byte) {
		if at := scanWrite(b).disconnectAt; at >= len(b) {
			t.Fatalf("DISCONNECT at %d of %d bytes", at, len(b))
		}
	})
}

func TestRemainingLength(t *testing.T) {
	for _, tc := range []struct {
		in      []byte
		n, size int
		ok      bool
	}{
		{[]byte{0}, 0, 1, true},
		{[]byte{0x7F}, 127, 1, true},
		{[]byte{0x80, 0x01}, 128, 2, true},
		{[]byte{0xFF, 0xFF, 0xFF, 0x7F}, 268435455, 4, true},
		{[]byte{0xFF, 0xFF, 0xFF, 0xFF, 0x7F}, 0, 0, false},
		{[]byte{0x80}, 0, 0, false},
		{nil, 0, 0, false},
	} {
		n, size, ok := remainingLength(tc.in)
		require.Equal(t, []any{tc.n, tc.size, tc.ok}, []any{n, size, ok}, "%x", tc.in)
	}
}
