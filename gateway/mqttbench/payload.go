package mqttbench

import "encoding/binary"

// The payload header; see the package documentation for its layout. These
// constants are part of the format: a receiver of another version must be
// able to tell that a payload is not its own.
const (
	// PayloadHeaderBytes is the size of the header and so the smallest
	// payload a run can send.
	PayloadHeaderBytes = 16
	// payloadMagic marks a bench payload; it doubles as the version (1).
	payloadMagic = 0xB7
	// MaxPublishers is the most publishers a payload can name (uint24).
	MaxPublishers = 1 << 24
)

// Stamp is what a payload's header carries.
type Stamp struct {
	// Publisher is the index of the publisher that sent it (< MaxPublishers).
	Publisher uint32
	// Seq is the sequence number within the publisher, from 0.
	Seq uint32
	// SentUnixNano is the send time, unix nanoseconds.
	SentUnixNano int64
}

// EncodePayload writes s into the first PayloadHeaderBytes of dst and
// leaves the rest alone. It panics if dst is shorter than the header or
// s.Publisher does not fit in 24 bits: both are programming errors.
func EncodePayload(dst []byte, s Stamp) {
	_ = dst[PayloadHeaderBytes-1]
	if s.Publisher >= MaxPublishers {
		panic("mqttbench: publisher index does not fit in 24 bits")
	}
	binary.BigEndian.PutUint32(dst[0:4], payloadMagic<<24|s.Publisher)
	binary.BigEndian.PutUint32(dst[4:8], s.Seq)
	binary.BigEndian.PutUint64(dst[8:16], uint64(s.SentUnixNano))
}

// DecodePayload reads the header of a payload. It checks, in this order,
// the length (ErrPayloadShort), the magic (ErrPayloadMagic) and the send
// time (ErrPayloadTime); it never panics. Whether the publisher and
// sequence belong to the current run is for the receiver to decide.
func DecodePayload(b []byte) (Stamp, error) {
	if len(b) < PayloadHeaderBytes {
		return Stamp{}, ErrPayloadShort
	}
	if b[0] != payloadMagic {
		return Stamp{}, ErrPayloadMagic
	}
	s := Stamp{
		Publisher:    binary.BigEndian.Uint32(b[0:4]) & (MaxPublishers - 1),
		Seq:          binary.BigEndian.Uint32(b[4:8]),
		SentUnixNano: int64(binary.BigEndian.Uint64(b[8:16])),
	}
	if s.SentUnixNano <= 0 {
		return Stamp{}, ErrPayloadTime
	}
	return s, nil
}

// fillPayload fills the bytes after the header with a fixed pattern; the
// receiver ignores them.
func fillPayload(b []byte) {
	for i := PayloadHeaderBytes; i < len(b); i++ {
		b[i] = byte(i*131 + 7)
	}
}
