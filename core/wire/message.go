package wire

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// Binary encodings of the payloads that carry messages. All integers are
// big-endian; times are unix nanoseconds (0 = unset).
//
// Message (as produced):
//
//	u8   topic length, topic
//	u16  sharding key length, key
//	u16  tag length, tag
//	u16  index key count, then per key: u16 length, bytes
//	u16  property count, then per property: u16 name length, name, u16 value length, value
//	i64  deliver-at
//	u32  body length, body
//
// Stored message: id (16 bytes), u32 queue, i64 queue offset, i64 born at,
// i64 stored at, u32 reconsume count, then the message as above.
//
// OpProduce request: u32 count, then count messages. Response: u32 count,
// then per message: id (16), u32 queue, i64 queue offset, i64 stored at.
//
// Pull result (OpPull, OpGroupPull): i64 next offset, i64 start offset,
// i64 queue min, i64 queue max, u8 flags (0x01 reset, 0x02 clamped), u32
// count, stored messages.
//
// OpGet and OpFindByKey responses: u32 count, stored messages.
//
// OpPop response: u32 count, then per message: stored message, u16 handle
// length, handle, u32 attempt.

// OpTxnHalf request: u8 group length, group, then one message. Response: as
// OpProduce's, with one result.
//
// OpCheckTxn push: as an OpGet response, with one stored message (the half
// message, its real topic in property txn.topic, its group in txn.group).

// MaxBatch bounds the number of messages in one payload.
const MaxBatch = 4096

// AppendMessage appends m's encoding.
func AppendMessage(b []byte, m *core.Message) ([]byte, error) {
	if len(m.Topic) > 255 || len(m.ShardingKey) > 0xFFFF || len(m.Tag) > 0xFFFF || len(m.Keys) > 0xFFFF || len(m.Properties) > 0xFFFF {
		return b, fmt.Errorf("%w: a field of the message is too long to encode", core.ErrInvalidMessage)
	}
	b = append(b, byte(len(m.Topic)))
	b = append(b, m.Topic...)
	b = appendStr16(b, m.ShardingKey)
	b = appendStr16(b, m.Tag)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Keys)))
	for _, k := range m.Keys {
		if len(k) > 0xFFFF {
			return b, fmt.Errorf("%w: key too long", core.ErrInvalidMessage)
		}
		b = appendStr16(b, k)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Properties)))
	for k, v := range m.Properties {
		if len(k) > 0xFFFF || len(v) > 0xFFFF {
			return b, fmt.Errorf("%w: property too long", core.ErrPropertiesTooLarge)
		}
		b = appendStr16(b, k)
		b = appendStr16(b, v)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(m.DeliverAt)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.Body)))
	return append(b, m.Body...), nil
}

func appendStr16(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// EncodeProduce is the payload of an OpProduce request.
func EncodeProduce(msgs []*core.Message) ([]byte, error) {
	if len(msgs) == 0 || len(msgs) > MaxBatch {
		return nil, fmt.Errorf("%w: batch of %d messages, want 1 to %d", core.ErrInvalidMessage, len(msgs), MaxBatch)
	}
	size := 4
	for _, m := range msgs {
		size += 32 + len(m.Topic) + len(m.ShardingKey) + len(m.Tag) + len(m.Body)
	}
	b := binary.BigEndian.AppendUint32(make([]byte, 0, size), uint32(len(msgs)))
	var err error
	for _, m := range msgs {
		if b, err = AppendMessage(b, m); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// DecodeProduce parses an OpProduce request. Message bodies alias p.
func DecodeProduce(p []byte) ([]*core.Message, error) {
	r := reader{b: p}
	n := int(r.u32())
	if r.err == nil && (n < 1 || n > MaxBatch) {
		return nil, fmt.Errorf("%w: batch of %d messages, want 1 to %d", ErrBadPayload, n, MaxBatch)
	}
	msgs := make([]*core.Message, 0, min(n, 64))
	for i := 0; i < n && r.err == nil; i++ {
		m := &core.Message{}
		r.message(m)
		msgs = append(msgs, m)
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	return msgs, nil
}

// EncodeSendResults is the payload of an OpProduce response.
func EncodeSendResults(res []core.SendResult) []byte {
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(res)*36), uint32(len(res)))
	for _, r := range res {
		b = append(b, r.ID[:]...)
		b = binary.BigEndian.AppendUint32(b, uint32(r.Queue))
		b = binary.BigEndian.AppendUint64(b, uint64(r.QueueOffset))
		b = binary.BigEndian.AppendUint64(b, uint64(unixNano(r.StoredAt)))
	}
	return b
}

// DecodeSendResults parses an OpProduce response; topics are filled in from
// the request by the caller.
func DecodeSendResults(p []byte) ([]core.SendResult, error) {
	r := reader{b: p}
	n := int(r.u32())
	if r.err == nil && n > MaxBatch {
		return nil, fmt.Errorf("%w: %d results", ErrBadPayload, n)
	}
	out := make([]core.SendResult, 0, min(n, 64))
	for i := 0; i < n && r.err == nil; i++ {
		var s core.SendResult
		copy(s.ID[:], r.bytes(16))
		s.Queue = int(int32(r.u32())) // -1: not placed yet (a delayed or half message)
		s.QueueOffset = int64(r.u64())
		s.StoredAt = fromNano(int64(r.u64()))
		s.CommitLogOffset = s.ID.Offset()
		out = append(out, s)
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	return out, nil
}

// AppendStored appends a stored message's encoding.
func AppendStored(b []byte, m *core.StoredMessage) ([]byte, error) {
	b = append(b, m.ID[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(m.Queue))
	b = binary.BigEndian.AppendUint64(b, uint64(m.QueueOffset))
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(m.BornAt)))
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(m.StoredAt)))
	b = binary.BigEndian.AppendUint32(b, uint32(max(0, m.ReconsumeCount)))
	return AppendMessage(b, &m.Message)
}

// EncodeStored is the payload of OpGet and OpFindByKey responses.
func EncodeStored(msgs []*core.StoredMessage) ([]byte, error) {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(msgs)))
	var err error
	for _, m := range msgs {
		if b, err = AppendStored(b, m); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// DecodeStored parses OpGet and OpFindByKey responses. Bodies alias p.
func DecodeStored(p []byte) ([]*core.StoredMessage, error) {
	r := reader{b: p}
	msgs := r.storedList()
	if err := r.done(); err != nil {
		return nil, err
	}
	return msgs, nil
}

// PullResult is the decoded payload of a pull response.
type PullResult struct {
	NextOffset, Offset int64
	Range              core.QueueRange
	Reset, Clamped     bool
	Messages           []*core.StoredMessage
}

// EncodePull is the payload of OpPull and OpGroupPull responses.
func EncodePull(res PullResult) ([]byte, error) {
	// Sized for the messages at once: a backlog's answers are megabytes,
	// and growing one by doubling copied it twice more.
	return AppendPull(make([]byte, 0, PullSize(res)), res)
}

// PullSize bounds the bytes EncodePull writes for res (an estimate from
// above, for sizing a buffer once).
func PullSize(res PullResult) int {
	hint := 64
	for _, m := range res.Messages {
		hint += 128 + max(m.Size, len(m.Body)+len(m.Topic)+len(m.ShardingKey)+len(m.Tag))
	}
	return hint
}

// AppendPull appends the encoding of res to b (EncodePull's).
func AppendPull(b []byte, res PullResult) ([]byte, error) {
	b = binary.BigEndian.AppendUint64(b, uint64(res.NextOffset))
	b = binary.BigEndian.AppendUint64(b, uint64(res.Offset))
	b = binary.BigEndian.AppendUint64(b, uint64(res.Range.Min))
	b = binary.BigEndian.AppendUint64(b, uint64(res.Range.Max))
	var flags byte
	if res.Reset {
		flags |= 1
	}
	if res.Clamped {
		flags |= 2
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint32(b, uint32(len(res.Messages)))
	var err error
	for _, m := range res.Messages {
		if b, err = AppendStored(b, m); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// DecodePull parses a pull response. Bodies alias p.
func DecodePull(p []byte) (PullResult, error) {
	r := reader{b: p}
	var res PullResult
	res.NextOffset = int64(r.u64())
	res.Offset = int64(r.u64())
	res.Range.Min = int64(r.u64())
	res.Range.Max = int64(r.u64())
	flags := r.u8()
	res.Reset, res.Clamped = flags&1 != 0, flags&2 != 0
	res.Messages = r.storedList()
	if err := r.done(); err != nil {
		return PullResult{}, err
	}
	return res, nil
}

// Popped is one message of a pop response.
type Popped struct {
	Message *core.StoredMessage
	Handle  string
	Attempt int
}

// EncodePopped is the payload of an OpPop response.
func EncodePopped(ps []Popped) ([]byte, error) {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(ps)))
	var err error
	for _, p := range ps {
		if b, err = AppendStored(b, p.Message); err != nil {
			return nil, err
		}
		if len(p.Handle) > 0xFFFF {
			return nil, fmt.Errorf("%w: handle too long", ErrBadPayload)
		}
		b = appendStr16(b, p.Handle)
		b = binary.BigEndian.AppendUint32(b, uint32(p.Attempt))
	}
	return b, nil
}

// DecodePopped parses an OpPop response. Bodies alias p.
func DecodePopped(p []byte) ([]Popped, error) {
	r := reader{b: p}
	n := int(r.u32())
	if r.err == nil && n > MaxBatch {
		return nil, fmt.Errorf("%w: %d messages", ErrBadPayload, n)
	}
	var out []Popped
	for i := 0; i < n && r.err == nil; i++ {
		m := r.stored()
		h := string(r.str16())
		a := int(r.u32())
		out = append(out, Popped{Message: m, Handle: h, Attempt: a})
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	return out, nil
}

// reader decodes with bounds checks; after the first failure every read
// returns zero values and err keeps the failure.
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
		r.err = fmt.Errorf("%w: %d bytes needed at %d, payload has %d", ErrBadPayload, n, r.p, len(r.b))
		return false
	}
	return true
}

func (r *reader) bytes(n int) []byte {
	if !r.need(n) {
		return nil
	}
	v := r.b[r.p : r.p+n : r.p+n]
	r.p += n
	return v
}

func (r *reader) u8() byte {
	if b := r.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.bytes(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.bytes(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.bytes(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) str16() []byte { return r.bytes(int(r.u16())) }

func (r *reader) message(m *core.Message) {
	m.Topic = string(r.bytes(int(r.u8())))
	m.ShardingKey = string(r.str16())
	m.Tag = string(r.str16())
	if n := int(r.u16()); n > 0 {
		m.Keys = make([]string, 0, min(n, 16))
		for i := 0; i < n && r.err == nil; i++ {
			m.Keys = append(m.Keys, string(r.str16()))
		}
	}
	if n := int(r.u16()); n > 0 {
		m.Properties = make(map[string]string, min(n, 16))
		for i := 0; i < n && r.err == nil; i++ {
			k := string(r.str16())
			m.Properties[k] = string(r.str16())
		}
	}
	m.DeliverAt = fromNano(int64(r.u64()))
	m.Body = r.bytes(int(r.u32())) // aliases the payload, which the caller owns
}

func (r *reader) stored() *core.StoredMessage {
	m := &core.StoredMessage{}
	copy(m.ID[:], r.bytes(16))
	m.Queue = int(r.u32())
	m.QueueOffset = int64(r.u64())
	m.BornAt = fromNano(int64(r.u64()))
	m.StoredAt = fromNano(int64(r.u64()))
	m.ReconsumeCount = int(r.u32())
	r.message(&m.Message)
	m.CommitLogOffset = m.ID.Offset()
	m.Size = m.ID.Size()
	return m
}

func (r *reader) storedList() []*core.StoredMessage {
	n := int(r.u32())
	if r.err == nil && n > MaxBatch {
		r.err = fmt.Errorf("%w: %d messages", ErrBadPayload, n)
		return nil
	}
	var out []*core.StoredMessage
	for i := 0; i < n && r.err == nil; i++ {
		out = append(out, r.stored())
	}
	return out
}

func (r *reader) done() error {
	if r.err != nil {
		return r.err
	}
	if r.p != len(r.b) {
		return fmt.Errorf("%w: %d trailing bytes", ErrBadPayload, len(r.b)-r.p)
	}
	return nil
}

// EncodeTxnHalf is the payload of an OpTxnHalf request.
func EncodeTxnHalf(group string, m *core.Message) ([]byte, error) {
	if len(group) == 0 || len(group) > 255 {
		return nil, fmt.Errorf("%w: producer group must be 1–255 bytes", core.ErrInvalidMessage)
	}
	b := append(make([]byte, 0, 64+len(m.Body)), byte(len(group)))
	b = append(b, group...)
	return AppendMessage(b, m)
}

// DecodeTxnHalf parses an OpTxnHalf request.
func DecodeTxnHalf(p []byte) (string, *core.Message, error) {
	r := reader{b: p}
	group := string(r.bytes(int(r.u8())))
	m := &core.Message{}
	r.message(m)
	if err := r.done(); err != nil {
		return "", nil, err
	}
	if group == "" {
		return "", nil, fmt.Errorf("%w: empty producer group", ErrBadPayload)
	}
	return group, m, nil
}

// EncodeQuery is the payload of an OpQuery response.
func EncodeQuery(next string, msgs []*core.StoredMessage) ([]byte, error) {
	if len(next) > 0xFFFF {
		return nil, fmt.Errorf("%w: cursor too long", ErrBadPayload)
	}
	b := appendStr16(nil, next)
	p, err := EncodeStored(msgs)
	if err != nil {
		return nil, err
	}
	return append(b, p...), nil
}

// DecodeQuery parses an OpQuery response. Bodies alias p.
func DecodeQuery(p []byte) (string, []*core.StoredMessage, error) {
	r := reader{b: p}
	next := string(r.str16())
	if r.err != nil {
		return "", nil, r.err
	}
	msgs, err := DecodeStored(p[r.p:])
	return next, msgs, err
}
