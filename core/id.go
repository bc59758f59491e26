package core

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// MessageID names one stored message. It is 16 bytes, printed as 32
// lower-case hex characters, and encodes where the message lives so that a
// lookup by ID needs no index:
//
//	byte   0     kind: 1 = embedded commit log (IDKindCommitLog)
//	bytes  1–3   store ID: low 24 bits of the store's random identity, so an
//	             ID from another store is recognised instead of misread
//	bytes  4–11  commit-log offset of the record (big-endian)
//	bytes 12–15  record size in bytes (big-endian)
//
// Other engines use other kinds and give bytes 1–15 their own meaning. Commit
// log offsets are never reused, so an ID is unique for the life of a store.
type MessageID [16]byte

// IDKindCommitLog marks an ID issued by the embedded commit-log engine.
const IDKindCommitLog = 1

// NewCommitLogID builds the ID of a commit-log record.
func NewCommitLogID(storeID uint32, offset int64, size int) MessageID {
	var id MessageID
	id[0] = IDKindCommitLog
	id[1] = byte(storeID >> 16)
	id[2] = byte(storeID >> 8)
	id[3] = byte(storeID)
	binary.BigEndian.PutUint64(id[4:12], uint64(offset))
	binary.BigEndian.PutUint32(id[12:16], uint32(size))
	return id
}

// Kind returns the engine kind encoded in the ID.
func (id MessageID) Kind() byte { return id[0] }

// StoreID returns the 24-bit store identity of a commit-log ID.
func (id MessageID) StoreID() uint32 {
	return uint32(id[1])<<16 | uint32(id[2])<<8 | uint32(id[3])
}

// Offset returns the commit-log offset of a commit-log ID.
func (id MessageID) Offset() int64 { return int64(binary.BigEndian.Uint64(id[4:12])) }

// Size returns the record size of a commit-log ID.
func (id MessageID) Size() int { return int(binary.BigEndian.Uint32(id[12:16])) }

// IsZero reports whether id is the zero ID.
func (id MessageID) IsZero() bool { return id == MessageID{} }

// String returns the 32-character hex form.
func (id MessageID) String() string { return hex.EncodeToString(id[:]) }

// MarshalText implements encoding.TextMarshaler.
func (id MessageID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *MessageID) UnmarshalText(b []byte) error {
	v, err := ParseMessageID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// ParseMessageID parses the 32-character hex form.
func ParseMessageID(s string) (MessageID, error) {
	var id MessageID
	if len(s) != 32 {
		return id, fmt.Errorf("%w: %q: want 32 hex characters, got %d", ErrInvalidMessageID, s, len(s))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("%w: %q: %v", ErrInvalidMessageID, s, err)
	}
	return id, nil
}
