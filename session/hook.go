package session

import (
	"bytes"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// ID implements mqtt.Hook.
func (s *Store) ID() string { return "ferrymq-session" }

// Provides implements mqtt.Hook.
func (s *Store) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnSessionEstablish, mqtt.OnSessionEstablished, mqtt.OnDisconnect, mqtt.OnSubscribed, mqtt.OnUnsubscribed,
		mqtt.OnRetainMessage, mqtt.OnRetainedExpired, mqtt.OnWillSent, mqtt.OnClientExpired, mqtt.OnPublished,
		mqtt.OnQosPublish, mqtt.OnQosComplete, mqtt.OnQosDropped,
		mqtt.StoredClients, mqtt.StoredSubscriptions, mqtt.StoredInflightMessages, mqtt.StoredRetainedMessages,
	}, []byte{b})
}

// Stop implements mqtt.Hook: mochi calls it when the server closes.
func (s *Store) Stop() error { return s.Close() }

// persistent reports whether cl's session outlives its connection: MQTT 5
// with a session expiry, MQTT 3 without clean session [MQTT-3.1.2-4]. Only
// those are stored; a clean session costs the store nothing.
func persistent(cl *mqtt.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryInterval > 0
	}
	return !cl.Properties.Clean
}

func clientRecord(cl *mqtt.Client) *storage.Client {
	p := cl.Properties.Props
	return &storage.Client{
		ID: cl.ID, T: storage.ClientKey, Remote: cl.Net.Remote, Listener: cl.Net.Listener,
		Username: cl.Properties.Username, Clean: cl.Properties.Clean, ProtocolVersion: cl.Properties.ProtocolVersion,
		Properties: storage.ClientProperties{
			SessionExpiryInterval: p.SessionExpiryInterval, SessionExpiryIntervalFlag: p.SessionExpiryIntervalFlag,
			AuthenticationMethod: p.AuthenticationMethod, AuthenticationData: p.AuthenticationData,
			RequestProblemInfo: p.RequestProblemInfo, RequestProblemInfoFlag: p.RequestProblemInfoFlag,
			RequestResponseInfo: p.RequestResponseInfo, ReceiveMaximum: p.ReceiveMaximum,
			TopicAliasMaximum: p.TopicAliasMaximum, User: p.User, MaximumPacketSize: p.MaximumPacketSize,
		},
		Will: storage.ClientWill(cl.Properties.Will),
	}
}

// putClientLocked writes cl's client record (creating its session).
func (s *Store) putClientLocked(cl *mqtt.Client) {
	b, err := clientRecord(cl).MarshalBinary()
	if err != nil {
		s.log.Error().Err(err).Str("client", cl.ID).Msg("encode session record")
		return
	}
	ss := s.sessions[cl.ID]
	if ss == nil {
		ss = &sess{id: cl.ID}
		s.sessions[cl.ID] = ss
	}
	ss.client = s.replaceLocked(ss.client, kClient+cl.ID, b)
	ss.user, ss.userKnown = string(cl.Properties.Username), true
}

// OnSessionEstablish runs after authentication, before mochi looks for the
// session to resume: a parked session is rebuilt as a mochi client here
// (or dropped, for a clean start). On a bucket (OpenKV) the node first
// claims the session and, unless it already serves it, loads it from the
// bucket as a parked one (owner.go). A persistent session is then stored
// before its CONNACK is sent, so a session the client was told about
// survives a crash right after; a clean one drops what an earlier
// persistent session of that ID left.
func (s *Store) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	var expired []discard
	var stale []*mqtt.Client
	var cur jetstream.KeyValueEntry
	var curErr error
	if s.kv != nil {
		cur, curErr = s.kv.getOwner(cl.ID) // a clean session's only cost; read without the lock
	}
	s.mu.Lock()
	s.connecting[cl.ID] = cl
	if s.kv != nil {
		stale, expired = s.claimLocked(cl, cur, curErr)
	}
	if ss := s.sessions[cl.ID]; ss != nil && ss.parked && s.server != nil {
		switch {
		case ss.expired(time.Now().Unix()):
			// Its expiry passed (the sweep has not ended it yet, or is
			// still storing its messages' receipts): the client finds no
			// session.
			expired = s.discardMsgsLocked(ss, expired, func(*msgRef) bool { return true }, true, reasonSessionExpired)
			s.dropLocked(ss, true) // (this connection keeps the claim on a bucket)
		case pk.Connect.Clean:
			expired = s.discardMsgsLocked(ss, expired, func(*msgRef) bool { return true }, false, "the session was discarded by a clean start")
			s.dropLocked(ss, true)
		default:
			expired = append(expired, s.hydrateLocked(ss, cl.Net.Listener)...)
		}
	}
	if persistent(cl) {
		s.putClientLocked(cl)
	} else {
		if ss := s.sessions[cl.ID]; ss != nil {
			s.dropLocked(ss, true)
		}
		s.b.release(cl.ID)
	}
	if s.kv != nil {
		s.kv.preload = nil
	}
	s.mu.Unlock()
	s.disconnect(stale)
	s.tell(expired)
}

// OnSessionEstablished stores the subscriptions a resumed session brought
// (those it had before it was stored: MQTT 5 session expiry set later, or
// while the bucket was unreachable).
func (s *Store) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.connecting[cl.ID] == cl {
		delete(s.connecting, cl.ID)
	}
	ss := s.sessions[cl.ID]
	if ss == nil || !persistent(cl) {
		return
	}
	for _, sub := range cl.State.Subscriptions.GetAll() {
		if i := ss.findSub(sub.Filter); (i < 0 || ss.subs[i].e.n == 0) && !strings.HasPrefix(sub.Filter, mqtttopic.Internal) {
			s.putSubLocked(ss, sub) // not the internal ones: the bridge gives them at every connect
		}
	}
}

// OnWillSent stores the client with its will spent (mochi clears the will
// flag before this hook runs), so a restart does not send it again, and
// queues the will for parked subscribers. The gateway marks the wills it
// injects itself (Connect.WillFlag): those reach OnPublished too.
func (s *Store) OnWillSent(cl *mqtt.Client, pk packets.Packet) {
	if persistent(cl) {
		s.mu.Lock()
		if ss := s.sessions[cl.ID]; ss != nil && !ss.parked {
			s.putClientLocked(cl)
		}
		s.mu.Unlock()
	}
	if !pk.Connect.WillFlag {
		s.routePublish(pk)
	}
}

// OnPublished queues what was published for the parked sessions it
// reaches (mochi delivered it to the rest).
func (s *Store) OnPublished(_ *mqtt.Client, pk packets.Packet) {
	s.routePublish(pk)
}

// OnDisconnect forgets a session that ends with its connection, and queues
// a persistent one for parking.
func (s *Store) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.connecting[cl.ID] == cl {
		delete(s.connecting, cl.ID)
	}
	if cl.IsTakenOver() {
		return
	}
	if expire {
		if ss := s.sessions[cl.ID]; ss != nil && !ss.parked {
			s.endLocked(ss)
		}
		return
	}
	if ss := s.sessions[cl.ID]; ss != nil && !ss.parked {
		s.parkq[cl] = time.Now()
	}
}

// OnClientExpired forgets a session whose expiry passed (one mochi still
// held: a parked one expires in sweep).
func (s *Store) OnClientExpired(cl *mqtt.Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.parkq, cl)
	if ss := s.sessions[cl.ID]; ss != nil && !ss.parked {
		s.endLocked(ss)
	}
}

func (s *Store) putSubLocked(ss *sess, sub packets.Subscription) {
	b, err := subRecord(ss.id, sub).MarshalBinary()
	if err != nil {
		s.log.Error().Err(err).Str("client", ss.id).Msg("encode subscription record")
		return
	}
	r := newSubRef(sub)
	key := subKey(ss.id, sub.Filter)
	if i := ss.findSub(sub.Filter); i >= 0 {
		r.e = s.replaceLocked(ss.subs[i].e, key, b)
		ss.subs[i] = r
		return
	}
	r.e, _ = s.putLocked(key, b)
	ss.subs = append(ss.subs, r)
}

// OnSubscribed stores a persistent client's granted subscriptions.
func (s *Store) OnSubscribed(cl *mqtt.Client, pk packets.Packet, codes []byte) {
	if !persistent(cl) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[cl.ID]
	if ss == nil || ss.parked {
		return
	}
	for i, f := range pk.Filters {
		if i < len(codes) && codes[i] <= 2 {
			f.Qos = codes[i]
			s.putSubLocked(ss, f)
		}
	}
}

// OnUnsubscribed forgets subscriptions.
func (s *Store) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[cl.ID]
	if ss == nil || ss.parked {
		return
	}
	for _, f := range pk.Filters {
		if i := ss.findSub(f.Filter); i >= 0 {
			s.deleteLocked(ss.subs[i].e, subKey(ss.id, f.Filter))
			ss.subs = append(ss.subs[:i], ss.subs[i+1:]...)
		}
	}
}

// OnQosPublish stores an outbound QoS 1/2 message of a persistent session
// until the client acknowledges it: after a restart it is resent (DUP).
func (s *Store) OnQosPublish(cl *mqtt.Client, pk packets.Packet, sent int64, _ int) {
	if pk.FixedHeader.Type != packets.Publish || !persistent(cl) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[cl.ID]
	if ss == nil || ss.parked {
		return // a parked session's queue is written by queueLocked
	}
	key := inflightKey(cl.ID, pk.PacketID)
	v, err := encodeMsg(messageRecord(key, cl.ID, pk, sent), pk.Expiry)
	if err != nil {
		s.log.Error().Err(err).Str("client", cl.ID).Msg("encode inflight message")
		return
	}
	ref := msgRef{expiry: pk.Expiry, size: int32(len(pk.Payload)), pid: pk.PacketID}
	if i := ss.findMsg(pk.PacketID); i >= 0 {
		ref.e = s.replaceLocked(ss.msgs[i].e, key, v)
		ss.bytes += int(ref.size) - int(ss.msgs[i].size)
		ss.msgs[i] = ref
		return
	}
	ref.e, _ = s.putLocked(key, v)
	ss.msgs = append(ss.msgs, ref)
	ss.bytes += int(ref.size)
}

// InboundQoS2 stores that a persistent session's QoS 2 publish with
// packet ID pid was received and answered PUBREC (the bridge takes QoS 2
// over from mochi, so no hook sees it): after a restart the client's
// PUBREL finds it and gets a successful PUBCOMP [MQTT-4.3.3-8]. Removed by
// OnQosComplete when the PUBCOMP goes out.
func (s *Store) InboundQoS2(clientID string, pid uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[clientID]
	if ss == nil || ss.parked {
		return
	}
	key := inflightKey(clientID, pid)
	now := time.Now().Unix()
	v, err := encodeMsg(&storage.Message{ID: key, T: storage.InflightKey, Client: clientID, PacketID: pid, Created: now,
		FixedHeader: packets.FixedHeader{Type: packets.Pubrec}}, 0)
	if err != nil {
		return
	}
	ref := msgRef{pid: pid}
	if i := ss.findMsg(pid); i >= 0 {
		ref.e = s.replaceLocked(ss.msgs[i].e, key, v)
		ss.bytes -= int(ss.msgs[i].size)
		ss.msgs[i] = ref
		return
	}
	ref.e, _ = s.putLocked(key, v)
	ss.msgs = append(ss.msgs, ref)
}

// OnQosComplete forgets an acknowledged message.
func (s *Store) OnQosComplete(cl *mqtt.Client, pk packets.Packet) { s.forgetMsg(cl, pk.PacketID) }

// OnQosDropped forgets a message mochi gave up on — not one a session
// takeover moves to the new connection (mochi drops it from the old
// client after copying it).
func (s *Store) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if !cl.IsTakenOver() {
		s.forgetMsg(cl, pk.PacketID)
	}
}

func (s *Store) forgetMsg(cl *mqtt.Client, pid uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[cl.ID]
	if ss == nil || ss.parked {
		return
	}
	if i := ss.findMsg(pid); i >= 0 {
		s.deleteLocked(ss.msgs[i].e, inflightKey(ss.id, pid))
		ss.bytes -= int(ss.msgs[i].size)
		ss.msgs = append(ss.msgs[:i], ss.msgs[i+1:]...)
	}
}

// OnRetainMessage stores (or, r == -1, forgets) a retained message.
func (s *Store) OnRetainMessage(cl *mqtt.Client, pk packets.Packet, r int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := retainedKey(pk.TopicName)
	old := s.retained[pk.TopicName]
	if r == -1 {
		if old != nil {
			written := s.deleteRetainedLocked(*old, pk.TopicName)
			delete(s.retained, pk.TopicName)
			if s.kv != nil {
				s.retainedWrittenLocked(pk.TopicName, nil, written)
			}
		}
		return
	}
	m := messageRecord(k, cl.ID, pk, 0)
	m.T = storage.RetainedKey
	b, err := m.MarshalBinary()
	if err != nil {
		s.log.Error().Err(err).Str("topic", pk.TopicName).Msg("encode retained message")
		return
	}
	var prev entry
	if old != nil {
		prev = *old
	}
	e := s.replaceLocked(prev, k, b)
	s.retained[pk.TopicName] = &e
	if s.kv != nil {
		s.retainedWrittenLocked(pk.TopicName, &pk, e.n > 0)
	}
}

// deleteRetainedLocked deletes topic's retained message, whose record is
// at e, and reports whether the delete was written.
func (s *Store) deleteRetainedLocked(e entry, topic string) bool {
	s.live -= int64(e.n)
	return s.b.del(retainedKey(topic), e) == nil
}

// OnRetainedExpired forgets an expired retained message.
func (s *Store) OnRetainedExpired(topic string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.retained[topic]; old != nil {
		written := s.deleteRetainedLocked(*old, topic)
		delete(s.retained, topic)
		if s.kv != nil {
			s.retainedWrittenLocked(topic, nil, written)
		}
	}
}

// StoredClients returns the stored sessions that are not parked (those
// with a pending will, or all of them when no server was attached).
func (s *Store) StoredClients() ([]storage.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []storage.Client
	for _, ss := range s.sessions {
		if ss.parked {
			continue
		}
		c, err := s.clientLocked(ss)
		if err != nil {
			s.log.Warn().Err(err).Str("client", ss.id).Msg("stored session does not load; dropped")
			s.endLocked(ss)
			continue
		}
		out = append(out, c)
	}
	return out, nil
}

// StoredSubscriptions returns the subscriptions of StoredClients' sessions.
func (s *Store) StoredSubscriptions() ([]storage.Subscription, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []storage.Subscription
	for _, ss := range s.sessions {
		if ss.parked {
			continue
		}
		for i := range ss.subs {
			out = append(out, *subRecord(ss.id, ss.subs[i].subscription()))
		}
	}
	return out, nil
}

// StoredInflightMessages returns the queued messages of StoredClients'
// sessions.
func (s *Store) StoredInflightMessages() ([]storage.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []storage.Message
	for _, ss := range s.sessions {
		if ss.parked {
			continue
		}
		for _, m := range ss.msgs {
			rec, _, err := s.msgAtLocked(ss.id, &m)
			if err != nil {
				s.log.Warn().Err(err).Str("client", ss.id).Msg("message record does not load; dropped")
				continue
			}
			out = append(out, rec)
		}
	}
	return out, nil
}

// StoredRetainedMessages returns the retained messages. On a bucket they
// were read at OpenKV; from this call on, the watcher applies those set
// or cleared on other nodes to the attached mochi server directly.
func (s *Store) StoredRetainedMessages() ([]storage.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kv != nil {
		return s.storedRetainedLocked(), nil
	}
	var out []storage.Message
	for topic, e := range s.retained {
		var m storage.Message
		v, err := s.readLocked(retainedKey(topic), *e)
		if err == nil {
			err = m.UnmarshalBinary(v)
		}
		if err != nil {
			s.log.Warn().Err(err).Str("topic", topic).Msg("retained record does not load; dropped")
			continue
		}
		out = append(out, m)
	}
	return out, nil
}

// ClientClosed is the gateway's call for a connection that ended in a
// recovered panic: the gateway drops its session from mochi, and so does
// the store.
func (s *Store) ClientClosed(cl *mqtt.Client, _ string, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.parkq, cl)
	if s.connecting[cl.ID] == cl {
		delete(s.connecting, cl.ID)
	}
	if ss := s.sessions[cl.ID]; ss != nil && !ss.parked && s.server != nil {
		if cur, ok := s.server.Clients.Get(cl.ID); !ok || cur == cl {
			s.endLocked(ss)
		}
	}
}
