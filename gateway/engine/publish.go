package engine

import (
	"context"
	"errors"
	"time"
	"unicode/utf8"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Inbound PUBLISH: checked, its topic alias resolved, authorized, paced,
// handed to the Uplink hook, acknowledged in the order the client sent it
// [MQTT-4.6.0-2] once the hook says so, and delivered.

// upSlot is one inbound publish from its arrival until its ack is written.
type upSlot struct {
	pid     uint16
	qos     byte
	m       *Message
	deliver bool // deliver to subscribers on success (Defer, Deliver)
	done    bool
	orphan  bool // its connection closed before its ack was written
	res     Result
}

func (c *conn) handlePublish(first byte, body []byte) error {
	var pk packets.Packet
	pk.ProtocolVersion = c.version
	if err := decodeHeader(&pk, first, len(body)); err != nil {
		return err
	}
	if c.version == 5 {
		if err := checkPublishProps(body, pk.FixedHeader.Qos); err != nil {
			return err
		}
	}
	if err := pk.PublishDecode(ownBody(body)); err != nil {
		return decodeError(packets.Publish, err)
	}
	qos := pk.FixedHeader.Qos
	if qos > 0 && pk.PacketID == 0 {
		// MQTT 5 [MQTT-2.2.1-3]; 3.1.1 [MQTT-2.3.1-1].
		return violation("[MQTT-2.2.1-3]", "QoS %d PUBLISH with packet identifier 0", qos)
	}
	topic := pk.TopicName
	v5 := c.version == 5
	var unsureID uint64 // the QoS2ID of an unsure resend
	if v5 {
		p := &pk.Properties
		if len(p.SubscriptionIdentifier) > 0 {
			return violation("[MQTT-3.3.4-6]", "a client's PUBLISH carries a subscription identifier")
		}
		if p.TopicAliasFlag || p.TopicAlias > 0 {
			alias := p.TopicAlias
			if alias == 0 || alias > c.e.opts.TopicAliasMaximum {
				return &protocolError{code: TopicAliasInvalid, spec: "[MQTT-3.3.2-8] [MQTT-3.3.2-9]", msg: "topic alias out of range"}
			}
			if topic == "" {
				if int(alias) > len(c.aliases) || c.aliases[alias-1] == "" {
					return violation("§3.3.2.3.4", "topic alias %d was never set", alias)
				}
				topic = c.aliases[alias-1]
			} else {
				if len(c.aliases) < int(alias) {
					c.aliases = append(c.aliases, make([]string, int(alias)-len(c.aliases))...)
				}
				c.aliases[alias-1] = topic // [MQTT-3.3.2-12]
			}
		}
		if p.ResponseTopic != "" && validTopicName(p.ResponseTopic) != nil {
			return violation("[MQTT-3.3.2-14]", "response topic %q is not a topic name", p.ResponseTopic)
		}
		if p.PayloadFormatFlag && p.PayloadFormat > 1 {
			return violation("§3.3.2.3.2", "payload format indicator %d", p.PayloadFormat)
		}
	}
	if topic == "" {
		return violation("[MQTT-3.3.2-1]", "PUBLISH without a topic name")
	}
	if err := validTopicName(topic); err != nil {
		return &protocolError{code: TopicNameInvalid, spec: "[MQTT-3.3.2-2]", msg: err.Error()}
	}

	if qos > 0 {
		// Receive Maximum [MQTT-3.3.4-7]: one more than we announced is a
		// protocol error (MQTT 5); MQTT 3 clients are paced instead.
		if v5 && c.upPending >= int(c.e.opts.ReceiveMaximum) && !c.duplicateQoS2(pk.PacketID) {
			return &protocolError{code: ReceiveMaximumExceeded, spec: "[MQTT-3.3.4-7]", msg: "more QoS 1/2 publishes in flight than Receive Maximum"}
		}
		if qos == 2 {
			if q, ok := c.inboundQoS2(pk.PacketID); ok && q.unsure {
				// Taken by an earlier process that ended before its
				// PUBREC: the Uplink looks whether it is stored.
				unsureID = q.id
			} else if ok {
				// A resend of a QoS 2 publish we have: not delivered twice
				// [MQTT-4.3.3-10]. If its PUBREC went out, it goes out again.
				if q.answered {
					c.queueBytes(appendAck(nil, packets.Pubrec, pk.PacketID, Success, v5), false)
				}
				c.e.m.duplicates.Add(1)
				return nil
			}
		}
	}
	c.e.m.published.Add(1)

	now := time.Now()
	m := &Message{Topic: topic, Payload: pk.Payload, QoS: qos, Retain: pk.FixedHeader.Retain, Origin: c.client.id, Created: now.UnixNano(),
		PacketID: pk.PacketID}
	if v5 {
		p := &pk.Properties
		m.Props = propsOf(p)
		if p.MessageExpiryInterval > 0 {
			m.Expiry = now.Unix() + int64(min(p.MessageExpiryInterval, uint32(c.e.opts.MaxMessageExpiry/time.Second)))
		}
		if p.PayloadFormatFlag && p.PayloadFormat == 1 && !utf8.Valid(m.Payload) {
			return c.refusePublish(qos, pk.PacketID, PayloadFormatInvalid, "payload is not UTF-8")
		}
	}

	if internalTopic(topic) {
		return c.refusePublish(qos, pk.PacketID, NotAuthorized, "topic reserved for the server")
	}
	if acl := c.e.opts.Hooks.ACL; acl != nil && !acl.CanPublish(c.client, topic) {
		return c.refusePublish(qos, pk.PacketID, NotAuthorized, "not authorized")
	}
	if lim := c.e.opts.Hooks.Limits; lim != nil {
		code, wait, disconnect := lim.AllowPublish(c.client, topic, len(m.Payload))
		switch {
		case code == Success:
		case code == MessageRateTooHigh && wait > 0 && !v5:
			c.e.m.paced.Add(1)
			if disconnect {
				c.end(Success, reasonKicked, errors.New("publish rate exceeded"))
				return nil
			}
			// MQTT 3 cannot be told: stop reading from it for a while (its
			// own TCP backpressure) and drop this one.
			c.resumeAt.Store(now.Add(wait).UnixNano())
			c.pause()
			c.watch()
			return nil
		default:
			if code == MessageRateTooHigh {
				c.e.m.paced.Add(1)
			}
			return c.refusePublish(qos, pk.PacketID, code, code.String())
		}
	}

	if qos > 0 {
		c.upPending++
		if qos == 2 {
			m.QoS2ID, m.QoS2Unsure = c.takeQoS2(pk.PacketID, unsureID), unsureID != 0
		}
	}
	slot := &upSlot{pid: pk.PacketID, qos: qos, m: m, deliver: true}
	dec, res := Deliver, Result{}
	if qos == 2 && unsureID == 0 {
		if err := c.syncQoS2(); err != nil {
			c.e.log.Warn().Err(err).Str(logClient, c.client.id).Msg("qos 2 publish refused: its ID is not in the session store")
			dec, res = Refuse, Result{Code: UnspecifiedError, Reason: "session store unavailable"}
		}
	}
	var done func(Result)
	if up := c.e.opts.Hooks.Uplink; up != nil && dec == Deliver {
		done = func(r Result) { c.complete(slot, r) }
		dec, res = up.Publish(c.client, m, done)
	}
	switch dec {
	case Deliver:
		if qos == 0 {
			c.e.publish(m, false)
			return nil
		}
		slot.done = true
	case Defer:
	case Consume:
		slot.done, slot.deliver = true, false
	case Refuse:
		slot.done, slot.deliver, slot.res = true, false, res
		if slot.res.Code < 0x80 {
			slot.res.Code = UnspecifiedError
		}
	}
	if qos == 0 && slot.done {
		if slot.deliver {
			c.e.publish(m, false)
		}
		return nil
	}
	c.upMu.Lock()
	c.up = append(c.up, slot)
	ready := slot.done && len(c.up) == 1
	c.upMu.Unlock()
	if ready {
		c.drainAcks()
	}
	if c.version < 5 && c.upPending >= int(c.e.opts.ReceiveMaximum) {
		c.pause() // resumed by drainAcks
	}
	return nil
}

// refusePublish answers a refused publish: MQTT 5 gets the reason code in
// its PUBACK or PUBREC; an MQTT 3 client publishing at QoS 1/2 cannot be
// told and is disconnected (3.1.1 [MQTT-3.3.5-2]: acknowledge or close);
// QoS 0 is dropped.
func (c *conn) refusePublish(qos byte, pid uint16, code ReasonCode, why string) error {
	c.e.m.refusedPublishes.Add(1)
	switch {
	case qos == 0:
		return nil
	case c.version == 5:
		if qos == 2 {
			c.queueAck(packets.Pubrec, pid, code, why)
		} else {
			c.queueAck(packets.Puback, pid, code, why)
		}
		return nil
	default:
		c.end(Success, reasonProtocol, errors.New("publish refused: "+why))
		return nil
	}
}

// queueAck queues an ack with a reason code and (unless the client asked
// for none) a reason string.
func (c *conn) queueAck(typ byte, pid uint16, code ReasonCode, why string) {
	if c.version != 5 || why == "" || c.noProblem {
		c.queueBytes(appendAck(nil, typ, pid, code, c.version == 5), false)
		return
	}
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: typ}, PacketID: pid, ReasonCode: byte(code)}
	pk.Properties.ReasonString = why
	c.queuePacket(&pk)
}

// complete is Result's way back: called once per deferred publish, from any
// goroutine; the acks are written by the connection's turn.
func (c *conn) complete(slot *upSlot, r Result) {
	c.upMu.Lock()
	if slot.done {
		c.upMu.Unlock()
		return
	}
	slot.done, slot.res = true, r
	head := len(c.up) > 0 && c.up[0] == slot
	orphan := slot.orphan
	c.upMu.Unlock()
	if orphan {
		c.settleQoS2(slot)
	}
	if head {
		c.schedule(wAcks)
	}
}

// settleQoS2 records in the session what became of the QoS 2 publish of a
// slot whose connection closed before its PUBREC was written: stored, it
// is answered (a resend on the next connection gets its PUBREC); failed,
// it is unsure (a failed append may still have been stored: the resend is
// looked for in the core). Without it, the resend would find the ID taken
// and unanswered and wait for a PUBREC that never comes.
func (c *conn) settleQoS2(slot *upSlot) {
	if slot.qos != 2 {
		return
	}
	if r := slot.res; r.Code >= 0x80 || r.Disconnect != 0 {
		c.unsureQoS2(slot.pid)
		return
	}
	c.answerQoS2(slot.pid, slot.res.Findable)
}

// unsureQoS2 marks inbound QoS 2 packet ID pid unsure, as after a restart:
// whether its publish is stored is for the Uplink to find out at the
// client's resend, under the QoS2ID it keeps (and that the store has).
func (c *conn) unsureQoS2(pid uint16) {
	s := c.sess
	s.mu.Lock()
	for i := range s.inQoS2 {
		if q := &s.inQoS2[i]; q.pid == pid {
			q.unsure, q.answered = true, false
			break
		}
	}
	s.mu.Unlock()
}

// drainAcks writes the acks of completed publishes from the head of the
// queue, in order, and delivers them.
func (c *conn) drainAcks() {
	for {
		c.upMu.Lock()
		if len(c.up) == 0 || !c.up[0].done {
			if len(c.up) == 0 {
				c.up = nil
			}
			c.upMu.Unlock()
			break
		}
		slot := c.up[0]
		c.up[0] = nil
		c.up = c.up[1:]
		c.upMu.Unlock()
		if c.state == stClosed {
			continue
		}
		r := slot.res
		if r.Disconnect != 0 {
			c.settleQoS2(slot)
			c.end(r.Disconnect, reasonCore, errors.New(r.Reason))
			return
		}
		v5 := c.version == 5
		if r.Code >= 0x80 {
			// The core could not take it (a transient error): MQTT 3 cannot
			// be told, so the connection is closed [MQTT-4.8.0-2].
			if slot.qos > 0 && !v5 {
				if slot.qos == 2 {
					c.unsureQoS2(slot.pid) // the resend on the next connection is looked for
				}
				c.end(Success, reasonCore, errors.New("publish refused: "+r.Reason))
				return
			}
			if slot.qos == 1 {
				c.queueAck(packets.Puback, slot.pid, r.Code, r.Reason)
				c.upPending--
			} else if slot.qos == 2 {
				c.queueAck(packets.Pubrec, slot.pid, r.Code, r.Reason) // the flow ends here [MQTT-4.3.3-4]
				c.forgetQoS2(slot.pid)
				c.upPending--
			}
			continue
		}
		switch slot.qos {
		case 1:
			c.queueBytes(appendAck(nil, packets.Puback, slot.pid, Success, v5), false)
			c.upPending--
		case 2:
			c.answerQoS2(slot.pid, r.Findable)
			c.queueBytes(appendAck(nil, packets.Pubrec, slot.pid, Success, v5), false)
		}
		if slot.deliver && !r.Hold {
			c.e.publish(slot.m, false)
		}
	}
	if c.paused && c.resumeAt.Load() == 0 && c.upPending < int(c.e.opts.ReceiveMaximum) {
		c.resume()
	}
}

// Inbound QoS 2 packet IDs live in the session (they outlive the
// connection: a PUBREL may come on the next one) [MQTT-4.3.3-8], each with
// the QoS2ID it was taken under; answered is set once the PUBREC went out;
// unsure marks one restored from the store (an earlier process took it,
// and whether it stored it is for the Uplink to find out at its resend).
// gen says which connection received it, for the Receive Maximum count of
// that connection.
type inQoS2 struct {
	id       uint64
	gen      uint64
	pid      uint16
	answered bool
	unsure   bool
}

// takeQoS2 takes an inbound QoS 2 publish into the session and returns
// its QoS2ID: a new one, stored with its packet ID before the Uplink sees
// it (so that the record is on disk before the message can be); or
// unsureID, the ID of a restored one being resent, already stored.
func (c *conn) takeQoS2(pid uint16, unsureID uint64) uint64 {
	s := c.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	if unsureID != 0 {
		for i := range s.inQoS2 {
			if q := &s.inQoS2[i]; q.pid == pid && q.unsure {
				q.unsure, q.gen = false, s.generation
				return q.id
			}
		}
	}
	id := c.e.nextQoS2ID()
	s.inQoS2 = append(s.inQoS2, inQoS2{pid: pid, id: id, gen: s.generation})
	c.e.storeInbound(s, pid, id, true)
	return id
}

// qos2SyncTimeout bounds the wait for the session store to hold a QoS2ID.
const qos2SyncTimeout = 10 * time.Second

// syncQoS2 returns once the session store holds the QoS2ID just taken
// durably (InboundSyncer): a bucket's writes are queued, and a node killed
// after the core stored the message but before the bucket had its ID would
// leave the client's resend, on another node, nothing to look for; a log
// may be asked to fsync it (power loss). Clean sessions keep no record.
func (c *conn) syncQoS2() error {
	is, ok := c.e.opts.Hooks.Sessions.(InboundSyncer)
	if !ok {
		return nil
	}
	s := c.sess
	s.mu.Lock()
	persistent := s.persistent()
	s.mu.Unlock()
	if !persistent {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), qos2SyncTimeout)
	defer cancel()
	return is.SyncInbound(ctx, c.client.id)
}

// nextQoS2ID returns a new QoS2ID: the time in unix nanoseconds, or one
// past the last ID given if that is later, so IDs never repeat within a
// process and keep growing across restarts (unless the clock goes back by
// more than the restart took); an ID also says, to within the clock's
// error, when its publish came (a lower bound for looking it up).
func (e *Engine) nextQoS2ID() uint64 {
	now := time.Now().UnixNano()
	for {
		last := e.lastQoS2ID.Load()
		id := max(now, last+1)
		if e.lastQoS2ID.CompareAndSwap(last, id) {
			return uint64(id)
		}
	}
}

func (c *conn) duplicateQoS2(pid uint16) bool {
	_, ok := c.inboundQoS2(pid)
	return ok
}

// inboundQoS2 returns the session's record of inbound QoS 2 packet ID pid.
func (c *conn) inboundQoS2(pid uint16) (inQoS2, bool) {
	s := c.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.inQoS2 {
		if q.pid == pid {
			return q, true
		}
	}
	return inQoS2{}, false
}

// answerQoS2 marks inbound QoS 2 packet ID pid answered (its PUBREC goes
// out) and records it in the session store — unless the Uplink can find
// the publish by its QoS2ID (Result.Findable): then the store keeps it as
// taken, and a resend after a restart is looked for instead.
func (c *conn) answerQoS2(pid uint16, findable bool) {
	s := c.sess
	s.mu.Lock()
	for i := range s.inQoS2 {
		if s.inQoS2[i].pid == pid {
			s.inQoS2[i].answered = true
			if !findable {
				c.e.storeInbound(s, pid, 0, true)
			}
			break
		}
	}
	s.mu.Unlock()
}

func (c *conn) forgetQoS2(pid uint16) {
	s := c.sess
	s.mu.Lock()
	for i := range s.inQoS2 {
		if s.inQoS2[i].pid == pid {
			s.inQoS2 = append(s.inQoS2[:i], s.inQoS2[i+1:]...)
			c.e.storeInbound(s, pid, 0, false)
			break
		}
	}
	if len(s.inQoS2) == 0 {
		s.inQoS2 = nil
	}
	s.mu.Unlock()
}

// releaseInbound handles a PUBREL: the ID leaves the session; it reports
// whether it was there. One received on this connection gives its Receive
// Maximum slot back. An unsure one is released too: a PUBREL means its
// PUBREC went out, so it was stored.
func (c *conn) releaseInbound(pid uint16) bool {
	s := c.sess
	s.mu.Lock()
	found, mine := false, false
	for i, q := range s.inQoS2 {
		if q.pid == pid && (q.answered || q.unsure) {
			found, mine = true, q.gen == s.generation && !q.unsure
			s.inQoS2 = append(s.inQoS2[:i], s.inQoS2[i+1:]...)
			c.e.storeInbound(s, pid, 0, false)
			break
		}
	}
	if len(s.inQoS2) == 0 {
		s.inQoS2 = nil
	}
	s.mu.Unlock()
	if mine {
		c.upPending--
		if c.paused && c.resumeAt.Load() == 0 && c.upPending < int(c.e.opts.ReceiveMaximum) {
			c.resume()
		}
	}
	return found
}

// publish delivers a message that is now the engine's: retained if asked
// [MQTT-3.3.1-5] (an empty one clears the topic [MQTT-3.3.1-6]), then
// distributed.
func (e *Engine) publish(m *Message, fromRouter bool) {
	if m.Retain {
		e.retain(m)
	}
	e.distribute(m, fromRouter, nil)
}

// publishAs runs a message of cl's that did not come in a PUBLISH (a will)
// through the same checks and the Uplink hook, without acks.
func (e *Engine) publishAs(cl *Client, m *Message) {
	if internalTopic(m.Topic) {
		return
	}
	if acl := e.opts.Hooks.ACL; acl != nil && cl != nil && !acl.CanPublish(cl, m.Topic) {
		e.log.Warn().Str(logClient, m.Origin).Msg("will refused by the ACL: not published")
		return
	}
	up := e.opts.Hooks.Uplink
	if up == nil {
		e.publish(m, false)
		return
	}
	dec, _ := up.Publish(cl, m, func(r Result) {
		if r.Code < 0x80 && r.Disconnect == 0 && !r.Hold {
			e.publish(m, false)
		}
	})
	if dec == Deliver {
		e.publish(m, false)
	}
}

func utf8Valid(b []byte) bool { return utf8.Valid(b) }

// checkPublishProps scans an MQTT 5 PUBLISH's properties (§2.2.2): what
// does not fit before them is left to the decoder.
func checkPublishProps(body []byte, qos byte) error {
	if len(body) < 2 {
		return nil
	}
	p := 2 + (int(body[0])<<8 | int(body[1]))
	if qos > 0 {
		p += 2
	}
	if p >= len(body) {
		return nil
	}
	_, err := scanProps(body[p:])
	return err
}
