package engine

import (
	"context"
	"time"

	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// SessionStore persists the sessions that outlive their connection
// (session expiry > 0) and the retained messages. The engine writes
// through: every change, once, in the order it happened, from the
// goroutine that made it and under that session's lock — so a store must
// not call back into the engine from these methods, and should not block
// for long (a log append, not a network round trip per call).
type SessionStore interface {
	// Load returns everything stored; called once, by Start.
	Load() (sessions []StoredSession, retained []*Message, err error)

	// SaveClient stores a persistent session's client record (at CONNECT,
	// and when its expiry changes).
	SaveClient(r ClientRecord)
	// SaveOffline records when the session's connection ended.
	SaveOffline(clientID string, since time.Time)
	// Delete forgets the session and everything stored with it.
	Delete(clientID string)

	SaveSubscription(clientID, filter string, o topictree.Options)
	DeleteSubscription(clientID, filter string)

	// SaveMessage stores an outbound QoS 1/2 message given packet ID pid
	// (in flight or queued); DeleteMessage forgets it (acknowledged,
	// discarded); MessageReleased records its PUBREC (a PUBREL is resent
	// after a restart instead of the message).
	SaveMessage(clientID string, pid uint16, m *Message, subIDs []uint32)
	MessageReleased(clientID string, pid uint16)
	DeleteMessage(clientID string, pid uint16)

	// SaveInbound records (add) inbound QoS 2 packet ID pid, which is the
	// session's until its PUBREL [MQTT-4.3.3-8]: first taken under QoS2ID
	// id, before the Uplink sees the publish (so that after a crash before
	// its PUBREC a resend is checked against the core under id rather than
	// stored again), then answered (id 0: its PUBREC went out) — or forgets
	// it (add false: its PUBREL came, or it was refused).
	SaveInbound(clientID string, pid uint16, id uint64, add bool)

	// SaveRetained stores a retained message; an empty payload deletes the
	// topic's.
	SaveRetained(m *Message)

	// LoadMessages returns the stored outbound messages of clientID (as
	// Load would). The engine keeps only stubs of an offline session's
	// messages in memory (no payload) and reloads them when it resumes.
	LoadMessages(clientID string) ([]StoredMessage, error)
}

// SessionClaimer is a SessionStore shared by several nodes (NATS KV): at
// every CONNECT the engine claims the client's session before it resumes
// or discards it, and gets the session as stored when another node served
// it last (nil when this node holds it already, or there is none). When
// another node claims a session this node holds, the store calls
// Engine.Forget.
//
// Such a store makes its writes behind the calls (they come under the
// engine's locks), so the engine also waits, with Flush, for a stored
// session's writes before its CONNACK: a CONNACK with a session expiry
// means the session is in the store, and a node the client moves to at
// once finds it there (Session Present). Both may block (a network round
// trip).
type SessionClaimer interface {
	Claim(ctx context.Context, clientID string, clean bool) (*StoredSession, error)
	// Flush returns when the writes of clientID's session made so far are
	// stored, with an error if one of them could not be.
	Flush(ctx context.Context, clientID string) error
}

// InboundSyncer is a SessionStore that can make the record of an inbound
// QoS 2 publish durable on demand: the engine calls SyncInbound after
// SaveInbound and before the publish reaches the Uplink, for persistent
// sessions, so that no crash can leave the publish in the core without
// the record its resend is found by. An error refuses the publish.
type InboundSyncer interface {
	SyncInbound(ctx context.Context, clientID string) error
}

// ClientRecord is what a session keeps of its client.
type ClientRecord struct {
	ID       string
	Username string
	Protocol byte
	// Expiry is the session expiry interval, seconds.
	Expiry uint32
	// Will, with its delay and expiry interval (seconds), or nil.
	Will       *Message
	WillDelay  uint32
	WillExpiry uint32
}

// StoredSession is one session as Load returns it.
type StoredSession struct {
	Client ClientRecord
	// Offline is when its connection ended (zero: it was connected when the
	// last process stopped; it counts from the start then).
	Offline       time.Time
	Subscriptions []StoredSubscription
	Messages      []StoredMessage // in the order they were sent or queued
	Inbound       []StoredInbound
}

// StoredInbound is an inbound QoS 2 packet ID of a stored session, not
// yet released by its PUBREL.
type StoredInbound struct {
	PID uint16
	// QoS2ID is the ID its publish was taken under (Message.QoS2ID) while
	// its PUBREC had not gone out; 0 once it had.
	QoS2ID uint64
}

// StoredSubscription is one subscription of a stored session.
type StoredSubscription struct {
	Filter  string
	Options topictree.Options
}

// StoredMessage is one outbound message of a stored session.
type StoredMessage struct {
	PID      uint16
	Message  *Message
	SubIDs   []uint32
	Released bool
}

// The write-through calls. Each is a no-op without a store or for a clean
// session; the session's lock is held.

func (e *Engine) storeClient(s *session) {
	st := e.opts.Hooks.Sessions
	if st == nil || !s.persistent() {
		return
	}
	r := ClientRecord{ID: s.id, Username: s.username, Protocol: s.protocol, Expiry: s.expiry}
	if w := s.will; w != nil {
		r.Will, r.WillDelay, r.WillExpiry = w.m, w.delay, w.expiry
	}
	st.SaveClient(r)
}

func (e *Engine) storeOffline(s *session) {
	if st := e.opts.Hooks.Sessions; st != nil && s.persistent() {
		st.SaveOffline(s.id, time.Unix(0, s.offline))
	}
}

func (e *Engine) storeDelete(s *session) {
	if st := e.opts.Hooks.Sessions; st != nil {
		st.Delete(s.id)
	}
}

func (e *Engine) storeSub(s *session, filter string, o topictree.Options) {
	if st := e.opts.Hooks.Sessions; st != nil && s.persistent() {
		st.SaveSubscription(s.id, filter, o)
	}
}

func (e *Engine) storeUnsub(s *session, filter string) {
	if st := e.opts.Hooks.Sessions; st != nil && s.persistent() {
		st.DeleteSubscription(s.id, filter)
	}
}

func (e *Engine) storeMessage(s *session, om *outMsg) {
	if st := e.opts.Hooks.Sessions; st != nil && s.persistent() {
		st.SaveMessage(s.id, om.pid, om.m, om.subIDs)
	}
}

func (e *Engine) storeReleased(s *session, pid uint16) {
	if st := e.opts.Hooks.Sessions; st != nil && s.persistent() {
		st.MessageReleased(s.id, pid)
	}
}

func (e *Engine) forgetMessage(s *session, pid uint16) {
	if st := e.opts.Hooks.Sessions; st != nil && s.persistent() {
		st.DeleteMessage(s.id, pid)
	}
}

func (e *Engine) storeInbound(s *session, pid uint16, id uint64, add bool) {
	if st := e.opts.Hooks.Sessions; st != nil && s.persistent() {
		st.SaveInbound(s.id, pid, id, add)
	}
}

func (e *Engine) storeRetained(m *Message) {
	if st := e.opts.Hooks.Sessions; st != nil {
		st.SaveRetained(m)
	}
}

// restore rebuilds the stored sessions and retained messages (Start): every
// session starts offline, its subscriptions in the tree, its messages
// queued to be resent when it connects, its expiry counted from its stored
// offline time (or from now). A will whose connection died with the last
// process is due: after its delay counted from now [MQTT-3.1.2-8].
func (e *Engine) restore(st SessionStore) error {
	sessions, retained, err := st.Load()
	if err != nil {
		return err
	}
	for _, m := range retained {
		e.retained.set(m)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range sessions {
		e.installLocked(&sessions[i], true)
	}
	return nil
}

// adopt installs a session another node served last (SessionClaimer),
// replacing what this node had of it.
func (e *Engine) adopt(ss *StoredSession) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.replaceLocked(ss.Client.ID)
	e.installLocked(ss, false)
}

// replaceLocked drops what this engine has of clientID because a session
// another node stored replaces it: nothing is discarded or written, and a
// connection still on it gets DISCONNECT 0x8E and no will, as for Forget
// (e.mu is held).
func (e *Engine) replaceLocked(clientID string) {
	old := e.sessions[clientID]
	if old == nil {
		return
	}
	old.mu.Lock()
	c := old.conn
	e.forgetLocked(old)
	old.mu.Unlock()
	delete(e.sessions, clientID)
	if c != nil {
		c.takenOver.Store(true)
		c.kill(SessionTakenOver, reasonTakenOver, nil)
		e.m.takeovers.Add(1)
	}
}

// Adopt installs a session a SessionClaimer took over without a
// connection (the sessions of a node that is gone), as Start restores a
// stored one: offline, its expiry counted from its offline time, and —
// when its connection died with its node (Offline zero) — its will due
// after its delay. What this engine had of that client ID is replaced, as
// for a session adopted at CONNECT.
func (e *Engine) Adopt(ss *StoredSession) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.replaceLocked(ss.Client.ID)
	e.installLocked(ss, true)
}

// installLocked makes a stored session an offline session of this engine;
// e.mu is held. A will is due when the session's last connection ended with
// a process (restart) rather than cleanly stored offline.
func (e *Engine) installLocked(ss *StoredSession, atStart bool) {
	now := time.Now()
	r := ss.Client
	s := &session{id: r.ID, e: e, username: r.Username, protocol: r.Protocol, expiry: r.Expiry}
	s.offline = now.UnixNano()
	if !ss.Offline.IsZero() {
		s.offline = ss.Offline.UnixNano()
	}
	for _, sub := range ss.Subscriptions {
		s.subs = append(s.subs, sessSub{filter: sub.Filter, o: sub.Options})
		e.subs.Add(sub.Filter, s, sub.Options)
	}
	for _, sm := range ss.Messages {
		om := &outMsg{pid: sm.PID, m: sm.Message, subIDs: sm.SubIDs, sent: true, released: sm.Released}
		if s.byPID == nil {
			s.byPID = map[uint16]*outMsg{}
		}
		s.byPID[sm.PID] = om
		s.inflight = append(s.inflight, om)
		e.stubLocked(s, om)
	}
	// An inbound QoS 2 publish taken by an earlier process may or may not
	// be stored: its resend is handed to the Uplink as unsure, to look.
	for _, in := range ss.Inbound {
		s.inQoS2 = append(s.inQoS2, inQoS2{pid: in.PID, id: in.QoS2ID, answered: in.QoS2ID == 0, unsure: in.QoS2ID != 0})
	}
	// A will still stored is still due: its connection died with the last
	// process (Offline zero), or its delay had not run out when that
	// process stopped. Its delay counts from now.
	if r.Will != nil && atStart {
		s.will = &willSpec{m: r.Will, delay: r.WillDelay, expiry: r.WillExpiry}
		d := min(time.Duration(r.WillDelay)*time.Second, time.Duration(r.Expiry)*time.Second)
		s.willAt = now.Add(d).UnixNano()
	}
	e.sessions[s.id] = s
	for _, sub := range s.subs {
		if e.opts.Hooks.Router != nil {
			e.opts.Hooks.Router.Subscribed(s.id, sub.filter)
		}
	}
	s.mu.Lock()
	e.watchSession(s)
	s.mu.Unlock()
}

// forgetLocked drops a session without telling anyone: another node has
// it now (nothing discarded, nothing written).
func (e *Engine) forgetLocked(s *session) {
	s.ended = true
	for _, sub := range s.subs {
		e.subs.Remove(sub.filter, s)
		if e.opts.Hooks.Router != nil {
			e.opts.Hooks.Router.Unsubscribed(s.id, sub.filter)
		}
	}
	s.subs, s.inflight, s.queue, s.byPID, s.will = nil, nil, nil, nil, nil
	s.conn = nil
	if s.online.Swap(false) {
		e.routeOnlineLocked(s, false)
	}
}

// Forget drops clientID's session because another node claimed it
// (SessionClaimer): its connection here gets DISCONNECT 0x8E and no will;
// nothing is discarded or written.
func (e *Engine) Forget(clientID string) {
	e.mu.Lock()
	s := e.sessions[clientID]
	if s == nil {
		e.mu.Unlock()
		return
	}
	s.mu.Lock()
	c := s.conn
	e.forgetLocked(s)
	s.mu.Unlock()
	delete(e.sessions, clientID)
	e.mu.Unlock()
	if c != nil {
		c.takenOver.Store(true)
		c.kill(SessionTakenOver, reasonTakenOver, nil)
		e.m.takeovers.Add(1)
	}
}
