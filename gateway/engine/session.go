package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// session is the state of a client ID that outlives a single packet: its
// subscriptions, the messages on their way to it, the QoS 2 publishes it
// sent that await their PUBREL, and its will. A clean session ends with
// its connection; a persistent one stays (offline) until its expiry.
//
// Memory matters here (a million of them): everything a session does not
// use is nil, and a subscriber's outbound state exists only while it has
// messages in flight.
type session struct {
	// Ordered so that nothing pads: within the 256-byte size class
	// (TestConnFitsItsSizeClass).
	id     string
	e      *Engine
	online atomic.Bool // conn != nil, for readers that must not take mu (shared-group choice)
	mu     sync.Mutex  // guards everything below

	conn       *conn // nil while offline
	username   string
	subs       []sessSub
	inflight   []*outMsg          // sent (or to be resent), in send order
	queue      []*outMsg          // waiting for room in the window, in order
	inQoS2     []inQoS2           // inbound QoS 2 publishes received, until their PUBREL
	expiring   []*outMsg          // expired, waiting for its discards to be recorded (finishExpiry)
	byPID      map[uint16]*outMsg // inflight and queue by packet ID
	queueBytes int
	will       *willSpec
	willAt     int64  // unix ns the will is due (delayed will pending); 0 none
	offline    int64  // unix ns the session went offline; 0 online
	wheelAt    int64  // deadline of s's live entry in the wheel; 0 none
	generation uint64 // counts connections, to tell a stale one
	expiry     uint32 // session expiry interval, seconds; 0: ends with its connection
	nextPID    uint16
	protocol   byte
	ended      bool
	// resuming: a connection was attached and its CONNACK is not out yet;
	// new messages queue behind what the session had (resumeLocked).
	resuming bool
	// unstore: resumed without an expiry, the session must leave the
	// store once resumeLocked has read its queued messages back.
	unstore bool
}

// willSpec is a session's will: the message, its delay and its expiry
// interval (made absolute when it is published).
type willSpec struct {
	m      *Message
	delay  uint32
	expiry uint32
}

type sessSub struct {
	filter string
	o      topictree.Options
}

// outMsg is one message on its way to a session.
type outMsg struct {
	pid      uint16
	m        *Message // QoS and retain as this receiver gets them
	subIDs   []uint32
	sent     bool   // written at least once (resends carry DUP)
	released bool   // PUBREC received, PUBREL sent: awaiting PUBCOMP
	gen      uint64 // the session's generation (its connection) it was last written to
}

func (s *session) persistent() bool { return s.expiry > 0 }

func (s *session) findSub(filter string) int {
	for i := range s.subs {
		if s.subs[i].filter == filter {
			return i
		}
	}
	return -1
}

// window is how many messages may be in flight to the connected client:
// its Receive Maximum [MQTT-3.3.4-9] and the engine's bound.
func (s *session) windowLocked(e *Engine) int {
	w := e.opts.MaxInflight
	if c := s.conn; c != nil && c.recvMax > 0 && int(c.recvMax) < w {
		w = int(c.recvMax)
	}
	return w
}

// allocPIDLocked returns a packet ID no message of s uses [MQTT-2.2.1-3].
func (s *session) allocPIDLocked() (uint16, bool) {
	if len(s.byPID) >= 65535 {
		return 0, false
	}
	for {
		s.nextPID++
		if s.nextPID == 0 {
			s.nextPID = 1
		}
		if _, used := s.byPID[s.nextPID]; !used {
			return s.nextPID, true
		}
	}
}

// maxSessionMessages is the most QoS 1/2 messages a persistent session
// holds, in flight and queued: each has a packet identifier from its
// first queueing on (the session store keys it by it), and there are
// 65,535. A session that ends with its connection gives a message its
// identifier only when it enters the window (pidLazy), so its queue is
// bounded by the options alone.
const maxSessionMessages = 65535

// pidLazy reports whether s's queued messages wait without a packet
// identifier: nothing of s is stored, so nothing needs one before it is
// sent. A persistent session's messages have theirs from the start
// (adoptLocked gives them one when a session becomes persistent).
func (s *session) pidLazy() bool { return !s.persistent() }

// adoptLocked makes what a session holds persistent, when a connection
// with an expiry takes over a session that had none: its queued messages
// get their packet identifiers (those past the 65,535 are dropped and
// counted), and everything it holds is stored.
func (e *Engine) adoptLocked(s *session) {
	for _, om := range s.inflight {
		e.storeMessage(s, om)
	}
	keep := s.queue[:0]
	for i, om := range s.queue {
		if om.pid == 0 {
			pid, ok := s.allocPIDLocked()
			if !ok {
				for _, x := range s.queue[i:] {
					s.queueBytes -= x.m.payloadSize()
					e.m.droppedQueueFull.Add(1)
					e.discardAsync(s.id, x.m, false, "no packet identifier free")
				}
				clear(s.queue[i:])
				break
			}
			om.pid = pid
			if s.byPID == nil {
				s.byPID = make(map[uint16]*outMsg)
			}
			s.byPID[pid] = om
		}
		e.storeMessage(s, om)
		keep = append(keep, om)
	}
	s.queue = keep
}

// deliver hands m to session s with QoS qos (already min(message,
// subscription)) and retain flag; subIDs are the subscription identifiers
// that matched. It never blocks on the client: QoS 0 is dropped when the
// connection's write queue is full, QoS 1/2 waits in the session, bounded.
func (e *Engine) deliver(s *session, m *Message, qos byte, retain bool, subIDs []uint32) {
	now := time.Now()
	if m.expired(now.Unix()) {
		e.discard(s.id, m, true, "")
		return
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	c := s.conn
	if qos == 0 {
		s.mu.Unlock()
		if c == nil {
			e.m.droppedOffline.Add(1)
			e.discard(s.id, m, false, "QoS 0 is not queued for an offline client")
			return
		}
		c.sendQoS0(m, retain, subIDs)
		return
	}
	mm := m.withFlags(qos, retain)
	limit, bytesLimit := e.opts.MaxQueued, e.opts.MaxQueuedBytes
	if c != nil {
		limit, bytesLimit = e.opts.MaxQueuedOnline+s.windowLocked(e), e.opts.MaxQueuedOnlineBytes
	}
	direct := c != nil && !s.resuming && len(s.queue) == 0 && len(s.inflight) < s.windowLocked(e)
	lazy := s.pidLazy() && !direct
	if !lazy {
		// Every message a persistent session holds has its packet
		// identifier: it holds at most as many as there are.
		limit = min(limit, maxSessionMessages)
	}
	if len(s.queue)+len(s.inflight) >= limit || s.queueBytes+len(m.Payload) > bytesLimit {
		s.mu.Unlock()
		e.m.droppedQueueFull.Add(1)
		e.discard(s.id, m, false, "the client's queue is full")
		return
	}
	om := &outMsg{m: mm, subIDs: subIDs}
	if !lazy {
		pid, ok := s.allocPIDLocked()
		if !ok { // only if something holds identifiers besides the queue and the window
			s.mu.Unlock()
			e.m.droppedQueueFull.Add(1)
			e.discard(s.id, m, false, "no packet identifier free")
			return
		}
		om.pid = pid
		if s.byPID == nil {
			s.byPID = make(map[uint16]*outMsg)
		}
		s.byPID[pid] = om
	}
	if direct {
		s.inflight = append(s.inflight, om)
		e.storeMessage(s, om)
		c.sendOut(s, om)
	} else {
		s.queue = append(s.queue, om)
		s.queueBytes += len(m.Payload)
		e.storeMessage(s, om)
		if c == nil {
			e.stubLocked(s, om)
			if m.Expiry > 0 {
				e.watchSession(s)
			}
		}
	}
	s.mu.Unlock()
}

// stubLocked drops om's payload from memory when the store holds it (an
// offline persistent session): a million offline phones must not keep
// their queued commands in RAM.
func (e *Engine) stubLocked(s *session, om *outMsg) {
	if e.opts.Hooks.Sessions != nil && s.persistent() && !om.m.stub {
		om.m = stubOf(om.m)
	}
}

// unstubLocked reloads the payloads of s's stubs from the store (resume).
// On an error nothing changes: the stubs stay for a later resume.
// A message the store no longer has is dropped.
func (e *Engine) unstubLocked(s *session) error {
	st := e.opts.Hooks.Sessions
	if st == nil {
		return nil
	}
	has := false
	for _, om := range s.byPID {
		if om.m.stub {
			has = true
			break
		}
	}
	if !has {
		return nil
	}
	stored, err := st.LoadMessages(s.id)
	if err != nil {
		return fmt.Errorf("load the queued messages of %s: %w", s.id, err)
	}
	full := make(map[uint16]*Message, len(stored))
	for _, sm := range stored {
		full[sm.PID] = sm.Message
	}
	keep := func(list []*outMsg) []*outMsg {
		out := list[:0]
		for _, om := range list {
			if om.m.stub {
				m, ok := full[om.pid]
				if !ok {
					delete(s.byPID, om.pid)
					continue
				}
				mm := m.withFlags(om.m.QoS, om.m.Retain)
				om.m = mm
			}
			out = append(out, om)
		}
		return out
	}
	s.inflight = keep(s.inflight)
	s.queue = keep(s.queue)
	return nil
}

// fillWindowLocked moves queued messages into the window while there is
// room; expired ones are discarded [MQTT-3.3.2-5].
func (e *Engine) fillWindowLocked(s *session) {
	c := s.conn
	if c == nil {
		return
	}
	now := time.Now().Unix()
	w := s.windowLocked(e)
	for len(s.queue) > 0 && len(s.inflight) < w {
		om := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.queueBytes -= om.m.payloadSize()
		if om.m.expired(now) {
			if om.pid != 0 {
				delete(s.byPID, om.pid)
				e.forgetMessage(s, om.pid)
			}
			e.discardAsync(s.id, om.m, true, "")
			continue
		}
		if om.pid == 0 { // a lazy session's: its identifier now
			pid, ok := s.allocPIDLocked()
			if !ok { // cannot happen: the window is at most 65,535 and only it holds identifiers
				s.queue = append([]*outMsg{om}, s.queue...)
				s.queueBytes += om.m.payloadSize()
				break
			}
			om.pid = pid
			if s.byPID == nil {
				s.byPID = make(map[uint16]*outMsg)
			}
			s.byPID[pid] = om
		}
		s.inflight = append(s.inflight, om)
		c.sendOut(s, om)
	}
	if len(s.queue) == 0 {
		s.queue = nil
	}
	if len(s.byPID) == 0 && len(s.inflight) == 0 {
		s.byPID = nil
		s.inflight = s.inflight[:0:0]
	}
}

// acked ends the message with packet ID pid: PUBACK for QoS 1, PUBCOMP for
// QoS 2. A PUBREC moves it on to the release step instead (rec).
func (e *Engine) acked(s *session, pid uint16, typ byte, code ReasonCode) (found bool) {
	s.mu.Lock()
	om := s.byPID[pid]
	if om == nil || !om.sent {
		s.mu.Unlock()
		return false
	}
	switch typ {
	case packets.Puback:
		if om.m.QoS != 1 {
			s.mu.Unlock()
			return false
		}
	case packets.Pubrec:
		if om.m.QoS != 2 {
			s.mu.Unlock()
			return false
		}
		if code < 0x80 {
			om.released = true
			e.storeReleased(s, pid)
			s.mu.Unlock()
			return true
		}
		// A PUBREC with an error ends the flow [MQTT-4.3.3-4].
	case packets.Pubcomp:
		if om.m.QoS != 2 || !om.released {
			s.mu.Unlock()
			return false
		}
	}
	e.removeInflightLocked(s, om)
	e.fillWindowLocked(s)
	s.mu.Unlock()
	if om.m.Ref != "" && e.opts.Hooks.Delivery != nil {
		if code < 0x80 {
			e.opts.Hooks.Delivery.Delivered(s.id, om.m, om.pid)
		} else {
			e.opts.Hooks.Delivery.Discarded(s.id, om.m, false, "the client refused it: "+code.String())
		}
	}
	return true
}

func (e *Engine) removeInflightLocked(s *session, om *outMsg) {
	delete(s.byPID, om.pid)
	for i, x := range s.inflight {
		if x == om {
			copy(s.inflight[i:], s.inflight[i+1:])
			s.inflight[len(s.inflight)-1] = nil
			s.inflight = s.inflight[:len(s.inflight)-1]
			break
		}
	}
	e.forgetMessage(s, om.pid)
}

// resumeLocked sends what a resumed session has on its way to its new
// connection: unacknowledged PUBLISHes again with DUP, PUBRELs for those
// past PUBREC, in their original order [MQTT-4.4.0-1], then the queue.
// No more PUBLISHes than the window holds are in flight [MQTT-3.3.4-9]:
// what a restart restored, or a larger window left, waits at the head of
// the queue. An error is the store's (the payloads of an offline
// session's messages): nothing was sent, the session keeps them.
func (e *Engine) resumeLocked(s *session) error {
	s.resuming = false
	if err := e.unstubLocked(s); err != nil {
		return err
	}
	if s.unstore {
		// Its messages are in memory now; nothing of it may stay stored
		// [MQTT-3.1.2-23].
		s.unstore = false
		e.storeDelete(s)
	}
	c := s.conn
	w := s.windowLocked(e)
	keep, publishes := s.inflight[:0], 0
	var back []*outMsg
	for _, om := range s.inflight {
		if !om.released && publishes >= w {
			back = append(back, om)
			continue
		}
		keep = append(keep, om)
		if om.released {
			c.queueBytes(appendAck(nil, packets.Pubrel, om.pid, Success, c.version == 5), false)
			continue
		}
		publishes++
		if om.sent && om.gen == s.generation {
			continue // written to this connection already, behind its CONNACK
		}
		c.sendOut(s, om)
	}
	clear(s.inflight[len(keep):])
	s.inflight = keep
	if len(back) > 0 {
		for _, om := range back {
			s.queueBytes += om.m.payloadSize()
		}
		s.queue = append(back, s.queue...)
	}
	e.fillWindowLocked(s)
	return nil
}

// discard tells the Delivery hook a message with a Ref will never reach
// clientID.
func (e *Engine) discard(clientID string, m *Message, expired bool, reason string) {
	if m.Ref != "" && e.opts.Hooks.Delivery != nil {
		e.opts.Hooks.Delivery.Discarded(clientID, m, expired, reason)
	}
}

// discardAsync is discard from under a session's lock: the hook runs on
// the pool.
func (e *Engine) discardAsync(clientID string, m *Message, expired bool, reason string) {
	if m.Ref != "" && e.opts.Hooks.Delivery != nil {
		e.pool.submit(funcJob(func() { e.opts.Hooks.Delivery.Discarded(clientID, m, expired, reason) }))
	}
}

// endLocked ends s for good: its subscriptions leave the tree, its queued
// messages are discarded. The caller removes it from Engine.sessions.
func (e *Engine) endLocked(s *session, reason string) {
	if s.ended {
		return
	}
	s.ended = true
	for _, sub := range s.subs {
		e.subs.Remove(sub.filter, s)
		if e.opts.Hooks.Router != nil {
			e.opts.Hooks.Router.Unsubscribed(s.id, sub.filter)
		}
	}
	s.subs = nil
	for _, om := range s.inflight {
		e.discardAsync(s.id, om.m, false, reason)
	}
	for _, om := range s.queue {
		e.discardAsync(s.id, om.m, false, reason)
	}
	s.inflight, s.queue, s.byPID, s.queueBytes = nil, nil, nil, 0
	s.will = nil
	if (s.persistent() || s.unstore) && e.opts.Hooks.Sessions != nil {
		s.unstore = false
		e.opts.Hooks.Sessions.Delete(s.id)
	}
}

// routeOnlineLocked tells a RouterPresence that s got a connection or lost
// it; s's lock is held.
func (e *Engine) routeOnlineLocked(s *session, online bool) {
	if rp, ok := e.opts.Hooks.Router.(RouterPresence); ok {
		rp.Online(s.id, online)
	}
}

// nextDeadlineLocked is when an offline session must be looked at: its
// expiry or its delayed will.
func (s *session) nextDeadlineLocked() int64 {
	at := s.offline + int64(s.expiry)*int64(time.Second)
	if s.willAt > 0 && s.willAt < at {
		at = s.willAt
	}
	for _, om := range s.queue {
		if x := om.m.Expiry * int64(time.Second); x > 0 && x < at {
			at = x
		}
	}
	return at
}

// takeExpiredLocked takes the queued (never sent) messages whose expiry
// passed out of an offline session [MQTT-3.3.2-5].
func (e *Engine) takeExpiredLocked(s *session, nowSec int64) []*outMsg {
	var out []*outMsg
	keep := s.queue[:0]
	for _, om := range s.queue {
		if om.m.expired(nowSec) {
			out = append(out, om)
			s.queueBytes -= om.m.payloadSize()
			if om.pid != 0 {
				delete(s.byPID, om.pid)
			}
			continue
		}
		keep = append(keep, om)
	}
	s.queue = keep
	return out
}

// requeueLocked puts back messages whose discard could not be recorded
// durably (DurableDelivery): they are offered again at the next sweep.
func (e *Engine) requeueLocked(s *session, kept []*outMsg) {
	for _, om := range kept {
		if s.ended {
			return
		}
		if om.pid != 0 {
			if s.byPID == nil {
				s.byPID = map[uint16]*outMsg{}
			}
			s.byPID[om.pid] = om
		}
		s.queue = append(s.queue, om)
		s.queueBytes += om.m.payloadSize()
	}
}

// discardDurably reports discarded messages of s to the Delivery hook —
// durably, if it can — and forgets those it recorded; it returns those it
// could not (to be kept).
func (e *Engine) discardDurably(s *session, list []*outMsg, expired bool, reason string) (kept []*outMsg) {
	d := e.opts.Hooks.Delivery
	dd, durable := d.(DurableDelivery)
	for _, om := range list {
		if om.m.Ref != "" && durable {
			ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
			err := dd.DiscardedDurably(ctx, s.id, om.m, expired, reason)
			cancel()
			if err != nil {
				kept = append(kept, om)
				continue
			}
		} else if om.m.Ref != "" && d != nil {
			d.Discarded(s.id, om.m, expired, reason)
		}
		s.mu.Lock()
		e.forgetMessage(s, om.pid)
		s.mu.Unlock()
	}
	return kept
}

// tick is the wheel's call for an offline session: its delayed will, then
// its expiry.
func (s *session) tick(added, now int64) int64 {
	e := s.e
	s.mu.Lock()
	if s.wheelAt != added {
		s.mu.Unlock()
		return 0 // replaced by an earlier entry
	}
	if s.expiring != nil {
		pending := s.expiring
		s.expiring, s.wheelAt = nil, 0
		s.mu.Unlock()
		e.finishExpiry(s, pending)
		return 0
	}
	if s.ended || s.offline == 0 {
		s.wheelAt = 0
		s.mu.Unlock()
		return 0
	}
	if s.willAt > 0 && now >= s.willAt {
		w := s.will
		s.will, s.willAt = nil, 0
		e.storeClient(s) // spent: a restart must not send it again
		s.mu.Unlock()
		e.publishWill(s, w)
		s.mu.Lock()
		if s.wheelAt != added || s.ended || s.offline == 0 {
			s.mu.Unlock()
			return 0
		}
	}
	if now >= s.offline+int64(s.expiry)*int64(time.Second) {
		s.wheelAt = 0
		s.mu.Unlock()
		e.expire(s)
		return 0
	}
	if expired := e.takeExpiredLocked(s, now/int64(time.Second)); len(expired) > 0 {
		s.mu.Unlock()
		kept := e.discardDurably(s, expired, true, "")
		s.mu.Lock()
		e.requeueLocked(s, kept)
	}
	next := s.nextDeadlineLocked()
	if next <= now {
		next = now + int64(time.Second) // a discard not yet recorded: try again
	}
	s.wheelAt = next
	s.mu.Unlock()
	return next
}
