package engine

import (
	"testing"
	"unsafe"
)

// TestConnFitsItsSizeClass holds the per-device structs inside the Go
// allocator's size classes they were laid out for: a field added to conn
// past 512 bytes costs every idle connection 128 more (the next class is
// 640), one added to session past 256 costs 32. Move rare state behind a
// pointer (killReq) or reorder before growing these.
func TestConnFitsItsSizeClass(t *testing.T) {
	for _, c := range []struct {
		name      string
		size, max uintptr
	}{
		{"conn", unsafe.Sizeof(conn{}), 512},
		{"session", unsafe.Sizeof(session{}), 256},
		{"Client", unsafe.Sizeof(Client{}), 112},
	} {
		if c.size > c.max {
			t.Errorf("%s is %d bytes, over its %d-byte size class", c.name, c.size, c.max)
		}
	}
}
