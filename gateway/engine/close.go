package engine

import (
	"errors"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// end ends the connection, once: an MQTT 5 client past its CONNACK is told
// why in a DISCONNECT (code; Success sends none) [MQTT-4.13.1-1], the
// session is detached (a clean one ends, a persistent one goes offline),
// the will is published unless the client said goodbye or was taken over
// [MQTT-3.1.2-8] [MQTT-3.1.2-10], and the presence hook is told. It runs on
// the connection's turn.
func (c *conn) end(code ReasonCode, why string, cause error) {
	if c.state == stClosed {
		return
	}
	wasConnected := c.state == stConnected
	c.state = stClosed
	e := c.e
	if wasConnected && c.version == 5 && code != Success {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ReasonCode: byte(code)}
		if !c.noProblem && cause != nil && code != SessionTakenOver && code != ServerShuttingDown {
			pk.Properties.ReasonString = cause.Error()
		}
		c.queuePacket(&pk)
	}
	c.closed.Store(true)
	c.partial = nil
	c.aliases = nil

	// Completions still on their way find no slot to ack; what became of
	// their QoS 2 publishes is recorded in the session (settleQoS2).
	c.upMu.Lock()
	var settle []*upSlot
	for _, slot := range c.up {
		if slot.done {
			settle = append(settle, slot)
		} else {
			slot.orphan = true
		}
	}
	c.up = nil
	c.upMu.Unlock()
	for _, slot := range settle {
		c.settleQoS2(slot)
	}

	if wasConnected {
		e.m.connected.Add(-1)
		e.m.disconnects.Add(1)
		e.detach(c, why)
	} else if why == reasonConnectTimeout {
		e.m.connectTimeouts.Add(1)
	}
	if c.release != nil && !c.released {
		c.released = true
		c.release()
	}
	// What was queued (a CONNACK that refuses, a DISCONNECT) goes out, then
	// the connection lingers until the client has read it. It stays in the
	// connection table until then: the event loop reports the socket's
	// progress through it.
	c.flush()
	c.wmu.Lock()
	terminal := c.terminal || c.backlogBytes > 0
	c.wmu.Unlock()
	if terminal {
		c.linger()
	} else {
		e.removeConn(c) // first: the descriptor is not reused while c is in the table
		c.t.close()
	}
	if wasConnected {
		if p := e.opts.Hooks.Presence; p != nil {
			if c.takenOver.Load() {
				p.Disconnected(c.client, reasonTakenOver, nil, true)
			} else {
				p.Disconnected(c.client, why, cause, false)
			}
		}
	}
	e.log.Debug().Str(logClient, c.id()).Str(logRemote, c.cl.remote).Str("reason", why).AnErr("cause", cause).Msg("connection closed")
}

func (c *conn) backlogged() bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.backlogBytes > 0
}

// linger closes a connection that wrote a last packet without resetting
// it: the write side is shut once the socket took what was queued, then
// what the client still sends is read and discarded until it closes, 2 s
// pass or 1 MiB arrived [MQTT-4.13.2-1]. Closing at once would make the
// kernel answer the client's next bytes with a reset, and a client still
// writing would fail before it read our last packet.
func (c *conn) linger() {
	c.lingering.Store(true)
	c.e.lingerStart(c)
}

// detach takes c off its session.
func (e *Engine) detach(c *conn, why string) {
	s := c.sess
	if s == nil {
		return
	}
	takenOver := c.takenOver.Load()
	e.mu.Lock()
	s.mu.Lock()
	if s.conn == c {
		s.conn = nil
		s.online.Store(false)
		e.routeOnlineLocked(s, false)
	}
	mine := !takenOver && s.conn == nil && !s.ended
	var will *willSpec
	sendWill := false
	if mine {
		hadWill := s.will != nil
		if w := s.will; w != nil && (!c.cleanEnd || c.willToo) {
			will, sendWill = w, true
		}
		if !sendWill {
			s.will = nil
		}
		if !s.persistent() {
			e.endLocked(s, "the session ended with its connection")
			if e.sessions[s.id] == s {
				delete(e.sessions, s.id)
			}
		} else {
			s.offline = time.Now().UnixNano()
			e.storeOffline(s)
			for _, om := range s.inflight {
				e.stubLocked(s, om)
			}
			for _, om := range s.queue {
				e.stubLocked(s, om)
			}
			if sendWill && will.delay > 0 {
				// Sent after the delay unless the client is back first
				// [MQTT-3.1.3-9]; the session's end sends it too.
				d := min(time.Duration(will.delay)*time.Second, time.Duration(s.expiry)*time.Second)
				s.willAt = s.offline + int64(d)
				sendWill = false
			} else {
				s.will = nil
			}
			if hadWill && s.will == nil {
				e.storeClient(s) // the stored will is spent: a restart must not send it again
			}
			e.watchSession(s)
		}
	}
	s.mu.Unlock()
	e.mu.Unlock()
	if sendWill {
		e.publishWill(s, will)
	}
}

// publishWill publishes a will as a message of its client.
func (e *Engine) publishWill(s *session, w *willSpec) {
	if w == nil {
		return
	}
	m := *w.m
	m.Created = time.Now().UnixNano()
	if w.expiry > 0 {
		m.Expiry = time.Now().Unix() + int64(w.expiry)
	}
	s.mu.Lock()
	var cl *Client
	if s.conn == nil {
		cl = &Client{id: s.id, username: s.username, protocol: s.protocol}
	}
	s.mu.Unlock()
	if cl == nil {
		return // the client is back: no will [MQTT-3.1.3-9]
	}
	e.m.wills.Add(1)
	e.publishAs(cl, &m)
}

// expire ends an offline session whose expiry passed; a will still waiting
// goes out now [MQTT-3.1.2-8]. The session leaves at once (a client that
// connects finds none), but with a DurableDelivery hook its messages are
// let go only once their discards are recorded: until then the session
// stays in the wheel, out of Engine.sessions, and tries again.
func (e *Engine) expire(s *session) {
	e.mu.Lock()
	s.mu.Lock()
	if s.conn != nil || s.ended {
		s.mu.Unlock()
		e.mu.Unlock()
		return
	}
	if e.sessions[s.id] == s {
		delete(e.sessions, s.id)
	}
	w := s.will
	s.will, s.willAt = nil, 0
	pending := append(append([]*outMsg(nil), s.inflight...), s.queue...)
	s.inflight, s.queue, s.byPID, s.queueBytes = nil, nil, nil, 0
	for _, sub := range s.subs {
		e.subs.Remove(sub.filter, s)
		if e.opts.Hooks.Router != nil {
			e.opts.Hooks.Router.Unsubscribed(s.id, sub.filter)
		}
	}
	s.subs = nil
	s.mu.Unlock()
	e.mu.Unlock()
	if w != nil {
		e.publishWill(s, w)
	}
	e.finishExpiry(s, pending)
}

// finishExpiry records the discards of an expired session's messages and
// deletes it from the store once none is left.
func (e *Engine) finishExpiry(s *session, pending []*outMsg) {
	kept := e.discardDurably(s, pending, true, "the session expired")
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(kept) > 0 && !e.closing.Load() {
		s.expiring = kept
		s.wheelAt = time.Now().Add(time.Second).UnixNano()
		e.wheel.Add(s, s.wheelAt)
		return
	}
	s.expiring = nil
	s.ended = true
	e.m.expired.Add(1)
	if e.opts.Hooks.Sessions != nil {
		e.opts.Hooks.Sessions.Delete(s.id)
	}
}

// handleDisconnect: the client leaves, and its will is discarded
// [MQTT-3.14.4-3] — unless, on MQTT 5, it asks for it (0x04). MQTT 5 may
// change the session expiry (not from 0 [MQTT-3.14.2-2]).
//
// The MQTT 5 body is read here, not by mochi's DisconnectDecode, which
// skips a lone reason code (remaining length 1: 0x04 would lose the will)
// and the properties of a two-byte body.
func (c *conn) handleDisconnect(first byte, body []byte) error {
	if first&0x0F != 0 {
		return malformed("[MQTT-3.14.1-1]", "DISCONNECT flags set")
	}
	c.cleanEnd = true
	if c.version == 5 && len(body) > 0 {
		if !validDisconnectCode(ReasonCode(body[0])) {
			c.cleanEnd = false
			return violation("[MQTT-3.14.2-1]", "DISCONNECT with reason code %#02x", body[0])
		}
		var pk packets.Packet
		pk.ProtocolVersion = 5
		pk.ReasonCode = body[0]
		if len(body) > 1 {
			s, err := scanProps(body[1:])
			if err == nil && 1+s.size != len(body) {
				err = malformed("§2.2.2", "bytes after the DISCONNECT's properties")
			}
			if err != nil {
				c.cleanEnd = false
				return err
			}
			if err := decodeHeader(&pk, first, len(body)); err != nil {
				return err
			}
			if err := pk.DisconnectDecode(ownBody(body)); err != nil {
				c.cleanEnd = false
				return decodeError(packets.Disconnect, err)
			}
		}
		c.willToo = pk.ReasonCode == byte(DisconnectWithWill)
		if pk.Properties.SessionExpiryIntervalFlag {
			s := c.sess
			s.mu.Lock()
			was := s.expiry
			if was == 0 && pk.Properties.SessionExpiryInterval > 0 {
				s.mu.Unlock()
				c.cleanEnd = false // a protocol error: the will goes out
				return violation("[MQTT-3.14.2-2]", "session expiry set at DISCONNECT after 0 at CONNECT")
			}
			s.expiry = min(pk.Properties.SessionExpiryInterval, uint32(c.e.opts.MaxSessionExpiry/time.Second))
			if s.expiry == 0 && was > 0 {
				c.e.storeDelete(s)
			} else if s.expiry > 0 {
				c.e.storeClient(s)
			}
			s.mu.Unlock()
		}
	} else if c.version < 5 && len(body) != 0 {
		c.cleanEnd = false
		return malformed("§3.14.1", "MQTT 3 DISCONNECT with a body")
	}
	// What follows the DISCONNECT is not handled: the client must not send
	// it (3.1.1 [MQTT-3.14.4-2], MQTT 5 [MQTT-3.14.4-1]); consume stops at
	// the closed state.
	c.end(Success, reasonNormal, errors.New("client disconnected"))
	return nil
}

// validDisconnectCode reports whether code is one of the DISCONNECT reason
// codes (§3.14.2.1).
func validDisconnectCode(code ReasonCode) bool {
	switch code {
	case Success, DisconnectWithWill, UnspecifiedError, MalformedPacket, ProtocolError, ImplementationSpecific,
		NotAuthorized, ServerBusy, ServerShuttingDown, KeepAliveTimeout, SessionTakenOver, TopicFilterInvalid,
		TopicNameInvalid, ReceiveMaximumExceeded, TopicAliasInvalid, PacketTooLarge, MessageRateTooHigh,
		QuotaExceeded, AdministrativeAction, PayloadFormatInvalid, RetainNotSupported, QoSNotSupported,
		0x9C, 0x9D, // use another server, server moved
		SharedSubNotSupported, ConnectionRateExceeded, MaximumConnectTime, SubscriptionIDsNotSupported,
		WildcardSubsNotSupported:
		return true
	}
	return false
}
