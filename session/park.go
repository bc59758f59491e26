package session

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// Parking. mochi keeps an offline persistent session as a full Client
// (queues, maps, buffers: ≈ 10 KB) holding its queued messages in memory.
// A million parked cars must not cost that, so ParkAfter after its
// connection ended the store takes the session out of mochi: its
// subscriptions leave mochi's topic tree and are filed in the store's
// routes; what is published for it afterwards (OnPublished, OnWillSent, or
// Enqueue for point-to-point) is appended to the session log and only the
// record's offset stays in memory. When the client connects again
// (OnSessionEstablish, before mochi looks for the session) the store
// rebuilds the mochi Client from disk — subscriptions, queued messages with
// their packet IDs — and mochi resumes it as if it had never left.
//
// Sessions with a pending will (a will delay still running) stay mochi's
// until the will is sent: mochi's will timer needs the client.

// Attach gives the store the server it parks sessions out of and restores
// them into, and parks every session loaded at Open except those with a
// pending will (mochi gets those through StoredClients, for the gateway to
// publish the will). Call once, before serving.
func (s *Store) Attach(server *mqtt.Server) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.server = server
	for _, ss := range s.sessions {
		c, err := s.clientLocked(ss)
		if err != nil {
			s.log.Warn().Err(err).Str("client", ss.id).Msg("stored session does not load; dropped")
			s.endLocked(ss)
			continue
		}
		if c.Will.Flag == 1 {
			continue // mochi gets it back (StoredClients) for its will
		}
		gone := s.openedAt // it was online when the previous process ended
		if ss.gone.n > 0 {
			if v, err := s.readLocked(kGone+ss.id, ss.gone); err == nil && len(v) == 8 {
				gone = int64(binary.BigEndian.Uint64(v))
			}
		}
		s.parkSessLocked(ss, gone, expiryInterval(c.ProtocolVersion, clientProps(c), s.maxExpiry()))
	}
	if s.parked > 0 {
		s.log.Info().Int("parked", s.parked).Int("queued", s.queued).Msg("sessions parked")
	}
}

// Stats are the store's figures. On a bucket (OpenKV) the sessions are
// those this node holds.
type Stats struct {
	Sessions  int   // persistent sessions stored (online, offline and parked)
	Parked    int   // sessions parked (offline, out of mochi)
	Queued    int   // messages queued in parked sessions
	Retained  int   // retained messages
	LogBytes  int64 // size of the session log (0 on a bucket)
	LiveBytes int64 // bytes of live records in it (on a bucket: of the values this node holds)
	// On a bucket: writes that did not happen, by reason ("unavailable",
	// "too_large", "fenced", "not_owner"), and sessions another node took
	// over from this one.
	WriteErrors map[string]int64
	TakenOver   int64
}

// Stats returns the current figures.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Sessions: len(s.sessions), Parked: s.parked, Queued: s.queued, Retained: len(s.retained),
		LogBytes: s.b.size(), LiveBytes: s.live}
	if s.kv != nil {
		st.WriteErrors, st.TakenOver = s.kv.errs(), s.kv.takenOver.Load()
	}
	return st
}

// Parked reports whether clientID has a parked session here.
func (s *Store) Parked(clientID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[clientID]
	return ss != nil && ss.parked
}

// ParkedFilters returns, for every session parked on this node, the
// filters of its plain (not shared) subscriptions: what another node's
// MQTT publishes must reach here to be queued for it (gateway/cluster).
func (s *Store) ParkedFilters() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]string{}
	for id, ss := range s.sessions {
		if !ss.parked {
			continue
		}
		for _, sub := range ss.subs {
			if sub.flags&subShared == 0 {
				out[id] = append(out[id], sub.filter)
			}
		}
	}
	return out
}

// Owner returns the username a stored session of clientID was
// authenticated with (a parked one is read from disk; on a bucket, one
// this node does not hold is read from the bucket).
func (s *Store) Owner(clientID string) (string, bool) {
	s.mu.Lock()
	ss := s.sessions[clientID]
	if ss == nil {
		s.mu.Unlock()
		if s.kv != nil {
			return s.kv.ownerRemote(clientID) // a network read: not under the lock
		}
		return "", false
	}
	defer s.mu.Unlock()
	c, err := s.clientLocked(ss)
	if err != nil {
		return "", true // stored but unreadable: owned by nobody anyone can prove to be
	}
	return string(c.Username), true
}

// Enqueue queues a QoS 1/2 publish for a parked session (point-to-point
// messages reach a client whatever its subscriptions). pk's QoS, topic,
// origin, properties and absolute Expiry are kept; its packet ID is the
// session's.
func (s *Store) Enqueue(clientID string, pk packets.Packet) error {
	if pk.FixedHeader.Qos == 0 {
		return fmt.Errorf("session: enqueue QoS 0 for %q: %w", clientID, ErrQueueFull)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[clientID]
	if ss == nil || !ss.parked {
		return ErrNotParked
	}
	return s.queueLocked(ss, pk, time.Now().Unix())
}

// queueLocked stores pk in parked ss's queue.
func (s *Store) queueLocked(ss *sess, pk packets.Packet, now int64) error {
	switch {
	case len(ss.msgs) >= s.opts.MaxQueued:
		return fmt.Errorf("%w: %d messages", ErrQueueFull, len(ss.msgs))
	case ss.bytes+len(pk.Payload) > s.opts.MaxQueuedBytes:
		return fmt.Errorf("%w: %d bytes", ErrQueueFull, ss.bytes)
	}
	pid, ok := ss.freePID()
	if !ok {
		return ErrNoPackets
	}
	pk.PacketID = pid
	pk.FixedHeader.Type = packets.Publish
	pk.FixedHeader.Dup = false
	if pk.Created == 0 {
		pk.Created = now
	}
	key := inflightKey(ss.id, pid)
	v, err := encodeMsg(messageRecord(key, ss.id, pk, now), pk.Expiry)
	if err != nil {
		return fmt.Errorf("session: encode queued message: %w", err)
	}
	e, err := s.putLocked(key, v)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotStored, err)
	}
	ss.msgs = append(ss.msgs, msgRef{e: e, expiry: pk.Expiry, size: int32(len(pk.Payload)), pid: pid})
	ss.bytes += len(pk.Payload)
	ss.nextPID = pid + 1
	s.queued++
	return nil
}

// freePID finds a packet ID no queued message of ss uses.
func (ss *sess) freePID() (uint16, bool) {
	pid := ss.nextPID
	for range 1 << 16 {
		if pid != 0 && ss.findMsg(pid) < 0 {
			return pid, true
		}
		pid++
	}
	return 0, false
}

// routePublish queues pk for every parked session it reaches (or, for a
// point-to-point topic, for the parked session it is addressed to).
func (s *Store) routePublish(pk packets.Packet) {
	if pk.FixedHeader.Qos == 0 || pk.Ignore {
		return // QoS 0 is not queued for offline sessions
	}
	now := time.Now().Unix()
	s.mu.Lock()
	if s.parked == 0 || s.server == nil {
		s.mu.Unlock()
		return
	}
	var discards []discard
	if id, ok := mqtttopic.P2PTarget(pk.TopicName); ok {
		if ss := s.sessions[id]; ss != nil && ss.parked {
			if err := s.queueLocked(ss, s.prepare(pk, pk.FixedHeader.Qos, now), now); err != nil {
				discards = append(discards, discard{id, pk, false, err.Error()})
			}
		}
		s.mu.Unlock()
		s.tell(discards)
		return
	}
	hits := s.matchLocked(pk.TopicName, nil)
	for _, h := range hits {
		r := h.sub
		if r.flags&subNoLocal != 0 && pk.Origin == h.s.id {
			continue
		}
		if !s.readableLocked(h.s, pk.TopicName) {
			continue
		}
		qos := min(pk.FixedHeader.Qos, r.qos)
		if qos == 0 {
			continue
		}
		out := s.prepare(pk, qos, now)
		if r.flags&subRetainAsPublished == 0 {
			out.FixedHeader.Retain = false
		}
		if r.ident > 0 {
			out.Properties.SubscriptionIdentifier = []int{int(r.ident)}
		}
		if err := s.queueLocked(h.s, out, now); err != nil {
			discards = append(discards, discard{h.s.id, out, false, err.Error()})
		}
	}
	s.mu.Unlock()
	s.tell(discards)
}

// readableLocked reports whether a publish on topic may be queued for
// parked ss (Options.Readable). Its username is read from its client
// record the first time; an unreadable record fails closed.
func (s *Store) readableLocked(ss *sess, topic string) bool {
	if s.opts.Readable == nil {
		return true
	}
	if !ss.userKnown {
		c, err := s.clientLocked(ss)
		if err != nil {
			return false
		}
		ss.user, ss.userKnown = string(c.Username), true
	}
	return s.opts.Readable(ss.id, ss.user, topic)
}

// prepare is pk as queued: its own copy, at qos, with its absolute expiry
// (the message's expiry interval, bounded by the server's maximum).
func (s *Store) prepare(pk packets.Packet, qos byte, now int64) packets.Packet {
	out := pk.Copy(false)
	out.FixedHeader.Qos = qos
	out.Origin = pk.Origin
	out.Created = pk.Created
	if out.Created == 0 {
		out.Created = now
	}
	if out.Expiry == 0 {
		if iv := int64(pk.Properties.MessageExpiryInterval); iv > 0 {
			out.Expiry = out.Created + iv
		}
		if mx := s.server.Options.Capabilities.MaximumMessageExpiryInterval; mx > 0 && (out.Expiry == 0 || out.Expiry > out.Created+mx) {
			out.Expiry = out.Created + mx
		}
	}
	return out
}

type discard struct {
	client  string
	pk      packets.Packet
	expired bool
	reason  string
}

func (s *Store) tell(ds []discard) {
	if s.opts.Discarded == nil {
		return
	}
	for _, d := range ds {
		s.opts.Discarded(d.client, d.pk, d.expired, d.reason)
	}
}

// parkDue parks the offline clients whose time has come.
func (s *Store) parkDue(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.server == nil {
		return
	}
	for cl, at := range s.parkq {
		if now.Sub(at) < s.opts.ParkAfter {
			continue
		}
		if done := s.parkLocked(cl, now); done {
			delete(s.parkq, cl)
		}
	}
}

// parkLocked takes offline cl out of mochi; false: not now, try later.
func (s *Store) parkLocked(cl *mqtt.Client, now time.Time) bool {
	if c := s.connecting[cl.ID]; c != nil && !c.Closed() {
		return false // a new connection of this ID is being established: it takes the session over
	}
	cur, ok := s.server.Clients.Get(cl.ID)
	if !ok || cur != cl || !cl.Closed() || cl.IsTakenOver() {
		return true // replaced, resumed or gone
	}
	ss := s.sessions[cl.ID]
	if ss == nil || ss.client.n == 0 || ss.parked {
		return true // not stored: mochi keeps it (a clean session ending, say)
	}
	if atomic.LoadUint32(&cl.Properties.Will.Flag) == 1 {
		return false // its will waits for its delay: mochi's timer needs the client
	}
	for filter := range cl.State.Subscriptions.GetAll() {
		if s.server.Topics.Unsubscribe(filter, cl.ID) {
			atomic.AddInt64(&s.server.Info.Subscriptions, -1)
		}
	}
	atomic.AddInt64(&s.server.Info.Inflight, -int64(cl.State.Inflight.Len()))
	s.server.Clients.Delete(cl.ID)

	stopped := cl.StopTime()
	if stopped == 0 {
		stopped = now.Unix()
	}
	s.parkSessLocked(ss, stopped, expiryInterval(cl.Properties.ProtocolVersion, cl.Properties.Props, s.maxExpiry()))
	ss.gone = s.replaceLocked(ss.gone, kGone+ss.id, binary.BigEndian.AppendUint64(nil, uint64(stopped)))
	return true
}

// parkSessLocked files ss as parked: gone is when it went offline.
func (s *Store) parkSessLocked(ss *sess, gone int64, expiry int64) {
	ss.parked = true
	ss.deadline = 0
	if expiry > 0 {
		ss.deadline = gone + expiry
	}
	ss.nextPID = 1
	if n := len(ss.msgs); n > 0 {
		ss.nextPID = ss.msgs[n-1].pid + 1
	}
	if cap(ss.msgs) > len(ss.msgs) {
		ss.msgs = slices.Clone(ss.msgs) // exact size: a parked session may stay for days
	}
	if cap(ss.subs) > len(ss.subs) {
		ss.subs = slices.Clone(ss.subs)
	}
	s.routeLocked(ss)
	s.parked++
	s.queued += len(ss.msgs)
}

// maxExpiry is the server's cap on session expiry (seconds).
func (s *Store) maxExpiry() int64 {
	if s.server == nil {
		return 0
	}
	return int64(s.server.Options.Capabilities.MaximumSessionExpiryInterval)
}

// expiryInterval is how long a session outlives its connection, as mochi
// computes it: MQTT 5's session expiry bounded by the server's maximum,
// the maximum for MQTT 3.
func expiryInterval(version byte, p packets.Properties, max int64) int64 {
	if version == 5 && p.SessionExpiryIntervalFlag {
		if iv := int64(p.SessionExpiryInterval); max == 0 || iv < max {
			return iv
		}
	}
	return max
}

// hydrateLocked rebuilds parked ss as an offline mochi client, for mochi to
// resume. Messages whose expiry passed are dropped (returned); what it is
// subscribed to is in memory, its queued messages are read from disk.
func (s *Store) hydrateLocked(ss *sess, listener string) []discard {
	c, err := s.clientLocked(ss)
	if err != nil {
		s.log.Warn().Err(err).Str("client", ss.id).Msg("stored session does not load; dropped")
		s.dropLocked(ss, true)
		return nil
	}
	cl := s.server.NewClient(nil, listener, ss.id, false)
	cl.Properties.Username = c.Username
	cl.Properties.Clean = c.Clean
	cl.Properties.ProtocolVersion = c.ProtocolVersion
	cl.Properties.Props = clientProps(c)
	cl.Properties.Will = mqtt.Will(c.Will)
	cl.Stop(packets.ErrServerShuttingDown)

	expired := s.discardMsgsLocked(ss, nil, expiredAt(time.Now().Unix()), true, reasonExpiredOffline)
	s.unrouteLocked(ss)
	s.parked--
	s.queued -= len(ss.msgs)
	ss.parked = false

	for i := range ss.subs {
		sub := ss.subs[i].subscription()
		if s.server.Topics.Subscribe(ss.id, sub) {
			atomic.AddInt64(&s.server.Info.Subscriptions, 1)
		}
		cl.State.Subscriptions.Add(sub.Filter, sub)
	}
	kept := ss.msgs[:0]
	for _, m := range ss.msgs {
		rec, expiry, err := s.msgAtLocked(ss.id, &m)
		if err != nil {
			s.log.Warn().Err(err).Str("client", ss.id).Uint16("packet_id", m.pid).Msg("stored message does not load; dropped")
			s.deleteLocked(m.e, inflightKey(ss.id, m.pid))
			ss.bytes -= int(m.size)
			continue
		}
		if cl.State.Inflight.Set(toPacket(&rec, expiry)) {
			atomic.AddInt64(&s.server.Info.Inflight, 1)
		}
		kept = append(kept, m)
	}
	ss.msgs = kept
	s.deleteLocked(ss.gone, kGone+ss.id)
	ss.gone = entry{}
	s.server.Clients.Add(cl)
	return expired
}

// clientLocked reads ss's client record.
func (s *Store) clientLocked(ss *sess) (storage.Client, error) {
	var c storage.Client
	v, err := s.readLocked(clientKey(ss.id), ss.client)
	if err == nil {
		err = c.UnmarshalBinary(v)
	}
	if err == nil && c.ID != ss.id {
		err = fmt.Errorf("%w: client record of %q under %q", errBadValue, c.ID, ss.id)
	}
	return c, err
}

func clientProps(c storage.Client) packets.Properties {
	return packets.Properties{
		SessionExpiryInterval:     c.Properties.SessionExpiryInterval,
		SessionExpiryIntervalFlag: c.Properties.SessionExpiryIntervalFlag,
		AuthenticationMethod:      c.Properties.AuthenticationMethod,
		AuthenticationData:        c.Properties.AuthenticationData,
		RequestProblemInfoFlag:    c.Properties.RequestProblemInfoFlag,
		RequestProblemInfo:        c.Properties.RequestProblemInfo,
		RequestResponseInfo:       c.Properties.RequestResponseInfo,
		ReceiveMaximum:            c.Properties.ReceiveMaximum,
		TopicAliasMaximum:         c.Properties.TopicAliasMaximum,
		User:                      c.Properties.User,
		MaximumPacketSize:         c.Properties.MaximumPacketSize,
	}
}

// sweep drops parked sessions whose expiry passed and queued messages
// whose expiry passed (reading them back for Discarded).
func (s *Store) sweep(now time.Time) {
	unix := now.Unix()
	var ds []discard
	var due []dueDiscard
	s.mu.Lock()
	for id, c := range s.connecting {
		if c.Closed() {
			delete(s.connecting, id) // its CONNACK failed: mochi tells no hook
		}
	}
	for _, ss := range s.sessions {
		if !ss.parked {
			continue
		}
		if ss.expired(unix) {
			if s.opts.DiscardedDurably != nil && len(ss.msgs) > 0 {
				// It ends once every queued message's receipt is stored
				// (discardDurably); until then a reconnect finds it gone
				// (OnSessionEstablish).
				due = s.dueLocked(ss, due, unix, true)
				continue
			}
			ds = s.discardMsgsLocked(ss, ds, func(*msgRef) bool { return true }, true, reasonSessionExpired)
			s.log.Debug().Str("client", ss.id).Msg("parked session expired")
			s.endLocked(ss)
			continue
		}
		if ss.soonest() <= unix {
			if s.opts.DiscardedDurably != nil {
				due = s.dueLocked(ss, due, unix, false)
			} else {
				ds = s.discardMsgsLocked(ss, ds, expiredAt(unix), true, reasonExpiredOffline)
			}
		}
	}
	s.mu.Unlock()
	s.tell(ds)
	s.discardDurably(due)
}

// dueDiscard is a queued message whose expiry passed while its session was
// parked, waiting for Options.DiscardedDurably before it leaves the queue.
type dueDiscard struct {
	ss     *sess
	ref    msgRef
	pk     packets.Packet
	reason string
}

// maxDurableDiscards bounds the durable discards of one sweep, and
// durableDiscardTimeout the wait for each: the store's goroutine also
// syncs and parks. What is left waits for the next sweep.
const (
	maxDurableDiscards    = 256
	durableDiscardTimeout = 2 * time.Second
)

// dueLocked appends parked ss's expired messages — all of them when the
// session itself expired — (read from the backend) to due, leaving them
// queued.
func (s *Store) dueLocked(ss *sess, due []dueDiscard, now int64, sessionExpired bool) []dueDiscard {
	reason := reasonExpiredOffline
	if sessionExpired {
		reason = reasonSessionExpired
	}
	isDue := expiredAt(now)
	for _, m := range ss.msgs {
		if len(due) >= maxDurableDiscards {
			return due
		}
		if !sessionExpired && !isDue(&m) {
			continue
		}
		rec, expiry, err := s.msgAtLocked(ss.id, &m)
		if err != nil {
			continue // unreadable: left to the session's end
		}
		due = append(due, dueDiscard{ss: ss, ref: m, pk: toPacket(&rec, expiry), reason: reason})
	}
	return due
}

// discardDurably offers each due message to Options.DiscardedDurably and
// removes from its queue those recorded, if the session still holds them
// (a reconnect in between restored and delivered or discarded them).
func (s *Store) discardDurably(due []dueDiscard) {
	done := due[:0]
	for _, d := range due {
		select {
		case <-s.stop:
			return // closing: they stay queued
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), durableDiscardTimeout)
		err := s.opts.DiscardedDurably(ctx, d.ss.id, d.pk, true, d.reason)
		cancel()
		if err != nil {
			s.log.Debug().Err(err).Str("client", d.ss.id).Uint16("packet_id", d.ref.pid).
				Msg("expired message kept queued: its discard is not recorded yet")
			continue
		}
		done = append(done, d)
	}
	if len(done) == 0 {
		return
	}
	now := time.Now().Unix()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range done {
		ss := d.ss
		if s.sessions[ss.id] != ss || !ss.parked {
			continue
		}
		i := slices.IndexFunc(ss.msgs, func(m msgRef) bool { return m.pid == d.ref.pid && m.e == d.ref.e })
		if i < 0 {
			continue
		}
		s.forgetMsgLocked(ss, &ss.msgs[i])
		ss.msgs = slices.Delete(ss.msgs, i, i+1)
		if len(ss.msgs) == 0 && ss.expired(now) {
			s.log.Debug().Str("client", ss.id).Msg("parked session expired")
			s.endLocked(ss)
		}
	}
}

// expired reports whether parked ss's session expiry passed.
func (ss *sess) expired(now int64) bool { return ss.deadline > 0 && ss.deadline <= now }

// soonest is the earliest expiry of ss's queued messages (MaxInt64: none).
func (ss *sess) soonest() int64 {
	t := int64(1<<63 - 1)
	for i := range ss.msgs {
		if e := ss.msgs[i].expiry; e > 0 && e < t {
			t = e
		}
	}
	return t
}

// reasonExpiredOffline is the reason given for a queued message whose
// expiry passed while its session was parked.
const reasonExpiredOffline = "expired while the device was offline"

// reasonSessionExpired is the reason given for the queued messages of a
// session that expired.
const reasonSessionExpired = "the session expired"

// expiredAt matches queued messages whose expiry is at or before now.
func expiredAt(now int64) func(*msgRef) bool {
	return func(m *msgRef) bool { return m.expiry > 0 && m.expiry <= now }
}

// discardMsgsLocked removes ss's queued messages that match, appending them
// to ds (expired or dropped, with reason) when Discarded wants them.
func (s *Store) discardMsgsLocked(ss *sess, ds []discard, match func(*msgRef) bool, expired bool, reason string) []discard {
	kept := ss.msgs[:0]
	for _, m := range ss.msgs {
		if !match(&m) {
			kept = append(kept, m)
			continue
		}
		if s.opts.Discarded != nil {
			if rec, expiry, err := s.msgAtLocked(ss.id, &m); err == nil {
				ds = append(ds, discard{ss.id, toPacket(&rec, expiry), expired, reason})
			}
		}
		s.forgetMsgLocked(ss, &m)
	}
	ss.msgs = kept
	return ds
}

// forgetMsgLocked deletes queued message m of ss from the backend and
// from the counts; the caller takes it out of ss.msgs.
func (s *Store) forgetMsgLocked(ss *sess, m *msgRef) {
	s.deleteLocked(m.e, inflightKey(ss.id, m.pid))
	ss.bytes -= int(m.size)
	if ss.parked {
		s.queued--
	}
}

// msgAtLocked reads session id's queued message m.
func (s *Store) msgAtLocked(id string, m *msgRef) (storage.Message, int64, error) {
	v, err := s.readLocked(inflightKey(id, m.pid), m.e)
	if err != nil {
		return storage.Message{}, 0, err
	}
	return decodeMsg(v)
}

// Collectors returns the store's gauges for a Prometheus registry.
func (s *Store) Collectors() []prometheus.Collector {
	gauge := func(name, help string, f func(Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(s.Stats()) })
	}
	cs := []prometheus.Collector{
		gauge("ferrymq_sessions_stored", "Persistent MQTT sessions stored (online, offline and parked).",
			func(st Stats) float64 { return float64(st.Sessions) }),
		gauge("ferrymq_sessions_parked", "Offline persistent sessions parked (out of mochi; messages on disk).",
			func(st Stats) float64 { return float64(st.Parked) }),
		gauge("ferrymq_sessions_queued_messages", "QoS 1/2 messages queued on disk for parked sessions.",
			func(st Stats) float64 { return float64(st.Queued) }),
		gauge("ferrymq_sessions_log_bytes", "Size of the session log.",
			func(st Stats) float64 { return float64(st.LogBytes) }),
	}
	if k := s.kv; k != nil {
		for reason, c := range map[string]*atomic.Int64{"unavailable": &k.errUnavailable, "too_large": &k.errTooLarge,
			"fenced": &k.errFenced, "not_owner": &k.errNotOwner} {
			cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_sessions_kv_write_errors_total",
				Help:        "Session writes to the key-value bucket that did not happen, by reason.",
				ConstLabels: prometheus.Labels{"reason": reason}}, func() float64 { return float64(c.Load()) }))
		}
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_sessions_taken_over_total",
			Help: "Sessions another gateway node took over from this one."}, func() float64 { return float64(k.takenOver.Load()) }))
	}
	return cs
}

// Info describes one stored session.
type Info struct {
	Parked        bool
	Queued        int // QoS 1/2 messages stored for it (queued, or sent and not acknowledged)
	QueuedBytes   int
	Subscriptions int
	Deadline      time.Time // when a parked session expires; zero: not parked or never
}

// Session describes clientID's stored session.
func (s *Store) Session(clientID string) (Info, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[clientID]
	if ss == nil {
		return Info{}, false
	}
	in := Info{Parked: ss.parked, Queued: len(ss.msgs), QueuedBytes: ss.bytes, Subscriptions: len(ss.subs)}
	if ss.parked && ss.deadline > 0 {
		in.Deadline = time.Unix(ss.deadline, 0)
	}
	return in, true
}

// Delete removes clientID's parked session — subscriptions and queued
// messages, which are reported to Discarded as dropped with reason — and
// returns how many messages it held. ErrNotParked when no session of that
// ID is stored, ErrHeld while the MQTT server holds it.
func (s *Store) Delete(clientID, reason string) (int, error) {
	s.mu.Lock()
	ss := s.sessions[clientID]
	if ss == nil {
		s.mu.Unlock()
		return 0, fmt.Errorf("delete %q: %w", clientID, ErrNotParked)
	}
	if !ss.parked {
		s.mu.Unlock()
		return 0, fmt.Errorf("delete %q: %w", clientID, ErrHeld)
	}
	n := len(ss.msgs)
	ds := s.discardMsgsLocked(ss, nil, func(*msgRef) bool { return true }, false, reason)
	s.endLocked(ss)
	s.mu.Unlock()
	s.tell(ds)
	s.log.Info().Str("client", clientID).Int("queued", n).Msg("parked session deleted")
	return n, nil
}
