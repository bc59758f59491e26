package engine

// MQTT 5 properties (§2.2.2) checked before mochi's decoder sees them:
// mochi keeps the last of a repeated property and cannot tell an absent
// Receive Maximum or Maximum Packet Size from one of 0, and both are
// protocol errors.

// propWidth is the encoded width of each property's value: 1, 2 or 4
// bytes, varint (-1), a string or binary data (-2), a string pair (-3).
var propWidth = [0x2B]int8{
	0x01: 1, 0x02: 4, 0x03: -2, 0x08: -2, 0x09: -2, 0x0B: -1, 0x11: 4, 0x12: -2,
	0x13: 2, 0x15: -2, 0x16: -2, 0x17: 1, 0x18: 4, 0x19: 1, 0x1A: -2, 0x1C: -2,
	0x1F: -2, 0x21: 2, 0x22: 2, 0x23: 2, 0x24: 1, 0x25: 1, 0x26: -3, 0x27: 4,
	0x28: 1, 0x29: 1, 0x2A: 1,
}

// propScan is what scanProps found.
type propScan struct {
	size int        // bytes of the property length and the properties
	zero [0x2B]bool // the property was present with the value 0 (fixed widths)
	seen [0x2B]bool // the property was present
}

// scanProps reads the properties at the start of b (their length first):
// each within the packet, none unknown, none but User Property repeated
// (§2.2.2.2: "It is a Protocol Error to include … more than once" for
// every property of a client's packets except User Property).
func scanProps(b []byte) (propScan, error) {
	var s propScan
	n, hdr, ok := readVarint(b)
	if !ok || hdr+n > len(b) {
		return s, malformed("§2.2.2.1", "properties overrun the packet")
	}
	s.size = hdr + n
	p, end := hdr, hdr+n
	for p < end {
		id := b[p]
		p++
		if int(id) >= len(propWidth) || propWidth[id] == 0 {
			return s, malformed("§2.2.2.2", "unknown property %#02x", id)
		}
		if s.seen[id] && id != 0x26 {
			return s, violation("§2.2.2.2", "property %#02x more than once", id)
		}
		s.seen[id] = true
		switch w := int(propWidth[id]); w {
		case 1, 2, 4:
			if p+w > end {
				return s, malformed("§2.2.2.2", "property %#02x overruns the properties", id)
			}
			zero := true
			for _, v := range b[p : p+w] {
				zero = zero && v == 0
			}
			s.zero[id] = zero
			p += w
		case -1:
			_, h, ok := readVarint(b[p:end])
			if !ok {
				return s, malformed("§2.2.2.2", "property %#02x overruns the properties", id)
			}
			p += h
		default:
			for range -w - 1 {
				if p+2 > end {
					return s, malformed("§2.2.2.2", "property %#02x overruns the properties", id)
				}
				p += 2 + (int(b[p])<<8 | int(b[p+1]))
				if p > end {
					return s, malformed("§2.2.2.2", "property %#02x overruns the properties", id)
				}
			}
		}
	}
	return s, nil
}
