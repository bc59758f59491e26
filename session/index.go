package session

import (
	"fmt"
	"slices"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// The index is what a Store keeps in memory of what it stored: for every
// persistent session where each of its live records is, and the same for
// retained messages — never a value. Load and LoadMessages read the values
// back from the log or the bucket. Replay (Open, a session loaded from the
// bucket) and every write go through the same methods, so what a restart
// finds is what the running store had.
//
// Order carries meaning, and replay keeps it:
//   - a session's records count only after its client record; a client
//     record that marks a new session (clientNew) drops what came before
//     of that client ID;
//   - an offline time counts only after the session's latest client record
//     (every CONNECT writes one: the session is online again);
//   - a PUBREC marker counts only after its message's record;
//   - a session's messages are in the order of their records.

// loc is where a live record is: in the log its offset and size, in the
// bucket its revision and value size. The zero loc is none.
type loc struct {
	off int64
	n   uint32
}

func (l loc) ok() bool { return l.n > 0 }

type subLoc struct {
	filter string
	at     loc
}

type msgLoc struct {
	pid uint16
	at  loc
	rel loc // its PUBREC marker, if any
}

type pidLoc struct {
	pid uint16
	at  loc
}

// sess is one persistent session in the index.
type sess struct {
	id      string
	client  loc
	offline loc
	subs    []subLoc
	msgs    []msgLoc // in the order they were stored
	inbound []pidLoc
}

type index struct {
	sessions map[string]*sess
	retained map[string]loc
	live     int64 // bytes of live records
	messages int   // outbound messages stored, over every session
}

func newIndex() index {
	return index{sessions: map[string]*sess{}, retained: map[string]loc{}}
}

func (ix *index) kill(l loc) { ix.live -= int64(l.n) }
func (ix *index) keep(l loc) { ix.live += int64(l.n) }

// putClient indexes a client record of id; fresh (or no session yet)
// starts a new session.
func (ix *index) putClient(id string, at loc, fresh bool) {
	ss := ix.sessions[id]
	if ss != nil && fresh {
		ix.dropSession(id)
		ss = nil
	}
	if ss == nil {
		ss = &sess{id: id}
		ix.sessions[id] = ss
	}
	ix.kill(ss.client)
	ix.kill(ss.offline)
	ss.client, ss.offline = at, loc{}
	ix.keep(at)
}

// dropSession forgets session id and every record of it.
func (ix *index) dropSession(id string) *sess {
	ss := ix.sessions[id]
	if ss == nil {
		return nil
	}
	ix.kill(ss.client)
	ix.kill(ss.offline)
	for _, s := range ss.subs {
		ix.kill(s.at)
	}
	for _, m := range ss.msgs {
		ix.kill(m.at)
		ix.kill(m.rel)
	}
	for _, q := range ss.inbound {
		ix.kill(q.at)
	}
	ix.messages -= len(ss.msgs)
	delete(ix.sessions, id)
	return ss
}

// The put methods report whether the record is live: false for a session
// the index does not have.

func (ix *index) putOffline(id string, at loc) bool {
	ss := ix.sessions[id]
	if ss == nil {
		return false
	}
	ix.kill(ss.offline)
	ss.offline = at
	ix.keep(at)
	return true
}

func (ix *index) putSub(id, filter string, at loc) bool {
	ss := ix.sessions[id]
	if ss == nil {
		return false
	}
	if i := ss.findSub(filter); i >= 0 {
		ix.kill(ss.subs[i].at)
		ss.subs[i].at = at
	} else {
		ss.subs = append(ss.subs, subLoc{filter: filter, at: at})
	}
	ix.keep(at)
	return true
}

func (ix *index) delSub(id, filter string) bool {
	ss := ix.sessions[id]
	if ss == nil {
		return false
	}
	i := ss.findSub(filter)
	if i < 0 {
		return false
	}
	ix.kill(ss.subs[i].at)
	ss.subs = slices.Delete(ss.subs, i, i+1)
	if len(ss.subs) == 0 {
		ss.subs = nil
	}
	return true
}

func (ix *index) putMsg(id string, pid uint16, at loc) bool {
	ss := ix.sessions[id]
	if ss == nil {
		return false
	}
	ix.delMsg(id, pid)
	ss.msgs = append(ss.msgs, msgLoc{pid: pid, at: at})
	ix.messages++
	ix.keep(at)
	return true
}

// delMsg forgets message pid of id; it returns its entry.
func (ix *index) delMsg(id string, pid uint16) (msgLoc, bool) {
	ss := ix.sessions[id]
	if ss == nil {
		return msgLoc{}, false
	}
	i := ss.findMsg(pid)
	if i < 0 {
		return msgLoc{}, false
	}
	m := ss.msgs[i]
	ix.kill(m.at)
	ix.kill(m.rel)
	ss.msgs = slices.Delete(ss.msgs, i, i+1)
	if len(ss.msgs) == 0 {
		ss.msgs = nil
	}
	ix.messages--
	return m, true
}

func (ix *index) putReleased(id string, pid uint16, at loc) bool {
	ss := ix.sessions[id]
	if ss == nil {
		return false
	}
	i := ss.findMsg(pid)
	if i < 0 {
		return false
	}
	ix.kill(ss.msgs[i].rel)
	ss.msgs[i].rel = at
	ix.keep(at)
	return true
}

func (ix *index) delReleased(id string, pid uint16) bool {
	ss := ix.sessions[id]
	if ss == nil {
		return false
	}
	i := ss.findMsg(pid)
	if i < 0 || !ss.msgs[i].rel.ok() {
		return false
	}
	ix.kill(ss.msgs[i].rel)
	ss.msgs[i].rel = loc{}
	return true
}

func (ix *index) putInbound(id string, pid uint16, at loc) bool {
	ss := ix.sessions[id]
	if ss == nil {
		return false
	}
	ix.delInbound(id, pid)
	ss.inbound = append(ss.inbound, pidLoc{pid: pid, at: at})
	ix.keep(at)
	return true
}

func (ix *index) delInbound(id string, pid uint16) bool {
	ss := ix.sessions[id]
	if ss == nil {
		return false
	}
	for i, q := range ss.inbound {
		if q.pid == pid {
			ix.kill(q.at)
			ss.inbound = slices.Delete(ss.inbound, i, i+1)
			if len(ss.inbound) == 0 {
				ss.inbound = nil
			}
			return true
		}
	}
	return false
}

func (ix *index) putRetained(topic string, at loc) {
	ix.delRetained(topic)
	ix.retained[topic] = at
	ix.keep(at)
}

func (ix *index) delRetained(topic string) bool {
	old, ok := ix.retained[topic]
	if !ok {
		return false
	}
	ix.kill(old)
	delete(ix.retained, topic)
	return true
}

// apply indexes one record read back (replay of the log, a session loaded
// from the bucket) and reports whether it is live. Values are not decoded
// here, except the flags byte of a client record: Load decodes the live
// ones.
func (ix *index) apply(op byte, k key, value []byte, at loc) bool {
	put := op == opPut
	switch k.kind {
	case kClient:
		if !put {
			ix.dropSession(k.id)
			return false
		}
		ix.putClient(k.id, at, freshClient(value))
		return true
	case kOffline:
		if put {
			return ix.putOffline(k.id, at)
		}
		if ss := ix.sessions[k.id]; ss != nil {
			ix.kill(ss.offline)
			ss.offline = loc{}
		}
	case kSub:
		if put {
			return ix.putSub(k.id, k.sub, at)
		}
		ix.delSub(k.id, k.sub)
	case kMessage:
		if put {
			return ix.putMsg(k.id, k.pid, at)
		}
		ix.delMsg(k.id, k.pid)
	case kReleased:
		if put {
			return ix.putReleased(k.id, k.pid, at)
		}
		ix.delReleased(k.id, k.pid)
	case kInbound:
		if put {
			return ix.putInbound(k.id, k.pid, at)
		}
		ix.delInbound(k.id, k.pid)
	case kRetained:
		if put {
			ix.putRetained(k.id, at)
			return true
		}
		ix.delRetained(k.id)
	}
	return false
}

func (ss *sess) findSub(filter string) int {
	for i := range ss.subs {
		if ss.subs[i].filter == filter {
			return i
		}
	}
	return -1
}

func (ss *sess) findMsg(pid uint16) int {
	for i := range ss.msgs {
		if ss.msgs[i].pid == pid {
			return i
		}
	}
	return -1
}

// getter reads the value of the live record of key k at at.
type getter func(k string, at loc) ([]byte, error)

// build reads session ss back as the engine wants it. A client record that
// does not decode fails the session; any other record that does not is
// skipped and returned in bad (its session loads without it).
func build(ss *sess, get getter) (out engine.StoredSession, bad []error, err error) {
	v, err := get(clientKey(ss.id), ss.client)
	if err == nil {
		out.Client, err = decodeClient(ss.id, v)
	}
	if err != nil {
		return engine.StoredSession{}, nil, fmt.Errorf("client record of %q: %w", ss.id, err)
	}
	if ss.offline.ok() {
		v, err := get(offlineKey(ss.id), ss.offline)
		if err == nil {
			out.Offline, err = decodeOffline(v)
		}
		if err != nil {
			bad = append(bad, fmt.Errorf("offline time of %q: %w", ss.id, err))
		}
	}
	for _, s := range ss.subs {
		v, err := get(subKey(ss.id, s.filter), s.at)
		var sub engine.StoredSubscription
		if err == nil {
			sub.Filter, sub.Options, err = decodeSub(v)
		}
		if err == nil && sub.Filter != s.filter {
			err = fmt.Errorf("%w: subscription to %q under the key of %q", ErrBadKey, sub.Filter, s.filter)
		}
		if err != nil {
			bad = append(bad, fmt.Errorf("subscription %q of %q: %w", s.filter, ss.id, err))
			continue
		}
		out.Subscriptions = append(out.Subscriptions, sub)
	}
	msgs, mbad := buildMessages(ss, get)
	out.Messages, bad = msgs, append(bad, mbad...)
	for _, q := range ss.inbound {
		v, err := get(pidKey(kInbound, ss.id, q.pid), q.at)
		in := engine.StoredInbound{PID: q.pid}
		if err == nil {
			in.QoS2ID, err = decodeInbound(v)
		}
		if err != nil {
			bad = append(bad, fmt.Errorf("inbound QoS 2 packet ID %d of %q: %w", q.pid, ss.id, err))
			continue
		}
		out.Inbound = append(out.Inbound, in)
	}
	return out, bad, nil
}

// buildMessages reads the outbound messages of ss back, in order.
func buildMessages(ss *sess, get getter) (out []engine.StoredMessage, bad []error) {
	for _, ml := range ss.msgs {
		v, err := get(pidKey(kMessage, ss.id, ml.pid), ml.at)
		var sm engine.StoredMessage
		if err == nil {
			sm.Message, sm.SubIDs, err = decodeMessage(v)
		}
		if err == nil && sm.Message.QoS == 0 {
			err = fmt.Errorf("%w: a stored message of QoS 0", ErrBadValue)
		}
		if err != nil {
			bad = append(bad, fmt.Errorf("message %d of %q: %w", ml.pid, ss.id, err))
			continue
		}
		sm.PID, sm.Released = ml.pid, ml.rel.ok() && sm.Message.QoS == 2
		out = append(out, sm)
	}
	return out, bad
}

// eachLoc calls fn for every live record's loc, in place (compaction
// moves them).
func (ix *index) eachLoc(fn func(*loc)) {
	for _, ss := range ix.sessions {
		fn(&ss.client)
		if ss.offline.ok() {
			fn(&ss.offline)
		}
		for i := range ss.subs {
			fn(&ss.subs[i].at)
		}
		for i := range ss.msgs {
			fn(&ss.msgs[i].at)
			if ss.msgs[i].rel.ok() {
				fn(&ss.msgs[i].rel)
			}
		}
		for i := range ss.inbound {
			fn(&ss.inbound[i].at)
		}
	}
	for topic, l := range ix.retained {
		fn(&l)
		ix.retained[topic] = l
	}
}
