package session

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// Record values: the same bytes in the log and in the bucket. Every value
// starts with the value format version; integers are big-endian; a string
// or binary field is its u16 length then its bytes (MQTT's own bound), a
// payload its u32 length then its bytes. The layouts are in doc.go; these
// constants are part of the format.
const (
	valueVersion = 1

	// maxPayload bounds a stored payload: the engine's largest packet.
	maxPayload = 256 << 20
	// maxSubID is the largest MQTT 5 subscription identifier.
	maxSubID = 268435455

	// Message body flags.
	msgQoSMask = 0x03
	msgRetain  = 0x04
	msgProps   = 0x08
	msgFlags   = msgQoSMask | msgRetain | msgProps

	// Property flags.
	propFormatSet = 0x01

	// Client value flags.
	clientWill = 0x01
	// clientNew marks the first client record of a session: whatever the
	// log or bucket still holds of that client ID from before is dead (a
	// damaged or lost delete does not bring an old session back).
	clientNew   = 0x02
	clientFlags = clientWill | clientNew

	// Subscription options: the MQTT 5 subscription options byte.
	subQoSMask   = 0x03
	subNoLocal   = 0x04
	subRAP       = 0x08
	subRHShift   = 4
	subRHMask    = 0x30
	subOptsValid = subQoSMask | subNoLocal | subRAP | subRHMask
)

// writer appends a value's fields; err is the first field that did not fit.
type writer struct {
	b   []byte
	err error
}

func (w *writer) u8(v byte)    { w.b = append(w.b, v) }
func (w *writer) u16(v uint16) { w.b = binary.BigEndian.AppendUint16(w.b, v) }
func (w *writer) u32(v uint32) { w.b = binary.BigEndian.AppendUint32(w.b, v) }
func (w *writer) u64(v uint64) { w.b = binary.BigEndian.AppendUint64(w.b, v) }

func (w *writer) str(field, s string) {
	if len(s) > 0xFFFF {
		w.fail(fmt.Errorf("%w: %s of %d bytes, at most 65535", ErrValueTooLarge, field, len(s)))
		return
	}
	w.u16(uint16(len(s)))
	w.b = append(w.b, s...)
}

func (w *writer) bin(field string, b []byte) {
	if len(b) > 0xFFFF {
		w.fail(fmt.Errorf("%w: %s of %d bytes, at most 65535", ErrValueTooLarge, field, len(b)))
		return
	}
	w.u16(uint16(len(b)))
	w.b = append(w.b, b...)
}

func (w *writer) fail(err error) {
	if w.err == nil {
		w.err = err
	}
}

// reader reads a value's fields, checking every length before slicing; the
// first field that does not fit sets err and every later read returns zero.
// What it returns is copied: nothing aliases the input.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("%w: %s needs %d bytes, %d left", ErrBadValue, what, n, len(r.b))
		return nil
	}
	b := r.b[:n]
	r.b = r.b[n:]
	return b
}

func (r *reader) u8(what string) byte {
	if b := r.take(1, what); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16(what string) uint16 {
	if b := r.take(2, what); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32(what string) uint32 {
	if b := r.take(4, what); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64(what string) uint64 {
	if b := r.take(8, what); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) str(what string) string {
	n := int(r.u16(what + " length"))
	return string(r.take(n, what))
}

func (r *reader) bin(what string) []byte {
	n := int(r.u16(what + " length"))
	b := r.take(n, what)
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

func (r *reader) bad(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{ErrBadValue}, args...)...)
	}
}

// version reads and checks the leading version byte.
func (r *reader) version(what string) {
	if len(r.b) == 0 {
		r.bad("empty %s value", what)
		return
	}
	if v := r.u8("version"); v != valueVersion {
		if r.err == nil {
			r.err = fmt.Errorf("%w: %s value version %d, this build reads %d", ErrVersion, what, v, valueVersion)
		}
	}
}

// done reports the first error, or trailing bytes.
func (r *reader) done(what string) error {
	if r.err == nil && len(r.b) > 0 {
		r.bad("%d bytes after the %s value", len(r.b), what)
	}
	return r.err
}

// appendMessage appends the message body (doc.go).
func (w *writer) message(m *engine.Message) {
	if m.QoS > 2 {
		w.fail(fmt.Errorf("%w: QoS %d", ErrBadValue, m.QoS))
		return
	}
	flags := m.QoS
	if m.Retain {
		flags |= msgRetain
	}
	if m.Props != nil {
		flags |= msgProps
	}
	w.u8(flags)
	w.u64(uint64(m.Created))
	w.u64(uint64(m.Expiry))
	w.str("topic", m.Topic)
	w.str("origin", m.Origin)
	w.str("ref", m.Ref)
	if len(m.Payload) > maxPayload {
		w.fail(fmt.Errorf("%w: payload of %d bytes, at most %d", ErrValueTooLarge, len(m.Payload), maxPayload))
		return
	}
	w.u32(uint32(len(m.Payload)))
	w.b = append(w.b, m.Payload...)
	if p := m.Props; p != nil {
		var pf byte
		if p.PayloadFormatSet {
			pf = propFormatSet
		}
		w.u8(pf)
		w.u8(p.PayloadFormat)
		w.str("content type", p.ContentType)
		w.str("response topic", p.ResponseTopic)
		w.bin("correlation data", p.CorrelationData)
		if len(p.User) > 0xFFFF {
			w.fail(fmt.Errorf("%w: %d user properties", ErrValueTooLarge, len(p.User)))
			return
		}
		w.u16(uint16(len(p.User)))
		for _, u := range p.User {
			w.str("user property", u.Key)
			w.str("user property", u.Value)
		}
	}
}

// message reads a message body.
func (r *reader) message() *engine.Message {
	flags := r.u8("message flags")
	m := &engine.Message{QoS: flags & msgQoSMask, Retain: flags&msgRetain != 0}
	switch {
	case flags&^msgFlags != 0:
		r.bad("message flags %#02x", flags)
	case m.QoS > 2:
		r.bad("message QoS 3")
	}
	m.Created = int64(r.u64("created"))
	m.Expiry = int64(r.u64("expiry"))
	if m.Expiry < 0 {
		r.bad("negative expiry")
	}
	m.Topic = r.str("topic")
	if r.err == nil && m.Topic == "" {
		r.bad("empty topic")
	}
	m.Origin = r.str("origin")
	m.Ref = r.str("ref")
	n := r.u32("payload length")
	if n > maxPayload {
		r.bad("payload of %d bytes, at most %d", n, maxPayload)
	}
	if b := r.take(int(n), "payload"); len(b) > 0 {
		m.Payload = append([]byte(nil), b...)
	}
	if flags&msgProps != 0 {
		p := &engine.Props{}
		pf := r.u8("property flags")
		if pf&^propFormatSet != 0 {
			r.bad("property flags %#02x", pf)
		}
		p.PayloadFormatSet = pf&propFormatSet != 0
		p.PayloadFormat = r.u8("payload format")
		if p.PayloadFormat > 1 || (!p.PayloadFormatSet && p.PayloadFormat != 0) {
			r.bad("payload format indicator %d", p.PayloadFormat)
		}
		p.ContentType = r.str("content type")
		p.ResponseTopic = r.str("response topic")
		p.CorrelationData = r.bin("correlation data")
		k := int(r.u16("user property count"))
		if k > len(r.b)/4 {
			r.bad("%d user properties in %d bytes", k, len(r.b))
			k = 0
		}
		for range k {
			key := r.str("user property")
			value := r.str("user property")
			if r.err != nil {
				break
			}
			p.User = append(p.User, engine.UserProperty{Key: key, Value: value})
		}
		m.Props = p
	}
	if r.err != nil {
		return nil
	}
	return m
}

// encodeClient encodes a client record; fresh marks the first record of a
// session.
func encodeClient(c *engine.ClientRecord, fresh bool) ([]byte, error) {
	w := writer{b: make([]byte, 0, 16+len(c.Username))}
	w.u8(valueVersion)
	var flags byte
	if c.Will != nil {
		flags |= clientWill
	}
	if fresh {
		flags |= clientNew
	}
	w.u8(flags)
	w.u8(c.Protocol)
	w.u32(c.Expiry)
	w.str("username", c.Username)
	if c.Will != nil {
		w.u32(c.WillDelay)
		w.u32(c.WillExpiry)
		w.message(c.Will)
	}
	return w.b, w.err
}

// freshClient reports whether a client value marks a new session; it reads
// only the flags byte (replay does not decode values).
func freshClient(v []byte) bool { return len(v) >= 2 && v[1]&clientNew != 0 }

// decodeClient decodes the client record of client id.
func decodeClient(id string, b []byte) (engine.ClientRecord, error) {
	r := reader{b: b}
	r.version("client")
	flags := r.u8("client flags")
	if flags&^clientFlags != 0 {
		r.bad("client flags %#02x", flags)
	}
	c := engine.ClientRecord{ID: id}
	c.Protocol = r.u8("protocol")
	if r.err == nil && (c.Protocol < 3 || c.Protocol > 5) {
		r.bad("protocol level %d", c.Protocol)
	}
	c.Expiry = r.u32("session expiry")
	c.Username = r.str("username")
	if flags&clientWill != 0 {
		c.WillDelay = r.u32("will delay")
		c.WillExpiry = r.u32("will expiry")
		c.Will = r.message()
	}
	if err := r.done("client"); err != nil {
		return engine.ClientRecord{}, err
	}
	return c, nil
}

func encodeSub(filter string, o topictree.Options) ([]byte, error) {
	w := writer{b: make([]byte, 0, 8+len(filter))}
	if o.QoS > 2 || o.RetainHandling > 2 || o.Identifier > maxSubID {
		return nil, fmt.Errorf("%w: subscription QoS %d, retain handling %d, identifier %d", ErrBadValue,
			o.QoS, o.RetainHandling, o.Identifier)
	}
	w.u8(valueVersion)
	opts := o.QoS | o.RetainHandling<<subRHShift
	if o.NoLocal {
		opts |= subNoLocal
	}
	if o.RetainAsPublished {
		opts |= subRAP
	}
	w.u8(opts)
	w.u32(o.Identifier)
	w.str("filter", filter)
	return w.b, w.err
}

func decodeSub(b []byte) (string, topictree.Options, error) {
	r := reader{b: b}
	r.version("subscription")
	opts := r.u8("subscription options")
	o := topictree.Options{QoS: opts & subQoSMask, NoLocal: opts&subNoLocal != 0, RetainAsPublished: opts&subRAP != 0,
		RetainHandling: (opts & subRHMask) >> subRHShift}
	switch {
	case opts&^subOptsValid != 0:
		r.bad("subscription options %#02x", opts)
	case o.QoS > 2:
		r.bad("subscription QoS 3")
	case o.RetainHandling > 2:
		r.bad("retain handling 3")
	}
	o.Identifier = r.u32("subscription identifier")
	if o.Identifier > maxSubID {
		r.bad("subscription identifier %d", o.Identifier)
	}
	filter := r.str("filter")
	if r.err == nil && filter == "" {
		r.bad("empty filter")
	}
	if err := r.done("subscription"); err != nil {
		return "", topictree.Options{}, err
	}
	return filter, o, nil
}

// encodeMessage encodes an outbound message of a session.
func encodeMessage(m *engine.Message, subIDs []uint32) ([]byte, error) {
	w := writer{b: make([]byte, 0, 64+len(m.Topic)+len(m.Payload)+4*len(subIDs))}
	w.u8(valueVersion)
	if len(subIDs) > 0xFFFF {
		return nil, fmt.Errorf("%w: %d subscription identifiers", ErrValueTooLarge, len(subIDs))
	}
	w.u16(uint16(len(subIDs)))
	for _, id := range subIDs {
		w.u32(id)
	}
	w.message(m)
	return w.b, w.err
}

func decodeMessage(b []byte) (*engine.Message, []uint32, error) {
	r := reader{b: b}
	r.version("message")
	k := int(r.u16("subscription identifier count"))
	if k > len(r.b)/4 {
		r.bad("%d subscription identifiers in %d bytes", k, len(r.b))
		k = 0
	}
	var ids []uint32
	for range k {
		id := r.u32("subscription identifier")
		if id == 0 || id > maxSubID {
			r.bad("subscription identifier %d", id)
			break
		}
		ids = append(ids, id)
	}
	m := r.message()
	if err := r.done("message"); err != nil {
		return nil, nil, err
	}
	return m, ids, nil
}

func encodeRetained(m *engine.Message) ([]byte, error) {
	if len(m.Payload) == 0 {
		return nil, fmt.Errorf("%w: retained message without payload", ErrBadValue)
	}
	w := writer{b: make([]byte, 0, 64+len(m.Topic)+len(m.Payload))}
	w.u8(valueVersion)
	w.message(m)
	return w.b, w.err
}

func decodeRetained(b []byte) (*engine.Message, error) {
	r := reader{b: b}
	r.version("retained")
	m := r.message()
	if r.err == nil && len(m.Payload) == 0 {
		r.bad("retained message without payload")
	}
	if err := r.done("retained"); err != nil {
		return nil, err
	}
	return m, nil
}

func encodeOffline(since time.Time) []byte {
	w := writer{b: make([]byte, 0, 9)}
	w.u8(valueVersion)
	w.u64(uint64(max(since.UnixNano(), 0)))
	return w.b
}

func decodeOffline(b []byte) (time.Time, error) {
	r := reader{b: b}
	r.version("offline")
	ns := int64(r.u64("offline since"))
	if ns < 0 {
		r.bad("offline since %d", ns)
	}
	if err := r.done("offline"); err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, ns), nil
}

// A marker (a PUBREC received; an inbound QoS 2 packet ID answered PUBREC)
// is the version byte alone: its key says everything.
var markerValue = []byte{valueVersion}

// encodeInbound is the value of an inbound QoS 2 packet ID taken and not
// yet answered: the version and the QoS2ID of its publish (never 0).
func encodeInbound(id uint64) []byte {
	w := writer{b: make([]byte, 0, 9)}
	w.u8(valueVersion)
	w.u64(id)
	return w.b
}

// decodeInbound reads an inbound QoS 2 value: its QoS2ID, or 0 for a bare
// marker (answered).
func decodeInbound(b []byte) (uint64, error) {
	r := reader{b: b}
	r.version("inbound")
	if r.err == nil && len(r.b) == 0 {
		return 0, nil
	}
	id := r.u64("qos2 id")
	if r.err == nil && id == 0 {
		r.bad("qos2 id 0")
	}
	if err := r.done("inbound"); err != nil {
		return 0, err
	}
	return id, nil
}

func decodeMarker(b []byte) error {
	r := reader{b: b}
	r.version("marker")
	return r.done("marker")
}
