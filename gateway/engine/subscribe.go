package engine

import (
	"strings"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

func (c *conn) handleSubscribe(first byte, body []byte) error {
	if first&0x0F != 0x02 {
		return malformed("[MQTT-3.8.1-1]", "SUBSCRIBE flags %#x, must be 0x2", first&0x0F)
	}
	if err := scanFilters(body, c.version, true); err != nil {
		return err
	}
	var pk packets.Packet
	pk.ProtocolVersion = c.version
	if err := decodeHeader(&pk, first, len(body)); err != nil {
		return err
	}
	if err := pk.SubscribeDecode(ownBody(body)); err != nil {
		return decodeError(packets.Subscribe, err)
	}
	if pk.PacketID == 0 {
		// MQTT 5 [MQTT-2.2.1-3]; 3.1.1 [MQTT-2.3.1-1].
		return violation("[MQTT-2.2.1-3]", "SUBSCRIBE with packet identifier 0")
	}
	if len(pk.Filters) == 0 {
		// 3.1.1 [MQTT-3.8.3-3]; MQTT 5 [MQTT-3.8.3-2].
		return violation("[MQTT-3.8.3-3]", "SUBSCRIBE without a filter")
	}
	var subID uint32
	if ids := pk.Properties.SubscriptionIdentifier; len(ids) > 0 {
		if len(ids) > 1 || ids[0] <= 0 || ids[0] > 268435455 {
			return violation("§3.8.2.1.2", "subscription identifier %v", ids)
		}
		subID = uint32(ids[0])
	}
	v5 := c.version == 5
	codes := make([]byte, len(pk.Filters))
	type retainedFor struct {
		filter string
		o      topictree.Options
	}
	var wantRetained []retainedFor
	for i, f := range pk.Filters {
		group, inner, shared := mqtttopic.Unshare(f.Filter)
		if shared && f.NoLocal && v5 {
			return violation("[MQTT-3.8.3-4]", "no local on a shared subscription")
		}
		code := c.grant(f.Filter, group, inner, shared, f.Qos)
		if code >= 0x80 {
			if !v5 {
				code = 0x80 // the only MQTT 3 failure code [MQTT-3.9.3-2]
			}
			codes[i] = byte(code)
			continue
		}
		o := topictree.Options{QoS: f.Qos, NoLocal: f.NoLocal, RetainAsPublished: f.RetainAsPublished, RetainHandling: f.RetainHandling, Identifier: subID}
		existed := c.e.subscribe(c.sess, f.Filter, o)
		codes[i] = f.Qos // [MQTT-3.9.3-1]: the QoS granted, in order
		// Retained messages: none for a shared subscription; per Retain
		// Handling otherwise [MQTT-3.3.1-9] [MQTT-3.3.1-10] [MQTT-3.3.1-11].
		if !shared && (f.RetainHandling == 0 || (f.RetainHandling == 1 && !existed)) {
			wantRetained = append(wantRetained, retainedFor{inner, o})
		}
	}
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Suback}, PacketID: pk.PacketID, ReasonCodes: codes}
	c.queuePacket(&ack) // [MQTT-3.8.4-1]
	for _, r := range wantRetained {
		c.e.sendRetained(c.sess, r.filter, r.o)
	}
	return nil
}

// grant decides one filter: a QoS, or a failure code.
func (c *conn) grant(filter, group, inner string, shared bool, qos byte) ReasonCode {
	if shared && (group == "" || strings.ContainsAny(group, "+#") || inner == "") {
		return TopicFilterInvalid // [MQTT-4.8.2-1] [MQTT-4.8.2-2]
	}
	if err := mqtttopic.ValidFilter(inner); err != nil {
		return TopicFilterInvalid
	}
	if strings.HasPrefix(inner, mqtttopic.Internal) {
		return NotAuthorized
	}
	if acl := c.e.opts.Hooks.ACL; acl != nil && !acl.CanSubscribe(c.client, filter) {
		return NotAuthorized
	}
	if lim := c.e.opts.Hooks.Limits; lim != nil {
		s := c.sess
		s.mu.Lock()
		held, has := len(s.subs), s.findSub(filter) >= 0
		s.mu.Unlock()
		if !has {
			if code := lim.AllowSubscription(c.client, filter, held); code != Success {
				return code
			}
		}
	}
	return ReasonCode(qos)
}

// subscribe files s's subscription to filter; existed reports that s held
// it already (it is replaced [MQTT-3.8.4-3]).
func (e *Engine) subscribe(s *session, filter string, o topictree.Options) (existed bool) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return false
	}
	existed = e.subs.Add(filter, s, o)
	if i := s.findSub(filter); i >= 0 {
		s.subs[i].o = o
	} else {
		s.subs = append(s.subs, sessSub{filter: filter, o: o})
	}
	e.storeSub(s, filter, o)
	if !existed && e.opts.Hooks.Router != nil {
		e.opts.Hooks.Router.Subscribed(s.id, filter) // under the lock: in order with the session's end
	}
	s.mu.Unlock()
	return existed
}

func (c *conn) handleUnsubscribe(first byte, body []byte) error {
	if first&0x0F != 0x02 {
		return malformed("[MQTT-3.10.1-1]", "UNSUBSCRIBE flags %#x, must be 0x2", first&0x0F)
	}
	if err := scanFilters(body, c.version, false); err != nil {
		return err
	}
	var pk packets.Packet
	pk.ProtocolVersion = c.version
	if err := decodeHeader(&pk, first, len(body)); err != nil {
		return err
	}
	if err := pk.UnsubscribeDecode(ownBody(body)); err != nil {
		return decodeError(packets.Unsubscribe, err)
	}
	if pk.PacketID == 0 {
		// MQTT 5 [MQTT-2.2.1-3]; 3.1.1 [MQTT-2.3.1-1].
		return violation("[MQTT-2.2.1-3]", "UNSUBSCRIBE with packet identifier 0")
	}
	if len(pk.Filters) == 0 {
		return violation("[MQTT-3.10.3-2]", "UNSUBSCRIBE without a filter")
	}
	codes := make([]byte, len(pk.Filters))
	for i, f := range pk.Filters {
		if !c.e.unsubscribe(c.sess, f.Filter) {
			codes[i] = byte(NoSubscriptionExisted)
		}
	}
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Unsuback}, PacketID: pk.PacketID}
	if c.version == 5 {
		ack.ReasonCodes = codes // [MQTT-3.11.3-1]
	}
	c.queuePacket(&ack) // [MQTT-3.10.4-4]
	return nil
}

// unsubscribe removes s's subscription to filter; false if it had none.
func (e *Engine) unsubscribe(s *session, filter string) bool {
	s.mu.Lock()
	i := s.findSub(filter)
	if i < 0 {
		s.mu.Unlock()
		return false
	}
	s.subs = append(s.subs[:i], s.subs[i+1:]...)
	if len(s.subs) == 0 {
		s.subs = nil
	}
	e.subs.Remove(filter, s)
	e.storeUnsub(s, filter)
	if e.opts.Hooks.Router != nil {
		e.opts.Hooks.Router.Unsubscribed(s.id, filter)
	}
	s.mu.Unlock()
	return true
}

// scanFilters checks the framing of a SUBSCRIBE (options too) or
// UNSUBSCRIBE body before it is decoded: every length within the packet,
// a whole options byte after each filter, and its reserved bits clear
// [MQTT-3.8.3-4] (MQTT 3: only the QoS bits) [MQTT-3.8.3-5] (MQTT 5: bits
// 6 and 7; a Maximum QoS or Retain Handling of 3 is a protocol error,
// §3.8.3.1). Filters are UTF-8 [MQTT-3.8.3-1] [MQTT-3.10.3-1] (mochi's
// decoder).
func scanFilters(body []byte, version byte, options bool) error {
	if len(body) < 2 {
		return malformed("", "no packet identifier")
	}
	p := 2
	if version == 5 {
		s, err := scanProps(body[p:])
		if err != nil {
			return err
		}
		p += s.size
	}
	for p < len(body) {
		if p+2 > len(body) {
			return malformed("", "filter length overruns the packet")
		}
		n := int(body[p])<<8 | int(body[p+1])
		p += 2 + n
		if p > len(body) {
			return malformed("", "filter overruns the packet")
		}
		if !options {
			continue
		}
		if p >= len(body) {
			return malformed("[MQTT-3.8.3-1]", "filter without its options byte")
		}
		opt := body[p]
		p++
		switch {
		case version < 5 && opt&^0x03 != 0:
			return malformed("[MQTT-3.8.3-4]", "reserved bits of the requested QoS set")
		case version == 5 && opt&0xC0 != 0:
			return malformed("[MQTT-3.8.3-5]", "reserved bits of the subscription options set")
		case opt&0x03 == 3 && version < 5:
			return malformed("[MQTT-3.8.3-4]", "requested QoS 3")
		case opt&0x03 == 3:
			return violation("§3.8.3.1", "maximum QoS 3")
		case version == 5 && (opt>>4)&0x03 == 3:
			return violation("§3.8.3.1", "retain handling 3")
		}
	}
	return nil
}
