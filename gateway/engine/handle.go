package engine

import (
	"github.com/mochi-mqtt/server/v2/packets"
)

// handle handles one whole packet: first is its first byte, body what
// follows the fixed header. An error ends the connection (protocolFailure).
func (c *conn) handle(first byte, body []byte) error {
	typ := first >> 4
	c.e.m.packetsIn.Add(1)
	if c.state == stAwaitConnect {
		if typ != packets.Connect {
			return violation("[MQTT-3.1.0-1]", "first packet is %s, not CONNECT", packetName(typ))
		}
		return c.handleConnect(first, body)
	}
	if c.lingering.Load() {
		return nil // after a terminal packet: read and discard [MQTT-4.13.2-1]
	}
	switch typ {
	case packets.Publish:
		return c.handlePublish(first, body)
	case packets.Puback, packets.Pubrec, packets.Pubcomp:
		return c.handleAck(first, typ, body)
	case packets.Pubrel:
		return c.handlePubrel(first, body)
	case packets.Subscribe:
		return c.handleSubscribe(first, body)
	case packets.Unsubscribe:
		return c.handleUnsubscribe(first, body)
	case packets.Pingreq:
		if first&0x0F != 0 || len(body) != 0 {
			// Reserved flags (MQTT 5 [MQTT-2.1.3-1], 3.1.1 [MQTT-2.2.2-2]) or a
			// remaining length other than 0 (§3.12.1).
			return malformed("§3.12.1", "PINGREQ with flags or a body")
		}
		c.queueBytes([]byte{packets.Pingresp << 4, 0}, false) // [MQTT-3.12.4-1]
		return nil
	case packets.Disconnect:
		return c.handleDisconnect(first, body)
	case packets.Connect:
		// A protocol error, answered DISCONNECT 0x82 and never a second
		// CONNACK [MQTT-3.2.0-2].
		return violation("[MQTT-3.1.0-2]", "a second CONNECT")
	case packets.Auth:
		if c.version != 5 {
			return malformed("§2.2.1", "AUTH is not an MQTT 3 packet") // type 15 is reserved in 3.1.1
		}
		if first&0x0F != 0 {
			return malformed("[MQTT-3.15.1-1]", "reserved flags of AUTH set")
		}
		// No enhanced authentication was negotiated (a CONNECT with an
		// Authentication Method is refused [MQTT-4.12.0-1]), so the client
		// must not send AUTH [MQTT-4.12.0-7]: a protocol error.
		return violation("[MQTT-4.12.0-7]", "AUTH without an authentication method")
	default:
		// Reserved (0), or a server-to-client packet (CONNACK, SUBACK,
		// UNSUBACK, PINGRESP) sent by a client.
		return malformed("§2.1.2", "packet type %s from a client", packetName(typ))
	}
}

func packetName(typ byte) string {
	if n, ok := packets.PacketNames[typ]; ok {
		return n
	}
	return "unknown"
}

// decodeHeader fills pk's fixed header from the first byte and checks its
// flags: reserved ones (MQTT 5 [MQTT-2.1.3-1], 3.1.1 [MQTT-2.2.2-2]), DUP
// on QoS 0 [MQTT-3.3.1-2], QoS 3 [MQTT-3.3.1-4].
func decodeHeader(pk *packets.Packet, first byte, remaining int) error {
	if err := pk.FixedHeader.Decode(first); err != nil {
		switch err {
		case packets.ErrProtocolViolationQosOutOfRange:
			return malformed("[MQTT-3.3.1-4]", "PUBLISH with QoS 3")
		case packets.ErrProtocolViolationDupNoQos:
			return malformed("[MQTT-3.3.1-2]", "DUP set on a QoS 0 PUBLISH")
		default:
			return malformed("[MQTT-2.1.3-1]", "reserved flags of %s set", packetName(first>>4))
		}
	}
	pk.FixedHeader.Remaining = remaining
	return nil
}

// ownBody copies a packet body that mochi's decoder will alias (its strings
// point into the buffer they were decoded from, and ours is reused): one
// allocation per decoded packet, which the packet's strings and payload
// then share.
func ownBody(body []byte) []byte {
	b := make([]byte, len(body))
	copy(b, body)
	return b
}

// decodeError turns a mochi decode error into ours.
func decodeError(typ byte, err error) error {
	if code, ok := err.(packets.Code); ok && code.Code == packets.ErrProtocolViolation.Code {
		return violation("", "%s: %s", packetName(typ), code.Reason)
	}
	return malformed("", "%s: %v", packetName(typ), err)
}

// handleAck handles PUBACK, PUBREC and PUBCOMP for messages we sent.
func (c *conn) handleAck(first, typ byte, body []byte) error {
	if first&0x0F != 0 {
		return malformed("[MQTT-2.1.3-1]", "reserved flags of %s set", packetName(typ))
	}
	pid, code, err := parseAck(body, c.version)
	if err != nil {
		return err
	}
	if pid == 0 {
		return violation("§2.2.1", "%s with packet identifier 0", packetName(typ))
	}
	if !validAckCode(typ, code) {
		spec := map[byte]string{packets.Puback: "[MQTT-3.4.2-1]", packets.Pubrec: "[MQTT-3.5.2-1]", packets.Pubcomp: "[MQTT-3.7.2-1]"}[typ]
		return violation(spec, "%s with reason code %#02x", packetName(typ), byte(code))
	}
	s := c.sess
	found := c.e.acked(s, pid, typ, code)
	if typ == packets.Pubrec {
		// PUBREL follows a PUBREC whether or not we know the ID (MQTT 5 says
		// which) [MQTT-4.3.3-3] [MQTT-4.3.3-4].
		rc := Success
		if !found {
			rc = PacketIDNotFound
		}
		if found || c.version == 5 {
			if code < 0x80 {
				c.queueBytes(appendAck(nil, packets.Pubrel, pid, rc, c.version == 5), false)
			}
		}
	}
	return nil
}

// handlePubrel ends an inbound QoS 2 flow: the message was delivered at
// PUBLISH; now PUBCOMP [MQTT-4.3.3-11].
func (c *conn) handlePubrel(first byte, body []byte) error {
	if first&0x0F != 0x02 {
		return malformed("[MQTT-3.6.1-1]", "PUBREL flags %#x, must be 0x2", first&0x0F)
	}
	pid, code, err := parseAck(body, c.version)
	if err != nil {
		return err
	}
	if pid == 0 {
		return violation("§2.2.1", "PUBREL with packet identifier 0")
	}
	if !validAckCode(packets.Pubrel, code) {
		return violation("[MQTT-3.6.2-1]", "PUBREL with reason code %#02x", byte(code))
	}
	found := c.releaseInbound(pid)
	rc := Success
	if !found {
		rc = PacketIDNotFound
	}
	c.queueBytes(appendAck(nil, packets.Pubcomp, pid, rc, c.version == 5), false)
	return nil
}

// parseAck reads an ack's packet ID and (MQTT 5) reason code, checking the
// properties' framing. An MQTT 3 ack is exactly two bytes.
func parseAck(body []byte, version byte) (uint16, ReasonCode, error) {
	if len(body) < 2 {
		return 0, 0, malformed("§3.4.1", "ack of %d bytes", len(body))
	}
	pid := uint16(body[0])<<8 | uint16(body[1])
	if version != 5 {
		if len(body) != 2 {
			return 0, 0, malformed("§3.4.1", "MQTT 3 ack of %d bytes", len(body))
		}
		return pid, Success, nil
	}
	if len(body) == 2 {
		return pid, Success, nil // [MQTT-3.4.2-1]: no reason code means success
	}
	code := ReasonCode(body[2])
	if len(body) > 3 {
		s, err := scanProps(body[3:])
		if err != nil {
			return 0, 0, err
		}
		if 3+s.size != len(body) {
			return 0, 0, malformed("§2.2.2", "bytes after the ack's properties")
		}
	}
	return pid, code, nil
}

// readVarint reads an MQTT variable byte integer: its value, its length, ok.
func readVarint(b []byte) (int, int, bool) {
	n, mul := 0, 1
	for i := 0; i < 4; i++ {
		if i >= len(b) {
			return 0, 0, false
		}
		n += int(b[i]&0x7F) * mul
		if b[i]&0x80 == 0 {
			return n, i + 1, true
		}
		mul *= 128
	}
	return 0, 0, false
}

// validAckCode reports whether code is one the spec allows in an ack of
// type typ (§3.4.2.1, §3.5.2.1, §3.6.2.1, §3.7.2.1).
func validAckCode(typ byte, code ReasonCode) bool {
	switch typ {
	case packets.Puback, packets.Pubrec:
		switch code {
		case Success, NoMatchingSubscribers, UnspecifiedError, ImplementationSpecific, NotAuthorized,
			TopicNameInvalid, PacketIDInUse, QuotaExceeded, PayloadFormatInvalid:
			return true
		}
	case packets.Pubrel, packets.Pubcomp:
		return code == Success || code == PacketIDNotFound
	}
	return false
}
