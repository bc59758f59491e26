package session

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The session log is a sequence of records, each a put or a delete of one
// key. The newest record of a key wins; compaction rewrites only the live
// ones. All integers are little-endian.
//
//	offset  size  field
//	0       1     magic 0xF5 (marks record starts, for resync past damage)
//	1       4     CRC-32C (Castagnoli) of bytes 9 … end
//	5       4     length of bytes 9 … end
//	9       1     op: 1 put, 2 delete
//	10      2     key length k
//	12      k     key
//	12+k    …     value (put only): mochi's storage record, JSON
//
// A record that fails its checks is skipped with a log line and the reader
// resyncs at the next magic byte that starts a valid record: one damaged
// session is dropped, the others load. These constants are part of the
// format.
const (
	recMagic  = 0xF5
	recHeader = 9
	opPut     = 1
	opDelete  = 2
	// maxRecord bounds one record (a session's inflight message holds at
	// most one MQTT packet: 1 MiB by default, 256 MiB at most).
	maxRecord = 256<<20 + 64<<10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errBadRecord is returned by decodeRecord for a record that fails its checks.
var errBadRecord = errors.New("session: bad record")

func appendRecord(b []byte, op byte, key string, value []byte) []byte {
	start := len(b)
	body := 3 + len(key) + len(value)
	b = append(b, recMagic, 0, 0, 0, 0, 0, 0, 0, 0, op)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(key)))
	b = append(b, key...)
	b = append(b, value...)
	binary.LittleEndian.PutUint32(b[start+5:], uint32(body))
	binary.LittleEndian.PutUint32(b[start+1:], crc32.Checksum(b[start+recHeader:], castagnoli))
	return b
}

// decodeRecord decodes the record at the start of b and returns its size.
// It never panics: lengths are checked before slicing.
func decodeRecord(b []byte) (op byte, key string, value []byte, n int, err error) {
	if len(b) < recHeader+3 {
		return 0, "", nil, 0, fmt.Errorf("%w: %d bytes left, header needs %d", errBadRecord, len(b), recHeader+3)
	}
	if b[0] != recMagic {
		return 0, "", nil, 0, fmt.Errorf("%w: magic %#x", errBadRecord, b[0])
	}
	body := int(binary.LittleEndian.Uint32(b[5:9]))
	if body < 3 || body > maxRecord || body > len(b)-recHeader {
		return 0, "", nil, 0, fmt.Errorf("%w: length %d out of bounds", errBadRecord, body)
	}
	rec := b[recHeader : recHeader+body]
	if crc32.Checksum(rec, castagnoli) != binary.LittleEndian.Uint32(b[1:5]) {
		return 0, "", nil, 0, fmt.Errorf("%w: checksum mismatch", errBadRecord)
	}
	op = rec[0]
	k := int(binary.LittleEndian.Uint16(rec[1:3]))
	if 3+k > len(rec) || (op != opPut && op != opDelete) || (op == opDelete && 3+k != len(rec)) {
		return 0, "", nil, 0, fmt.Errorf("%w: op %d key length %d", errBadRecord, op, k)
	}
	return op, string(rec[3 : 3+k]), rec[3+k:], recHeader + body, nil
}

// replay calls apply for every valid record of b in order and reports
// damaged spans (offset, error) through bad. It resyncs after damage at the
// next byte that starts a valid record.
func replay(b []byte, apply func(op byte, key string, value []byte, off int64), bad func(off int64, err error)) {
	for off := 0; off < len(b); {
		op, key, value, n, err := decodeRecord(b[off:])
		if err == nil {
			apply(op, key, value, int64(off))
			off += n
			continue
		}
		bad(int64(off), err)
		next := bytes.IndexByte(b[off+1:], recMagic)
		for next >= 0 {
			at := off + 1 + next
			if _, _, _, _, e := decodeRecord(b[at:]); e == nil {
				break
			}
			n2 := bytes.IndexByte(b[at+1:], recMagic)
			if n2 < 0 {
				next = -1
				break
			}
			next = at + 1 + n2 - (off + 1)
		}
		if next < 0 {
			return
		}
		off = off + 1 + next
	}
}

func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
