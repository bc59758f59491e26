package jetstream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/wire"
)

// A message is stored as the payload of one JetStream message, without NATS
// headers: a 13-byte header (version, born at, reconsume count), then the
// core wire encoding of a produce request of one message. doc.go has the
// byte table and what protects a record.
const (
	recordVersion   = 1
	recordHeaderLen = 1 + 8 + 4
)

// ErrBadRecord is returned for a stored payload that is not a ferrymq
// message (another writer on our subjects, or damage).
var ErrBadRecord = errors.New("jetstream: malformed stored message")

// encodeRecord encodes m in one allocation (a body of megabytes is copied
// once).
func encodeRecord(m *core.Message, bornAt time.Time) ([]byte, error) {
	if m.ReconsumeCount < 0 {
		return nil, fmt.Errorf("%w: negative reconsume count", core.ErrInvalidMessage)
	}
	size := recordHeaderLen + 4 + 32 + len(m.Topic) + len(m.ShardingKey) + len(m.Tag) + len(m.Body)
	for _, k := range m.Keys {
		size += 2 + len(k)
	}
	for k, v := range m.Properties {
		size += 4 + len(k) + len(v)
	}
	b := make([]byte, recordHeaderLen, size)
	b[0] = recordVersion
	binary.BigEndian.PutUint64(b[1:9], uint64(bornAt.UnixNano()))
	binary.BigEndian.PutUint32(b[9:13], uint32(m.ReconsumeCount))
	b = binary.BigEndian.AppendUint32(b, 1) // a produce request of one message
	return wire.AppendMessage(b, m)
}

// decodeRecord parses a stored payload. The body aliases p.
func decodeRecord(p []byte) (core.Message, error) {
	if len(p) < recordHeaderLen {
		return core.Message{}, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrBadRecord, len(p), recordHeaderLen)
	}
	if p[0] != recordVersion {
		return core.Message{}, fmt.Errorf("%w: unknown format version %d", ErrBadRecord, p[0])
	}
	msgs, err := wire.DecodeProduce(p[recordHeaderLen:])
	if err != nil {
		return core.Message{}, fmt.Errorf("%w: %w", ErrBadRecord, err)
	}
	if len(msgs) != 1 {
		return core.Message{}, fmt.Errorf("%w: %d messages in one record", ErrBadRecord, len(msgs))
	}
	m := *msgs[0]
	if born := int64(binary.BigEndian.Uint64(p[1:9])); born != 0 {
		m.BornAt = time.Unix(0, born)
	}
	rc := binary.BigEndian.Uint32(p[9:13])
	if rc > 1<<20 {
		return core.Message{}, fmt.Errorf("%w: reconsume count %d", ErrBadRecord, rc)
	}
	m.ReconsumeCount = int(rc)
	return m, nil
}
