package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Outbound PUBLISH packets are encoded here, straight into the
// connection's write buffer (the hot path: one append per delivery, no
// intermediate packet). Control packets (CONNACK, SUBACK, acks with
// properties, DISCONNECT) go through mochi's packets codec.

// encodeBuf adapts a byte slice for mochi's encoders.
type encodeBuf struct {
	bb bytes.Buffer
	b  []byte
}

var controlBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func encodeControl(out *encodeBuf, pk *packets.Packet) error {
	bb := controlBufs.Get().(*bytes.Buffer)
	bb.Reset()
	defer controlBufs.Put(bb)
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connack:
		err = pk.ConnackEncode(bb)
	case packets.Puback:
		err = pk.PubackEncode(bb)
	case packets.Pubrec:
		err = pk.PubrecEncode(bb)
	case packets.Pubrel:
		pk.FixedHeader.Qos = 1
		err = pk.PubrelEncode(bb)
	case packets.Pubcomp:
		err = pk.PubcompEncode(bb)
	case packets.Suback:
		err = pk.SubackEncode(bb)
	case packets.Unsuback:
		err = pk.UnsubackEncode(bb)
	case packets.Pingresp:
		err = pk.PingrespEncode(bb)
	case packets.Disconnect:
		err = pk.DisconnectEncode(bb)
	default:
		err = fmt.Errorf("engine: no encoder for packet type %d", pk.FixedHeader.Type)
	}
	if err != nil {
		return err
	}
	out.b = append(out.b[:0], bb.Bytes()...)
	return nil
}

// appendAck appends a PUBACK/PUBREC/PUBREL/PUBCOMP without properties: the
// two-byte form when the reason is success (every version), the reason
// code too on MQTT 5 otherwise [MQTT-3.4.2-1].
func appendAck(b []byte, typ byte, pid uint16, code ReasonCode, v5 bool) []byte {
	first := typ << 4
	if typ == packets.Pubrel {
		first |= 0x02 // [MQTT-3.6.1-1]
	}
	if !v5 || code == Success {
		return append(b, first, 2, byte(pid>>8), byte(pid))
	}
	return append(b, first, 3, byte(pid>>8), byte(pid), byte(code))
}

// publishOut is what differs per receiver of a message.
type publishOut struct {
	qos    byte
	retain bool
	dup    bool
	pid    uint16
	subIDs []uint32
	// expiry: seconds left of the message's expiry interval; 0 for none.
	expiry uint32
	// alias: the topic alias sent with it (MQTT 5), 0 for none; aliasOnly:
	// the client knows the alias, the topic name is left out [MQTT-3.3.2-12].
	alias     uint16
	aliasOnly bool
}

// outAliases are the topic aliases the engine sets for one client, at
// most max (the smaller of the client's Topic Alias Maximum and the
// engine's): a topic gets the next free alias the first time it is sent,
// with its name; later sends carry the alias alone. Once all are given,
// other topics go by name. Guarded by the connection's write lock, so an
// alias is defined in the byte stream before it is used.
type outAliases struct {
	max     uint16
	byTopic map[string]uint16
}

// apply sets o's alias for topic [MQTT-3.3.2-10] [MQTT-3.3.2-11].
func (a *outAliases) apply(o *publishOut, topic string) {
	if n, ok := a.byTopic[topic]; ok {
		o.alias, o.aliasOnly = n, true
		return
	}
	if len(a.byTopic) >= int(a.max) {
		return
	}
	if a.byTopic == nil {
		a.byTopic = make(map[string]uint16, 1)
	}
	n := uint16(len(a.byTopic) + 1)
	a.byTopic[topic] = n
	o.alias = n
}

// aliasBytes is the most a topic alias adds to a PUBLISH (the property).
const aliasBytes = 3

// publishSize returns the encoded size of m sent with o (to an MQTT 5
// client if v5), for the Maximum Packet Size check [MQTT-3.1.2-24].
func publishSize(m *Message, o *publishOut, v5 bool) int {
	rem := 2 + len(m.Topic) + len(m.Payload)
	if o.qos > 0 {
		rem += 2
	}
	if v5 {
		p := propsSize(m, o)
		rem += varintLen(p) + p
	}
	return 1 + varintLen(rem) + rem
}

// appendPublish appends the PUBLISH of m as o says.
func appendPublish(b []byte, m *Message, o *publishOut, v5 bool) []byte {
	topic := m.Topic
	if o.aliasOnly {
		topic = ""
	}
	rem := 2 + len(topic) + len(m.Payload)
	if o.qos > 0 {
		rem += 2
	}
	props := 0
	if v5 {
		props = propsSize(m, o)
		rem += varintLen(props) + props
	}
	first := byte(packets.Publish<<4) | o.qos<<1
	if o.dup {
		first |= 0x08
	}
	if o.retain {
		first |= 0x01
	}
	b = append(b, first)
	b = appendVarint(b, rem)
	b = appendString(b, topic)
	if o.qos > 0 {
		b = append(b, byte(o.pid>>8), byte(o.pid))
	}
	if v5 {
		b = appendVarint(b, props)
		b = appendProps(b, m, o)
	}
	return append(b, m.Payload...)
}

// MQTT 5 property identifiers used in PUBLISH (§2.2.2.2).
const (
	propPayloadFormat   = 0x01
	propMessageExpiry   = 0x02
	propContentType     = 0x03
	propResponseTopic   = 0x08
	propCorrelationData = 0x09
	propSubscriptionID  = 0x0B
	propTopicAlias      = 0x23
	propUser            = 0x26
)

func propsSize(m *Message, o *publishOut) int {
	n := 0
	if o.alias > 0 {
		n += aliasBytes
	}
	if o.expiry > 0 {
		n += 5
	}
	for _, id := range o.subIDs {
		n += 1 + varintLen(int(id))
	}
	p := m.Props
	if p == nil {
		return n
	}
	if p.PayloadFormatSet {
		n += 2
	}
	if p.ContentType != "" {
		n += 3 + len(p.ContentType)
	}
	if p.ResponseTopic != "" {
		n += 3 + len(p.ResponseTopic)
	}
	if len(p.CorrelationData) > 0 {
		n += 3 + len(p.CorrelationData)
	}
	for _, u := range p.User {
		n += 5 + len(u.Key) + len(u.Value)
	}
	return n
}

func appendProps(b []byte, m *Message, o *publishOut) []byte {
	p := m.Props
	if p != nil && p.PayloadFormatSet {
		b = append(b, propPayloadFormat, p.PayloadFormat)
	}
	if o.expiry > 0 {
		b = append(b, propMessageExpiry)
		b = binary.BigEndian.AppendUint32(b, o.expiry)
	}
	if o.alias > 0 {
		b = append(b, propTopicAlias)
		b = binary.BigEndian.AppendUint16(b, o.alias)
	}
	if p != nil {
		if p.ContentType != "" {
			b = appendString(append(b, propContentType), p.ContentType)
		}
		if p.ResponseTopic != "" {
			b = appendString(append(b, propResponseTopic), p.ResponseTopic)
		}
		if len(p.CorrelationData) > 0 {
			b = appendBytes(append(b, propCorrelationData), p.CorrelationData)
		}
	}
	for _, id := range o.subIDs {
		b = appendVarint(append(b, propSubscriptionID), int(id))
	}
	if p != nil {
		for _, u := range p.User {
			b = appendString(append(b, propUser), u.Key)
			b = appendString(b, u.Value)
		}
	}
	return b
}

func appendVarint(b []byte, n int) []byte {
	for {
		d := byte(n & 0x7F)
		n >>= 7
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

func varintLen(n int) int {
	switch {
	case n < 128:
		return 1
	case n < 16384:
		return 2
	case n < 2097152:
		return 3
	default:
		return 4
	}
}

func appendString(b []byte, s string) []byte {
	b = append(b, byte(len(s)>>8), byte(len(s)))
	return append(b, s...)
}

func appendBytes(b []byte, s []byte) []byte {
	b = append(b, byte(len(s)>>8), byte(len(s)))
	return append(b, s...)
}

var outBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func getOutBuf() []byte { return (*outBufs.Get().(*[]byte))[:0] }

func putOutBuf(b []byte) {
	if cap(b) <= 64<<10 {
		b = b[:0]
		outBufs.Put(&b)
	}
}
