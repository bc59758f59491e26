package engine

import (
	"time"

	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// Outbound: a published message is matched against the subscription tree
// once, collated per session (one copy per session however many of its
// filters match, at the highest QoS granted, with every matching
// subscription identifier [MQTT-3.3.4-2] [MQTT-3.3.4-3] [MQTT-3.3.4-4]),
// and handed to each session.

// matchSet collects the sessions a topic matches. Most publishes match one
// or two; a map is made only past a handful.
type matchSet struct {
	origin string
	list   []matchHit
	index  map[*session]int
	// skip names shared groups ("group/filter") another node served;
	// served collects those served here.
	skip   []string
	served []string
}

type matchHit struct {
	s      *session
	qos    byte
	rap    bool // retain as published
	subIDs []uint32
}

func (ms *matchSet) add(s *session, o topictree.Options, shared bool) {
	if o.NoLocal && !shared && s.id == ms.origin { // [MQTT-3.8.3-3]
		return
	}
	i := -1
	if ms.index != nil {
		if j, ok := ms.index[s]; ok {
			i = j
		}
	} else {
		for j := range ms.list {
			if ms.list[j].s == s {
				i = j
				break
			}
		}
	}
	if i < 0 {
		ms.list = append(ms.list, matchHit{s: s})
		i = len(ms.list) - 1
		if ms.index != nil {
			ms.index[s] = i
		} else if len(ms.list) > 16 {
			ms.index = make(map[*session]int, 64)
			for j := range ms.list {
				ms.index[ms.list[j].s] = j
			}
		}
	}
	h := &ms.list[i]
	h.qos = max(h.qos, o.QoS)
	h.rap = h.rap || o.RetainAsPublished
	if o.Identifier > 0 {
		h.subIDs = append(h.subIDs, o.Identifier)
	}
}

func (ms *matchSet) Subscription(s *session, o topictree.Options) { ms.add(s, o, false) }

// Member is called under the tree's lock: it must not take the session's
// (lock order: session, then tree), so it reads the atomic online flag.
//
// Groups are served by their connected members only [MQTT-4.8.2-2].
func (ms *matchSet) Member(group, filter string, s *session, o topictree.Options) bool {
	key := group + "/" + filter
	for _, k := range ms.skip {
		if k == key {
			return true // served elsewhere: nobody here takes it
		}
	}
	if !s.online.Load() {
		return false
	}
	ms.add(s, o, true)
	for _, k := range ms.served {
		if k == key {
			return true
		}
	}
	ms.served = append(ms.served, key)
	return true
}

// distribute delivers m to every session whose subscriptions match it and
// tells the router. A message from the router is not routed back.
func (e *Engine) distribute(m *Message, fromRouter bool, skip []string) int {
	ms := matchSet{origin: m.Origin, skip: skip}
	e.subs.Match(m.Topic, &ms)
	acl := e.opts.Hooks.ACL
	for i := range ms.list {
		h := &ms.list[i]
		if acl != nil && !e.readable(h.s, m.Topic) {
			continue
		}
		e.deliver(h.s, m, min(m.QoS, h.qos), m.Retain && h.rap, h.subIDs) // [MQTT-3.3.1-12] [MQTT-3.3.1-13]
	}
	e.m.delivered.Add(uint64(len(ms.list)))
	if !fromRouter && e.opts.Hooks.Router != nil {
		e.opts.Hooks.Router.Routed(m, ms.served)
	}
	return len(ms.list)
}

// readable asks the ACL whether s may get a message on topic.
func (e *Engine) readable(s *session, topic string) bool {
	s.mu.Lock()
	var cl *Client
	if s.conn != nil {
		cl = s.conn.client
	}
	user := s.username
	s.mu.Unlock()
	return e.opts.Hooks.ACL.CanRead(cl, s.id, user, topic)
}

// sendQoS0 writes a QoS 0 message to c unless its write queue is full
// (then the message is dropped for this subscriber and counted).
func (c *conn) sendQoS0(m *Message, retain bool, subIDs []uint32) {
	if c.writesFull() {
		c.e.m.droppedSlow.Add(1)
		c.e.discard(c.id(), m, false, "the client's write queue is full")
		return
	}
	o := publishOut{retain: retain, subIDs: subIDs}
	v5 := c.version == 5
	if v5 {
		o.expiry = expiryLeft(m)
		if c.maxOut > 0 && publishSize(m, &o, true)+c.aliasExtra() > int(c.maxOut) {
			c.e.m.droppedTooLarge.Add(1) // [MQTT-3.1.2-24]
			return
		}
	}
	if !c.appendPacket(func(b []byte) []byte { return c.appendPublishOut(b, m, &o, v5) }) {
		return
	}
	c.e.m.sent.Add(1)
	if d := c.e.opts.Hooks.Delivery; m.Ref != "" && d != nil {
		d.Sent(c.id(), m, 0, false, time.Now())
		d.Delivered(c.id(), m, 0)
	}
}

// sendOut writes a QoS 1/2 message of s, c's session (its lock is held). A message larger than the client's Maximum Packet Size is not
// sent but completed as if it had been (completeUnsendable, on the pool).
func (c *conn) sendOut(s *session, om *outMsg) {
	o := publishOut{qos: om.m.QoS, retain: om.m.Retain, pid: om.pid, dup: om.sent, subIDs: om.subIDs}
	v5 := c.version == 5
	if v5 {
		o.expiry = expiryLeft(om.m)
		if c.maxOut > 0 && publishSize(om.m, &o, true)+c.aliasExtra() > int(c.maxOut) {
			// [MQTT-3.1.2-24] [MQTT-3.1.2-25]: not sent, treated as sent.
			c.e.m.droppedTooLarge.Add(1)
			om.sent, om.gen = true, s.generation
			c.e.pool.submit(funcJob(func() { c.e.completeUnsendable(s, om) }))
			return
		}
	}
	if c.appendPacket(func(b []byte) []byte { return c.appendPublishOut(b, om.m, &o, v5) }) {
		dup := om.sent
		om.sent, om.gen = true, s.generation
		c.e.m.sent.Add(1)
		if d := c.e.opts.Hooks.Delivery; om.m.Ref != "" && d != nil {
			m := om.m
			pid, at := om.pid, time.Now()
			c.e.pool.submit(funcJob(func() { d.Sent(c.id(), m, pid, dup, at) })) // not under the session's lock
		}
	}
}

// completeUnsendable ends a message too large for its client as if the
// client had acknowledged it.
func (e *Engine) completeUnsendable(s *session, om *outMsg) {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.byPID[om.pid] != om {
		s.mu.Unlock()
		return
	}
	e.removeInflightLocked(s, om)
	e.fillWindowLocked(s)
	s.mu.Unlock()
	e.discard(s.id, om.m, false, "larger than the client's maximum packet size")
}

// appendPublishOut is appendPublish with c's outbound topic alias; it
// runs under c.wmu (appendPacket).
func (c *conn) appendPublishOut(b []byte, m *Message, o *publishOut, v5 bool) []byte {
	if c.outAlias != nil {
		c.outAlias.apply(o, m.Topic)
	}
	return appendPublish(b, m, o, v5)
}

// aliasExtra is what a topic alias may add to a PUBLISH to c.
func (c *conn) aliasExtra() int {
	if c.outAlias != nil {
		return aliasBytes
	}
	return 0
}

// appendPacket appends one encoded packet to c's write buffer.
func (c *conn) appendPacket(enc func([]byte) []byte) bool {
	c.wmu.Lock()
	if c.terminal || c.closed.Load() {
		c.wmu.Unlock()
		return false
	}
	first := len(c.out) == 0
	if c.out == nil {
		c.out = getOutBuf()
	}
	c.out = enc(c.out)
	c.outPkts++
	full := len(c.out) >= flushBytes
	c.wmu.Unlock()
	switch {
	case full:
		if err := c.writeOut(); err != nil {
			c.kill(Success, reasonLost, err) // the turn ends it
		}
	case first:
		c.schedule(wFlush)
	}
	return true
}

// expiryLeft is the rest of m's expiry interval in seconds (at least 1
// while it has not passed) [MQTT-3.3.2-6].
func expiryLeft(m *Message) uint32 {
	if m.Expiry == 0 {
		return 0
	}
	left := m.Expiry - time.Now().Unix()
	if left < 1 {
		left = 1
	}
	return uint32(left)
}
