package session

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// The session log: a header, then records (layouts in doc.go). All
// integers are big-endian. These constants are part of the format.
const (
	logMagic     = "FMQS"
	logVersion   = 1
	headerSize   = 20
	recMagic     = 0xF7
	recVersion   = 1
	recHeader    = 10
	recMinBody   = 5 // op, key length, a key of at least 2 bytes
	maxRecordKey = 0xFFFF
	// maxRecordBody bounds one record's body: a will or a message holds at
	// most one MQTT packet (256 MiB), plus its key and fields.
	maxRecordBody = 257 << 20

	opPut    = 1
	opDelete = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendHeader appends a log header with nonce.
func appendHeader(b []byte, nonce uint64) []byte {
	start := len(b)
	b = append(b, logMagic...)
	b = append(b, logVersion, 0, 0, 0)
	b = binary.BigEndian.AppendUint64(b, nonce)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// decodeHeader checks a log header (magic, version, reserved bytes, CRC, in
// that order) and returns its nonce.
func decodeHeader(b []byte) (uint64, error) {
	if len(b) < headerSize {
		return 0, fmt.Errorf("%w: header of %d bytes, want %d", ErrCorrupt, len(b), headerSize)
	}
	if string(b[:4]) != logMagic {
		return 0, fmt.Errorf("%w: starts with % x, want %q", ErrNotSessionLog, b[:4], logMagic)
	}
	if b[4] != logVersion {
		return 0, fmt.Errorf("%w: session log version %d, this build reads %d", ErrVersion, b[4], logVersion)
	}
	if crc32.Checksum(b[:16], castagnoli) != binary.BigEndian.Uint32(b[16:20]) || b[5]|b[6]|b[7] != 0 {
		return 0, fmt.Errorf("%w: log header checksum mismatch", ErrCorrupt)
	}
	return binary.BigEndian.Uint64(b[8:16]), nil
}

// recordCRC is the checksum of a record: the log's nonce, then its version
// and length, then its body. The nonce makes a record copied from another
// log — or planted in a payload — fail its check.
func recordCRC(nonce uint64, rec []byte) uint32 {
	var nb [8]byte
	binary.BigEndian.PutUint64(nb[:], nonce)
	c := crc32.Update(0, castagnoli, nb[:])
	c = crc32.Update(c, castagnoli, rec[1:6])
	return crc32.Update(c, castagnoli, rec[recHeader:])
}

// appendRecord appends a record; key and value must fit (callers check).
func appendRecord(b []byte, nonce uint64, op byte, key string, value []byte) []byte {
	start := len(b)
	body := 3 + len(key) + len(value)
	b = append(b, recMagic, recVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(body))
	b = append(b, 0, 0, 0, 0)
	b = append(b, op)
	b = binary.BigEndian.AppendUint16(b, uint16(len(key)))
	b = append(b, key...)
	b = append(b, value...)
	binary.BigEndian.PutUint32(b[start+6:], recordCRC(nonce, b[start:]))
	return b
}

// recordSize is the size of the record appendRecord writes.
func recordSize(key string, value []byte) int { return recHeader + 3 + len(key) + len(value) }

// decodeRecord decodes the record at the start of b and returns its size;
// value aliases b. It checks magic, version, length bounds (ErrTorn when
// the record runs past the end of b), the CRC, then the body, and never
// panics.
func decodeRecord(b []byte, nonce uint64) (op byte, k string, value []byte, n int, err error) {
	switch {
	case len(b) == 0:
		return 0, "", nil, 0, fmt.Errorf("%w: no bytes", ErrTorn)
	case b[0] != recMagic:
		return 0, "", nil, 0, fmt.Errorf("%w: magic %#02x", ErrCorrupt, b[0])
	case len(b) < recHeader:
		return 0, "", nil, 0, fmt.Errorf("%w: %d bytes of a %d-byte header", ErrTorn, len(b), recHeader)
	case b[1] != recVersion:
		return 0, "", nil, 0, fmt.Errorf("%w: record version %d, this build reads %d", ErrVersion, b[1], recVersion)
	}
	body := int(binary.BigEndian.Uint32(b[2:6]))
	if body < recMinBody || body > maxRecordBody {
		return 0, "", nil, 0, fmt.Errorf("%w: body length %d out of bounds", ErrCorrupt, body)
	}
	if body > len(b)-recHeader {
		return 0, "", nil, 0, fmt.Errorf("%w: body of %d bytes, %d left", ErrTorn, body, len(b)-recHeader)
	}
	n = recHeader + body
	if recordCRC(nonce, b[:n]) != binary.BigEndian.Uint32(b[6:10]) {
		return 0, "", nil, 0, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	rec := b[recHeader:n]
	op = rec[0]
	kl := int(binary.BigEndian.Uint16(rec[1:3]))
	switch {
	case op != opPut && op != opDelete:
		return 0, "", nil, 0, fmt.Errorf("%w: op %d", ErrCorrupt, op)
	case kl < 2 || 3+kl > len(rec):
		return 0, "", nil, 0, fmt.Errorf("%w: key length %d in a body of %d", ErrCorrupt, kl, len(rec))
	case op == opDelete && 3+kl != len(rec):
		return 0, "", nil, 0, fmt.Errorf("%w: delete with a value", ErrCorrupt)
	}
	return op, string(rec[3 : 3+kl]), rec[3+kl:], n, nil
}

// replay calls apply for every valid record of data (the log after its
// header, which starts at offset base in the file), in order, and bad for
// every damaged span. After damage it resyncs at the next byte that starts
// a valid record. It returns where the next record is to be written: the
// end of data, or the start of a damaged tail (no valid record after it),
// which the caller cuts off.
func replay(data []byte, base int64, nonce uint64, apply func(op byte, k string, value []byte, off int64, n int),
	bad func(off int64, err error)) (end int64) {
	off := 0
	for off < len(data) {
		op, k, value, n, err := decodeRecord(data[off:], nonce)
		if err == nil {
			apply(op, k, value, base+int64(off), n)
			off += n
			continue
		}
		bad(base+int64(off), err)
		next := resync(data, off+1, nonce)
		if next < 0 {
			return base + int64(off)
		}
		off = next
	}
	return base + int64(len(data))
}

// resync returns the offset of the first valid record at or after from, or
// -1.
func resync(data []byte, from int, nonce uint64) int {
	for from < len(data) {
		i := bytes.IndexByte(data[from:], recMagic)
		if i < 0 {
			return -1
		}
		at := from + i
		if _, _, _, _, err := decodeRecord(data[at:], nonce); err == nil {
			return at
		}
		from = at + 1
	}
	return -1
}
