package store

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// rawRecord builds a record field by field, with no validation, so that a
// test can produce any malformation and still give it a correct length
// (unless length is non-zero) and checksum.
type rawRecord struct {
	topicLen    int // -1: len(topic)
	topic       string
	key         string
	keyLen      int // -1: len(key)
	tag         string
	tagLen      int // -1: len(tag)
	props       []byte
	propsLen    int // -1: len(props)
	keys        []byte
	keysLen     int // -1: len(keys)
	body        []byte
	bodyLen     int64 // -1: len(body)
	trailing    int   // extra bytes after the body, counted in the length
	length      int64 // 0: the real length
	magic       uint32
	version     byte
	clOffset    int64
	queueOffset int64
	queue       uint32
	corruptCRC  bool
}

func newRaw() rawRecord {
	return rawRecord{
		topicLen: -1, topic: "orders",
		keyLen: -1, key: "dev-1",
		tagLen: -1, tag: "tagA",
		props:    pairs("a", "1", "mqtt.qos", "1"),
		propsLen: -1,
		keys:     keyBlock("order-1", "order-2"),
		keysLen:  -1,
		body:     []byte("hello, world"),
		bodyLen:  -1,
		magic:    recordMagic, version: recordVersion,
		clOffset: 4096, queueOffset: 7, queue: 3,
	}
}

func pairs(kv ...string) []byte {
	var b []byte
	for _, s := range kv {
		b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	return b
}

func keyBlock(keys ...string) []byte { return pairs(keys...) }

func orLen(v, n int) int {
	if v < 0 {
		return n
	}
	return v
}

func (r rawRecord) bytes() []byte {
	be := binary.BigEndian
	b := make([]byte, recordHeaderLen)
	be.PutUint32(b[offMagic:], r.magic)
	b[offVersion] = r.version
	be.PutUint64(b[offCommitLog:], uint64(r.clOffset))
	be.PutUint64(b[offQueueOffset:], uint64(r.queueOffset))
	be.PutUint64(b[offBornAt:], uint64(time.Unix(1_700_000_000, 5).UnixNano()))
	be.PutUint64(b[offStoredAt:], uint64(time.Unix(1_700_000_001, 6).UnixNano()))
	be.PutUint64(b[offTagHash:], uint64(core.TagHash(r.tag)))
	be.PutUint32(b[offQueue:], r.queue)
	be.PutUint32(b[offReconsume:], 2)
	b = append(b, byte(orLen(r.topicLen, len(r.topic))))
	b = append(b, r.topic...)
	b = be.AppendUint16(b, uint16(orLen(r.keyLen, len(r.key))))
	b = append(b, r.key...)
	b = be.AppendUint16(b, uint16(orLen(r.tagLen, len(r.tag))))
	b = append(b, r.tag...)
	b = be.AppendUint16(b, uint16(orLen(r.propsLen, len(r.props))))
	b = append(b, r.props...)
	b = be.AppendUint16(b, uint16(orLen(r.keysLen, len(r.keys))))
	b = append(b, r.keys...)
	bl := r.bodyLen
	if bl < 0 {
		bl = int64(len(r.body))
	}
	b = be.AppendUint32(b, uint32(bl))
	b = append(b, r.body...)
	b = append(b, make([]byte, r.trailing)...)
	n := r.length
	if n == 0 {
		n = int64(len(b))
	}
	be.PutUint32(b[offLength:], uint32(n))
	if len(b) >= recordMinLen {
		be.PutUint32(b[offCRC:], recordCRC(b))
	}
	if r.corruptCRC {
		b[offCRC] ^= 0x01
	}
	return b
}

func TestRawRecordIsValid(t *testing.T) {
	// The builder's defaults make a record the real encoder agrees with.
	rec := newRaw().bytes()
	m, err := decodeRecord(rec, 1)
	require.NoError(t, err)
	require.Equal(t, "orders", m.Topic)
	require.Equal(t, "dev-1", m.ShardingKey)
	require.Equal(t, "tagA", m.Tag)
	require.Equal(t, map[string]string{"a": "1", "mqtt.qos": "1"}, m.Properties)
	require.Equal(t, []string{"order-1", "order-2"}, m.Keys)
	require.Equal(t, "hello, world", string(m.Body))
	n, err := encodedLen(&m.Message, 0xFFFF)
	require.NoError(t, err)
	require.Equal(t, len(rec), n)
}

func TestMalformedRecords(t *testing.T) {
	valid := newRaw().bytes()
	mod := func(f func(r *rawRecord)) []byte {
		r := newRaw()
		f(&r)
		return r.bytes()
	}
	patch := func(off int, v uint32) []byte {
		b := append([]byte(nil), valid...)
		binary.BigEndian.PutUint32(b[off:], v)
		return b
	}
	cases := []struct {
		name string
		rec  []byte
		want error
	}{
		{"empty", nil, errShort},
		{"shorter than the length field", valid[:offCRC-1], errShort},
		{"bad magic", mod(func(r *rawRecord) { r.magic = 0x464D5153 }), errBadRecord},
		{"zero-filled", make([]byte, 256), errBadRecord},
		{"unknown version", mod(func(r *rawRecord) { r.version = 2 }), errBadRecord},
		{"length 0x7FFFFFFF", patch(offLength, 0x7FFFFFFF), errBadRecord},
		{"length 0xFFFFFFFF", patch(offLength, 0xFFFFFFFF), errBadRecord},
		{"length 0x7FFFFFFF in 16 bytes", patch(offLength, 0x7FFFFFFF)[:16], errBadRecord},
		{"length above the format's limit", patch(offLength, recordMaxLen+1), errBadRecord},
		// Flags and reserved bytes with the checksum repaired: only their
		// own check can refuse them.
		{"flags set", resealed(valid, func(b []byte) { b[offFlags] = 0x01 }), errBadRecord},
		{"reserved set", resealed(valid, func(b []byte) { b[offReserved+1] = 0x40 }), errBadRecord},
		{"length below minimum", patch(offLength, recordMinLen-1), errBadRecord},
		{"length zero", patch(offLength, 0), errBadRecord},
		{"truncated by one byte", valid[:len(valid)-1], errShort},
		{"truncated to the header", valid[:recordHeaderLen], errShort},
		{"crc mismatch", mod(func(r *rawRecord) { r.corruptCRC = true }), errBadRecord},
		{"body bit flipped", func() []byte {
			b := append([]byte(nil), valid...)
			b[len(b)-1] ^= 0x80
			return b
		}(), errBadRecord},
		{"negative commit-log offset", mod(func(r *rawRecord) { r.clOffset = -1 }), errBadRecord},
		{"negative queue offset", mod(func(r *rawRecord) { r.queueOffset = -5 }), errBadRecord},
		{"queue above 65535", mod(func(r *rawRecord) { r.queue = 0x10000 }), errBadRecord},
		{"topic length overruns", mod(func(r *rawRecord) { r.topicLen = 255 }), errBadRecord},
		{"key length overruns", mod(func(r *rawRecord) { r.keyLen = 0xFFFF }), errBadRecord},
		{"tag length overruns", mod(func(r *rawRecord) { r.tagLen = 0xFFFF }), errBadRecord},
		{"properties length overruns", mod(func(r *rawRecord) { r.propsLen = 0xFFFF }), errBadRecord},
		{"keys length overruns", mod(func(r *rawRecord) { r.keysLen = 0xFFFF }), errBadRecord},
		{"body length overruns", mod(func(r *rawRecord) { r.bodyLen = 1 << 31 }), errBadRecord},
		{"body length overruns by one", mod(func(r *rawRecord) { r.bodyLen = int64(len(r.body) + 1) }), errBadRecord},
		{"body length 0xFFFFFFFF", mod(func(r *rawRecord) { r.bodyLen = 0xFFFFFFFF }), errBadRecord},
		{"trailing bytes", mod(func(r *rawRecord) { r.trailing = 3 }), errBadRecord},
		{"body length short of the record", mod(func(r *rawRecord) { r.bodyLen = int64(len(r.body) - 1) }), errBadRecord},
		{"empty topic", mod(func(r *rawRecord) { r.topic = "" }), errBadRecord},
		{"empty property name", mod(func(r *rawRecord) { r.props = pairs("a", "1", "", "v") }), errBadRecord},
		{"property value overruns its block", mod(func(r *rawRecord) {
			r.props = append(pairs("a"), 0, 9, 'x')
		}), errBadRecord},
		{"property without a value", mod(func(r *rawRecord) { r.props = pairs("a") }), errBadRecord},
		{"property block of one byte", mod(func(r *rawRecord) { r.props = []byte{0} }), errBadRecord},
		{"empty index key", mod(func(r *rawRecord) { r.keys = keyBlock("order-1", "") }), errBadRecord},
		{"index key overruns its block", mod(func(r *rawRecord) { r.keys = append(keyBlock("order-1"), 0, 3, 'x') }), errBadRecord},
	}
	_, err := checkRecord(resealed(valid, func([]byte) {}))
	require.NoError(t, err, "resealing an unchanged record keeps it valid")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.NotPanics(t, func() {
				_, err := checkRecord(c.rec)
				require.ErrorIs(t, err, c.want)
				m, err := decodeRecord(c.rec, 1)
				require.ErrorIs(t, err, c.want)
				require.Nil(t, m)
			})
		})
	}
}

// TestHugeLengthCostsNothing: a length field of 0x7FFFFFFF (a zero-filled or
// garbage tail) is refused from the first 16 bytes, without allocating or
// reading anything near that size.
func TestHugeLengthCostsNothing(t *testing.T) {
	b := make([]byte, 16)
	binary.BigEndian.PutUint32(b[offMagic:], recordMagic)
	b[offVersion] = recordVersion
	binary.BigEndian.PutUint32(b[offLength:], 0x7FFFFFFF)
	_, err := checkRecord(b)
	require.ErrorIs(t, err, errBadRecord)

	// The error itself is allocated (fmt.Errorf): a handful of small
	// objects, never a buffer of the claimed size.
	allocs := testing.AllocsPerRun(100, func() { _, _ = checkRecord(b) })
	require.LessOrEqual(t, allocs, 8.0)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		_, _ = checkRecord(b)
		_, _ = decodeRecord(b, 1)
	}
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(256<<10), "bytes allocated by 200 rejections")

	// The length prefix alone is enough: recordLen needs only 12 bytes.
	n, err := recordLen(b[:offCRC])
	require.ErrorIs(t, err, errBadRecord)
	require.Zero(t, n)
}

func TestRecordRoundTrip(t *testing.T) {
	born := time.Unix(1_700_000_000, 123456789)
	deliver := time.Unix(1_700_000_060, 0)
	cases := []*core.Message{
		{Topic: "t"},
		{Topic: "%DLQ%orders", Body: []byte{}},
		{
			Topic:       "orders",
			ShardingKey: "dev-1",
			Tag:         "tagA",
			Keys:        []string{"order-1", "order-2", "order-1"},
			Properties:  map[string]string{"a": "1", "mqtt.qos": "1", "empty": ""},
			Body:        []byte("hello\x00world"),
			DeliverAt:   deliver,
			BornAt:      born,
		},
		{Topic: string(make([]byte, 255)), ShardingKey: string(make([]byte, 0xFFFF)), Body: make([]byte, 100_000), BornAt: born},
	}
	for i, in := range cases {
		n, err := encodedLen(in, 0xFFFF)
		require.NoError(t, err)
		// Records are appended after whatever the buffer already holds.
		prefix := []byte("previous record")
		in.ReconsumeCount = 3
		buf := appendRecord(append([]byte(nil), prefix...), in, n, time.Now().UnixNano())
		require.Equal(t, prefix, buf[:len(prefix)])
		rec := buf[len(prefix):]
		require.Len(t, rec, n)
		sealRecord(rec, 1<<40+int64(i), 42, born.Add(time.Second).UnixNano(), 17)

		// A record followed by more bytes (the next record) decodes alone.
		withNext := append(append([]byte(nil), rec...), newRaw().bytes()...)
		for _, b := range [][]byte{rec, withNext} {
			meta, err := checkRecord(b)
			require.NoError(t, err)
			require.Equal(t, n, meta.size)
			m, err := decodeRecord(b, 0x123456)
			require.NoError(t, err)
			require.Equal(t, in.Topic, m.Topic)
			require.Equal(t, in.ShardingKey, m.ShardingKey)
			require.Equal(t, in.Tag, m.Tag)
			require.Equal(t, in.Keys, m.Keys)
			if len(in.Properties) == 0 {
				require.Nil(t, m.Properties)
			} else {
				require.Equal(t, in.Properties, m.Properties)
			}
			require.Equal(t, len(in.Body), len(m.Body))
			if len(in.Body) > 0 {
				require.Equal(t, in.Body, m.Body)
			}
			require.Equal(t, len(m.Body), cap(m.Body), "body must not reach into the next record")
			require.Equal(t, in.DeliverAt.IsZero(), m.DeliverAt.IsZero())
			require.True(t, in.DeliverAt.Equal(m.DeliverAt) || in.DeliverAt.IsZero())
			if !in.BornAt.IsZero() {
				require.True(t, in.BornAt.Equal(m.BornAt))
			} else {
				require.WithinDuration(t, time.Now(), m.BornAt, time.Minute)
			}
			require.Equal(t, 1<<40+int64(i), m.CommitLogOffset)
			require.Equal(t, int64(42), m.QueueOffset)
			require.Equal(t, 17, m.Queue)
			require.Equal(t, 3, m.ReconsumeCount)
			require.Equal(t, n, m.Size)
			require.True(t, born.Add(time.Second).Equal(m.StoredAt))
			require.Equal(t, core.NewCommitLogID(0x123456, m.CommitLogOffset, n), m.ID)
			require.Equal(t, core.TagHash(in.Tag), meta.tagHash)
		}

		// Every single-byte truncation is refused as short, never decoded.
		for cut := 0; cut < n; cut += max(1, n/512) {
			_, err := checkRecord(rec[:cut])
			require.ErrorIs(t, err, errShort, "cut at %d of %d", cut, n)
		}
	}
}

// resealed returns a copy of rec changed by fn, with its checksum recomputed.
func resealed(rec []byte, fn func([]byte)) []byte {
	b := append([]byte(nil), rec...)
	fn(b)
	binary.BigEndian.PutUint32(b[offCRC:], recordCRC(b))
	return b
}
