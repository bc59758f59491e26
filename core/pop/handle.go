package pop

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash"
	"sync"
	"time"
)

// A receipt handle names one hand-out of one message: the queue it came
// from, its offset, the generation of the hand-out and its deadline. It is
// opaque to clients: base64url (no padding) of
//
//	off  size  field
//	0    1     version (1)
//	1    2     queue number (big-endian)
//	3    8     queue offset (big-endian)
//	11   8     generation: unique per hand-out within a Service (big-endian)
//	19   8     invisibility deadline, unix ns (big-endian)
//	27   1     group length g, 1–100
//	28   g     group
//	28+g 1     topic length t, 1–127
//	29+g t     topic
//	29+g+t 16  tag: HMAC-SHA256 over every byte before it, first 16 bytes
//
// The tag is keyed by a random secret drawn by each Service, so a handle
// cannot be forged or altered, and a handle from before a restart is
// refused as invalid. Decoding checks the length bounds, then the version,
// then the inner lengths, then the tag, and never panics. These constants
// are part of the format.
const (
	handleVersion = 1
	handleFixed   = 28 // bytes before the group
	handleTagLen  = 16
	handleMaxRaw  = handleFixed + maxGroupLen + 1 + maxTopicLen + handleTagLen
	handleMinRaw  = handleFixed + 1 + 1 + 1 + handleTagLen
	maxGroupLen   = 100
	maxTopicLen   = 127
)

var handleEncoding = base64.RawURLEncoding

// handle is a decoded receipt handle.
type handle struct {
	queue    int
	offset   int64
	gen      uint64
	deadline int64 // unix ns
	group    string
	topic    string
}

// signer computes handle tags with one Service's secret.
type signer struct {
	pool sync.Pool // of hash.Hash
}

func newSigner(secret []byte) *signer {
	return &signer{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}}
}

func (s *signer) tag(dst, msg []byte) []byte {
	h := s.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(msg)
	var sum [sha256.Size]byte
	out := h.Sum(sum[:0])
	s.pool.Put(h)
	return append(dst, out[:handleTagLen]...)
}

// encode returns the handle's text form.
func (s *signer) encode(h handle) string {
	var buf [handleMaxRaw]byte
	b := buf[:0]
	b = append(b, handleVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(h.queue))
	b = binary.BigEndian.AppendUint64(b, uint64(h.offset))
	b = binary.BigEndian.AppendUint64(b, h.gen)
	b = binary.BigEndian.AppendUint64(b, uint64(h.deadline))
	b = append(b, byte(len(h.group)))
	b = append(b, h.group...)
	b = append(b, byte(len(h.topic)))
	b = append(b, h.topic...)
	b = s.tag(b, b)
	return handleEncoding.EncodeToString(b)
}

// decode parses and authenticates a handle. Every error wraps
// ErrInvalidHandle.
func (s *signer) decode(text string) (handle, error) {
	h, b, err := parseHandle(text)
	if err != nil {
		return h, err
	}
	body := b[:len(b)-handleTagLen]
	var want [handleTagLen]byte
	if !hmac.Equal(s.tag(want[:0], body), b[len(body):]) {
		return handle{}, fmt.Errorf("%w: tag mismatch", ErrInvalidHandle)
	}
	return h, nil
}

// GroupOf returns the consumer group a receipt handle names, without
// authenticating it (only the Service that handed it out can): enough to
// send an ack to the node that serves the group. Every error wraps
// ErrInvalidHandle.
func GroupOf(text string) (string, error) {
	h, _, err := parseHandle(text)
	return h.group, err
}

// parseHandle decodes a handle's fields, checking its lengths and version;
// raw is its bytes, tag last.
func parseHandle(text string) (h handle, raw []byte, err error) {
	if text == "" {
		return h, nil, fmt.Errorf("%w: empty", ErrInvalidHandle)
	}
	if len(text) > handleEncoding.EncodedLen(handleMaxRaw) {
		return h, nil, fmt.Errorf("%w: %d characters, at most %d", ErrInvalidHandle, len(text), handleEncoding.EncodedLen(handleMaxRaw))
	}
	var buf [handleMaxRaw]byte
	n, err := handleEncoding.Decode(buf[:], []byte(text))
	if err != nil {
		return h, nil, fmt.Errorf("%w: %v", ErrInvalidHandle, err)
	}
	b := buf[:n]
	if len(b) < handleMinRaw {
		return h, nil, fmt.Errorf("%w: %d bytes, at least %d", ErrInvalidHandle, len(b), handleMinRaw)
	}
	if b[0] != handleVersion {
		return h, nil, fmt.Errorf("%w: version %d", ErrInvalidHandle, b[0])
	}
	g := int(b[handleFixed-1])
	if g < 1 || g > maxGroupLen || handleFixed+g+1 > len(b) {
		return h, nil, fmt.Errorf("%w: group length %d", ErrInvalidHandle, g)
	}
	t := int(b[handleFixed+g])
	if t < 1 || t > maxTopicLen || handleFixed+g+1+t+handleTagLen != len(b) {
		return h, nil, fmt.Errorf("%w: topic length %d in %d bytes", ErrInvalidHandle, t, len(b))
	}
	be := binary.BigEndian
	h.queue = int(be.Uint16(b[1:]))
	h.offset = int64(be.Uint64(b[3:]))
	h.gen = be.Uint64(b[11:])
	h.deadline = int64(be.Uint64(b[19:]))
	h.group = string(b[handleFixed : handleFixed+g])
	h.topic = string(b[handleFixed+g+1 : handleFixed+g+1+t])
	return h, b, nil
}

// expiredAt reports whether the handle's deadline has passed at now.
func (h handle) expiredAt(now time.Time) bool { return now.UnixNano() >= h.deadline }
