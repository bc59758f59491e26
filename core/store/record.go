package store

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// These constants are part of the on-disk format (see doc.go). Changing one
// needs a new version number.
const (
	recordMagic   uint32 = 0x464D5152 // "FMQR"
	recordVersion byte   = 1

	// recordHeaderLen is the fixed part of a record, before the variable
	// fields.
	recordHeaderLen = 72
	// recordMinLen is the smallest possible record: the header plus the
	// length prefixes of the variable fields and a 1-byte topic.
	recordMinLen = recordHeaderLen + 1 + 1 + 2 + 2 + 2 + 2 + 4

	// recordMaxLen bounds every record on disk. It is the format's limit,
	// not a setting: Options.MaxMessageBytes (at most this) only bounds new
	// produces, so lowering it never makes stored records unreadable. A
	// length field above it is damage.
	recordMaxLen = 1 << 30

	// recordFlagsV1 and recordReservedV1 are the only values version 1
	// writes; a record with anything else set is damaged (a future kind of
	// record comes with a new store format, see storeFormat).
	recordFlagsV1    byte   = 0
	recordReservedV1 uint16 = 0
)

// Header field offsets.
const (
	offMagic       = 0
	offVersion     = 4
	offFlags       = 5
	offReserved    = 6
	offLength      = 8
	offCRC         = 12
	offCommitLog   = 16
	offQueueOffset = 24
	offBornAt      = 32
	offStoredAt    = 40
	offDeliverAt   = 48
	offTagHash     = 56
	offQueue       = 64
	offReconsume   = 68
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordCRC computes a record's checksum: CRC-32C over bytes [0,12) and
// [16,len). Only the CRC field itself is left out.
func recordCRC(rec []byte) uint32 {
	c := crc32.Update(0, castagnoli, rec[:offCRC])
	return crc32.Update(c, castagnoli, rec[offCommitLog:])
}

// encodedLen returns the record size for m, or an error if a field does not
// fit its length prefix or the limits.
func encodedLen(m *core.Message, maxPropsBytes int) (int, error) {
	if len(m.Topic) == 0 || len(m.Topic) > 255 {
		return 0, fmt.Errorf("%w: topic length %d", core.ErrInvalidMessage, len(m.Topic))
	}
	if len(m.ShardingKey) > 0xFFFF || len(m.Tag) > 0xFFFF {
		return 0, fmt.Errorf("%w: sharding key or tag longer than 65535 bytes", core.ErrInvalidMessage)
	}
	props := 0
	for k, v := range m.Properties {
		if k == "" {
			return 0, fmt.Errorf("%w: empty property name", core.ErrInvalidMessage)
		}
		if len(k) > 0xFFFF || len(v) > 0xFFFF {
			return 0, fmt.Errorf("%w: property %q longer than 65535 bytes", core.ErrPropertiesTooLarge, k)
		}
		props += 4 + len(k) + len(v)
	}
	keys := 0
	for _, k := range m.Keys {
		if k == "" {
			return 0, fmt.Errorf("%w: empty index key", core.ErrInvalidMessage)
		}
		keys += 2 + len(k)
	}
	if props > 0xFFFF || keys > 0xFFFF || props+keys > maxPropsBytes {
		return 0, fmt.Errorf("%w: properties %d + keys %d bytes, limit %d", core.ErrPropertiesTooLarge, props, keys, maxPropsBytes)
	}
	n := recordMinLen - 1 + len(m.Topic) + len(m.ShardingKey) + len(m.Tag) + props + keys + len(m.Body)
	if n > recordMaxLen {
		return 0, fmt.Errorf("%w: %d bytes, the format's limit is %d", core.ErrMessageTooLarge, n, recordMaxLen)
	}
	return n, nil
}

// appendRecord appends m's record to dst with placeholders for what only the
// appender knows (offsets, store time, queue, CRC); sealRecord fills them in.
// n must be encodedLen(m). A message without a birth time is born when it
// is stored: defaultBorn is the store time its appender stamps on it, so
// a stored record never has a store time before its birth.
func appendRecord(dst []byte, m *core.Message, n int, defaultBorn int64) []byte {
	start := len(dst)
	dst = slices.Grow(dst, n)[:start+n]
	b := dst[start:]
	be := binary.BigEndian
	be.PutUint32(b[offMagic:], recordMagic)
	b[offVersion] = recordVersion
	b[offFlags] = recordFlagsV1
	be.PutUint16(b[offReserved:], recordReservedV1)
	be.PutUint32(b[offLength:], uint32(n))
	born := defaultBorn
	if !m.BornAt.IsZero() {
		born = m.BornAt.UnixNano()
	}
	be.PutUint64(b[offBornAt:], uint64(born))
	var deliver int64
	if !m.DeliverAt.IsZero() {
		deliver = m.DeliverAt.UnixNano()
	}
	be.PutUint64(b[offDeliverAt:], uint64(deliver))
	be.PutUint64(b[offTagHash:], uint64(core.TagHash(m.Tag)))
	be.PutUint32(b[offReconsume:], uint32(max(0, m.ReconsumeCount)))

	p := recordHeaderLen
	b[p] = byte(len(m.Topic))
	p++
	p += copy(b[p:], m.Topic)
	be.PutUint16(b[p:], uint16(len(m.ShardingKey)))
	p += 2
	p += copy(b[p:], m.ShardingKey)
	be.PutUint16(b[p:], uint16(len(m.Tag)))
	p += 2
	p += copy(b[p:], m.Tag)

	propsAt := p
	p += 2
	for k, v := range m.Properties {
		be.PutUint16(b[p:], uint16(len(k)))
		p += 2
		p += copy(b[p:], k)
		be.PutUint16(b[p:], uint16(len(v)))
		p += 2
		p += copy(b[p:], v)
	}
	be.PutUint16(b[propsAt:], uint16(p-propsAt-2))

	keysAt := p
	p += 2
	for _, k := range m.Keys {
		be.PutUint16(b[p:], uint16(len(k)))
		p += 2
		p += copy(b[p:], k)
	}
	be.PutUint16(b[keysAt:], uint16(p-keysAt-2))

	be.PutUint32(b[p:], uint32(len(m.Body)))
	p += 4
	copy(b[p:], m.Body)
	return dst
}

// sealRecord fills in the appender's fields and the CRC.
func sealRecord(rec []byte, clOffset, queueOffset int64, storedAt int64, queue int) {
	be := binary.BigEndian
	be.PutUint64(rec[offCommitLog:], uint64(clOffset))
	be.PutUint64(rec[offQueueOffset:], uint64(queueOffset))
	be.PutUint64(rec[offStoredAt:], uint64(storedAt))
	be.PutUint32(rec[offQueue:], uint32(queue))
	be.PutUint32(rec[offCRC:], recordCRC(rec))
}

// recordLen validates the fixed prefix of a record (magic, version, flags
// and reserved bytes, length bounds, in that order) and returns its length.
// b must hold at least offCRC bytes. It never trusts the length before
// bounding it, so a length of 0x7FFFFFFF costs nothing. The bound is the
// format's (recordMaxLen), never a runtime option: see recordMaxLen.
func recordLen(b []byte) (int, error) {
	if len(b) < offCRC {
		return 0, fmt.Errorf("%w: %d bytes, need %d for a header", errShort, len(b), offCRC)
	}
	be := binary.BigEndian
	if m := be.Uint32(b[offMagic:]); m != recordMagic {
		return 0, fmt.Errorf("%w: bad magic %#08x", errBadRecord, m)
	}
	if v := b[offVersion]; v != recordVersion {
		return 0, fmt.Errorf("%w: unknown version %d", errBadRecord, v)
	}
	if f, r := b[offFlags], be.Uint16(b[offReserved:]); f != recordFlagsV1 || r != recordReservedV1 {
		return 0, fmt.Errorf("%w: flags %#02x, reserved %#04x: version %d sets neither", errBadRecord, f, r, recordVersion)
	}
	n := int(be.Uint32(b[offLength:]))
	if n < recordMinLen || n > recordMaxLen {
		return 0, fmt.Errorf("%w: length %d outside [%d, %d]", errBadRecord, n, recordMinLen, recordMaxLen)
	}
	return n, nil
}

// recordMeta is what the dispatcher needs of a record, decoded without
// allocating the body or properties.
type recordMeta struct {
	clOffset    int64
	queueOffset int64
	size        int
	storedAt    int64
	deliverAt   int64
	tagHash     int64
	queue       int
	topic       []byte // aliases the record
	shardingKey []byte // aliases the record
	keysBlock   []byte // aliases the record: repeated (u16 len, key)
}

// checkRecord validates a whole record (prefix, CRC, field bounds) and
// returns its metadata. rec must be exactly one record.
func checkRecord(rec []byte) (recordMeta, error) {
	var meta recordMeta
	n, err := recordLen(rec)
	if err != nil {
		return meta, err
	}
	if len(rec) < n {
		return meta, fmt.Errorf("%w: record of %d bytes, only %d present", errShort, n, len(rec))
	}
	rec = rec[:n]
	be := binary.BigEndian
	if want, got := be.Uint32(rec[offCRC:]), recordCRC(rec); want != got {
		return meta, fmt.Errorf("%w: checksum %#08x, computed %#08x", errBadRecord, want, got)
	}
	meta.size = n
	meta.clOffset = int64(be.Uint64(rec[offCommitLog:]))
	meta.queueOffset = int64(be.Uint64(rec[offQueueOffset:]))
	meta.storedAt = int64(be.Uint64(rec[offStoredAt:]))
	meta.deliverAt = int64(be.Uint64(rec[offDeliverAt:]))
	meta.tagHash = int64(be.Uint64(rec[offTagHash:]))
	meta.queue = int(be.Uint32(rec[offQueue:]))
	if meta.clOffset < 0 || meta.queueOffset < 0 || meta.queue > 0xFFFF {
		return meta, fmt.Errorf("%w: offset %d, queue offset %d, queue %d out of range", errBadRecord, meta.clOffset, meta.queueOffset, meta.queue)
	}

	r := reader{b: rec, p: recordHeaderLen}
	tl := int(r.u8())
	meta.topic = r.bytes(tl)
	meta.shardingKey = r.bytes(int(r.u16()))
	r.bytes(int(r.u16())) // tag
	props := r.bytes(int(r.u16()))
	meta.keysBlock = r.bytes(int(r.u16()))
	body := int(r.u32())
	r.bytes(body)
	if r.err != nil {
		return meta, fmt.Errorf("%w: %v", errBadRecord, r.err)
	}
	if r.p != n {
		return meta, fmt.Errorf("%w: %d trailing bytes", errBadRecord, n-r.p)
	}
	if tl == 0 {
		return meta, fmt.Errorf("%w: empty topic", errBadRecord)
	}
	if err := walkPairs(props, nil); err != nil {
		return meta, err
	}
	if err := walkKeys(meta.keysBlock, nil); err != nil {
		return meta, err
	}
	return meta, nil
}

// decodeRecord validates rec and decodes it into a StoredMessage. The body
// aliases rec; strings are copied.
func decodeRecord(rec []byte, storeID uint32) (*core.StoredMessage, error) {
	meta, err := checkRecord(rec)
	if err != nil {
		return nil, err
	}
	rec = rec[:meta.size]
	be := binary.BigEndian
	m := &core.StoredMessage{
		ID:              core.NewCommitLogID(storeID, meta.clOffset, meta.size),
		Queue:           meta.queue,
		QueueOffset:     meta.queueOffset,
		CommitLogOffset: meta.clOffset,
		Size:            meta.size,
		StoredAt:        time.Unix(0, meta.storedAt),
	}
	m.ReconsumeCount = int(be.Uint32(rec[offReconsume:]))
	m.BornAt = time.Unix(0, int64(be.Uint64(rec[offBornAt:])))
	if meta.deliverAt != 0 {
		m.DeliverAt = time.Unix(0, meta.deliverAt)
	}
	r := reader{b: rec, p: recordHeaderLen}
	m.Topic = string(r.bytes(int(r.u8())))
	m.ShardingKey = string(r.bytes(int(r.u16())))
	m.Tag = string(r.bytes(int(r.u16())))
	props := r.bytes(int(r.u16()))
	keys := r.bytes(int(r.u16()))
	body := r.bytes(int(r.u32()))
	if len(props) > 0 {
		m.Properties = make(map[string]string)
		_ = walkPairs(props, func(k, v []byte) { m.Properties[string(k)] = string(v) })
	}
	if len(keys) > 0 {
		_ = walkKeys(keys, func(k []byte) { m.Keys = append(m.Keys, string(k)) })
	}
	m.Body = body[:len(body):len(body)]
	return m, nil
}

func walkPairs(b []byte, fn func(k, v []byte)) error {
	r := reader{b: b}
	for r.p < len(b) && r.err == nil {
		k := r.bytes(int(r.u16()))
		v := r.bytes(int(r.u16()))
		if r.err == nil && len(k) == 0 {
			return fmt.Errorf("%w: empty property name", errBadRecord)
		}
		if r.err == nil && fn != nil {
			fn(k, v)
		}
	}
	if r.err != nil {
		return fmt.Errorf("%w: properties: %v", errBadRecord, r.err)
	}
	return nil
}

func walkKeys(b []byte, fn func(k []byte)) error {
	r := reader{b: b}
	for r.p < len(b) && r.err == nil {
		k := r.bytes(int(r.u16()))
		if r.err == nil && len(k) == 0 {
			return fmt.Errorf("%w: empty key", errBadRecord)
		}
		if r.err == nil && fn != nil {
			fn(k)
		}
	}
	if r.err != nil {
		return fmt.Errorf("%w: keys: %v", errBadRecord, r.err)
	}
	return nil
}

// reader reads big-endian fields with bounds checks; after the first
// out-of-bounds read it returns zero values and keeps err.
type reader struct {
	b   []byte
	p   int
	err error
}

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || n > len(r.b)-r.p {
		r.err = fmt.Errorf("field of %d bytes at %d overruns %d", n, r.p, len(r.b))
		return false
	}
	return true
}

func (r *reader) u8() uint8 {
	if !r.need(1) {
		return 0
	}
	v := r.b[r.p]
	r.p++
	return v
}

func (r *reader) u16() uint16 {
	if !r.need(2) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.b[r.p:])
	r.p += 2
	return v
}

func (r *reader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.b[r.p:])
	r.p += 4
	return v
}

func (r *reader) bytes(n int) []byte {
	if !r.need(n) {
		return nil
	}
	v := r.b[r.p : r.p+n : r.p+n]
	r.p += n
	return v
}
