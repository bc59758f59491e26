package session

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Ownership of sessions kept in a key-value bucket (OpenKV). One node at a
// time serves a session: the one whose claim wrote the current revision of
// its owner record o.<client>.
//
//   - A client connects (OnSessionEstablish): the node reads the owner
//     record and claims the session with kv.Create (none) or kv.Update with
//     the revision read — two nodes racing for it cannot both succeed; the
//     loser reads again and claims after the winner (the newest connection
//     wins, as MQTT wants [MQTT-3.1.4-3]). Unless this node already served
//     the session at the revision it replaced, it loads the session from
//     the bucket (one ordered consumer over its keys, served by the
//     stream's leader) and rebuilds it as a mochi client, as for a parked
//     one (hydrateLocked). A clean session costs one read of the owner
//     record, and a claim only when a stored session of that ID exists.
//   - Every node watches the owner records. A newer revision written by
//     another process (or a delete) for a session this node holds means it
//     was taken over: the node forgets it without writing anything, takes
//     it out of mochi and disconnects its client with DISCONNECT 0x8E
//     (session taken over), its will cleared — the device is alive
//     elsewhere [MQTT-3.1.3-9].
//   - Every write of the session's other keys is fenced by the owner
//     revision held (kv.go), so a write racing the takeover — before the
//     watcher told this node — is refused by the stream, not applied.
//   - A node that starts takes back the sessions whose owner record names
//     its node ID (a restart), claiming each anew; they are parked as the
//     log's sessions are at start.

// getOwner reads session id's owner record; nil when there is none.
func (k *kvBackend) getOwner(id string) (jetstream.KeyValueEntry, error) {
	ctx, cancel := k.requestCtx()
	defer cancel()
	e, err := k.kv.Get(ctx, ownerKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read owner of %q: %w", ErrUnavailable, id, err)
	}
	return e, nil
}

// claim writes a new owner record for id in place of cur (nil: none) and
// returns its revision and the revision it replaced (0: none). When
// another node's claim came first it reads again and retries, unless
// once is set (taking back a session at start: a session claimed
// elsewhere meanwhile is left there).
func (k *kvBackend) claim(id string, cur jetstream.KeyValueEntry, once bool) (rev, prev uint64, err error) {
	if st := k.nc.Status(); st != nats.CONNECTED {
		return 0, 0, fmt.Errorf("%w: nats connection %s", ErrUnavailable, st)
	}
	key := ownerKey(id)
	for attempt := 0; ; attempt++ {
		k.gen++
		v := encodeOwner(owner{gen: k.gen, inc: k.inc, since: time.Now().UnixNano(), node: k.node, id: id})
		ctx, cancel := k.requestCtx()
		if cur == nil {
			rev, err = k.kv.Create(ctx, key, v)
		} else {
			prev = cur.Revision()
			rev, err = k.kv.Update(ctx, key, v, prev)
		}
		cancel()
		if err == nil {
			return rev, prev, nil
		}
		lost := errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
		if !lost {
			return 0, 0, fmt.Errorf("%w: claim %q: %w", ErrUnavailable, id, err)
		}
		if once || attempt >= 4 {
			return 0, 0, fmt.Errorf("%w: claim %q: %w", ErrFenced, id, err)
		}
		prev = 0
		if cur, err = k.getOwner(id); err != nil {
			return 0, 0, err
		}
	}
}

// load reads every key of session id (client, offline-since,
// subscriptions, queued messages) with one ordered consumer, in stream
// order.
func (k *kvBackend) load(id string) ([]jetstream.KeyValueEntry, error) {
	ctx, cancel := k.requestCtx()
	defer cancel()
	tok := token(id)
	w, err := k.kv.WatchFiltered(ctx, []string{kvClient + tok, kvGone + tok, kvSub + tok + ".*", kvInflight + tok + ".*"},
		jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("%w: load session %q: %w", ErrUnavailable, id, err)
	}
	defer stopWatch(w)
	var out []jetstream.KeyValueEntry
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("%w: load session %q: watcher closed", ErrUnavailable, id)
			}
			if e == nil {
				return out, nil
			}
			out = append(out, e)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: load session %q: %w", ErrUnavailable, id, ctx.Err())
		}
	}
}

// claimLocked is OnSessionEstablish's first step on a bucket: claim the
// session of cl's client ID, whose owner record was read as cur (or
// failed to read: err) and, unless this node already serves it at the
// revision it replaced, load it from the bucket, parked, for the
// parked-session path to rebuild (or discard, for a clean start). It
// returns the local clients of a stale copy, to be disconnected.
func (s *Store) claimLocked(cl *mqtt.Client, cur jetstream.KeyValueEntry, err error) (stale []*mqtt.Client, ds []discard) {
	k, id := s.kv, cl.ID
	ss := s.sessions[id]
	held := k.held[id]
	if err == nil && cur == nil && ss == nil && !persistent(cl) {
		return nil, nil // no session anywhere, none to store
	}
	var rev, prev uint64
	if err == nil {
		rev, prev, err = k.claim(id, cur, false)
	}
	if err != nil {
		// What this node has serves the client; its writes go on under the
		// revision held, if any (else ErrNotOwner) until it connects again.
		k.failed(err, id, ownerKey(id))
		return nil, nil
	}
	k.hold(id, rev, cl)
	if ss != nil && !ss.parked && prev == held {
		// This node serves it, in mochi (or has the only copy: made while
		// the bucket was unreachable): mochi resumes it, and what was not
		// written is written now (OnSessionEstablished).
		return nil, nil
	}
	if ss != nil {
		// Parked here: the bucket has the same, read in one go below. A
		// copy from an earlier revision: stale, someone served it since.
		stale = s.forgetLocked(ss, cl)
	}
	if prev == 0 {
		return stale, nil // no session anywhere: a new one
	}
	items, err := k.load(id)
	if err != nil {
		k.failed(err, id, ownerKey(id))
		return stale, nil
	}
	return stale, s.installLocked(id, items, true)
}

// installLocked indexes session id's keys loaded from the bucket, the
// client record first. When park is set it files the session as parked
// (its expiry counted from when it went offline, or now if it was online)
// and drops it if that expiry passed; the values stay in k.preload for
// hydrateLocked to read. It returns the messages dropped.
func (s *Store) installLocked(id string, items []jetstream.KeyValueEntry, park bool) []discard {
	k := s.kv
	vals := make(map[string]kvValue, len(items))
	order := make([]string, 0, len(items))
	for _, e := range items {
		key, err := logicalKey(id, e.Key(), e.Value())
		if err != nil {
			s.log.Warn().Err(err).Str("client", id).Msg("session key in the bucket does not decode; skipped")
			continue
		}
		vals[key] = kvValue{e.Revision(), e.Value()}
		order = append(order, key)
	}
	c, ok := vals[clientKey(id)]
	if !ok {
		s.log.Warn().Str("client", id).Int("keys", len(vals)).Msg("session in the bucket has no client record; starts afresh")
		return nil
	}
	s.apply(opPut, clientKey(id), c.value, entry{int64(c.rev), int32(max(len(c.value), 1))})
	for _, key := range order {
		if key != clientKey(id) {
			v := vals[key]
			s.apply(opPut, key, v.value, entry{int64(v.rev), int32(max(len(v.value), 1))})
		}
	}
	k.preload = vals
	ss := s.sessions[id]
	if ss == nil || !park {
		return nil
	}
	rec, err := s.clientLocked(ss)
	if err != nil {
		s.log.Warn().Err(err).Str("client", id).Msg("stored session does not load; dropped")
		s.dropLocked(ss, true)
		return nil
	}
	now := time.Now().Unix()
	gone := now // it was online on the node it is taken from
	if g, ok := vals[kGone+id]; ok && len(g.value) == 8 {
		gone = int64(binary.BigEndian.Uint64(g.value))
	}
	s.parkSessLocked(ss, gone, expiryInterval(rec.ProtocolVersion, clientProps(rec), s.maxExpiry()))
	if ss.expired(now) {
		ds := s.discardMsgsLocked(ss, nil, func(*msgRef) bool { return true }, true, reasonSessionExpired)
		s.dropLocked(ss, true)
		return ds
	}
	return nil
}

// forgetLocked forgets ss here without writing anything: this node does
// not serve it (any more). A mochi client of it (but keep) — connected, or
// offline and not yet parked — leaves mochi with its will cleared, and is
// returned to be disconnected once the lock is released.
func (s *Store) forgetLocked(ss *sess, keep *mqtt.Client) (stale []*mqtt.Client) {
	id := ss.id
	if !ss.parked && s.server != nil {
		if cl, ok := s.server.Clients.Get(id); ok && cl != keep {
			delete(s.parkq, cl)
			atomic.StoreUint32(&cl.Properties.Will.Flag, 0) // the device is alive elsewhere [MQTT-3.1.3-9]
			for filter := range cl.State.Subscriptions.GetAll() {
				if s.server.Topics.Unsubscribe(filter, id) {
					atomic.AddInt64(&s.server.Info.Subscriptions, -1)
				}
			}
			atomic.AddInt64(&s.server.Info.Inflight, -int64(cl.State.Inflight.Len()))
			s.server.Clients.Delete(id)
			stale = append(stale, cl)
		}
	}
	s.dropLocked(ss, false)
	return stale
}

// disconnect closes the connections of sessions another node took over:
// DISCONNECT 0x8E for MQTT 5 [MQTT-3.1.4-3], no will (cleared before).
func (s *Store) disconnect(cls []*mqtt.Client) {
	for _, cl := range cls {
		if s.server != nil && !cl.Closed() {
			_ = s.server.DisconnectClient(cl, packets.ErrSessionTakenOver)
		}
		cl.Stop(packets.ErrSessionTakenOver)
	}
}

// ownerEvent handles a change of an owner record seen by the watcher: a
// session this node holds, claimed by another process or ended there, is
// forgotten here and its client disconnected.
func (s *Store) ownerEvent(e jetstream.KeyValueEntry) {
	k := s.kv
	tok, ok := strings.CutPrefix(e.Key(), kvOwner)
	if !ok {
		return
	}
	var o owner
	if e.Operation() == jetstream.KeyValuePut {
		var err error
		if o, err = decodeOwner(e.Value()); err != nil || token(o.id) != tok {
			s.log.Warn().Err(err).Str("key", e.Key()).Msg("owner record does not decode; ignored")
			return
		}
		if o.inc == k.inc {
			return // this process's own claim
		}
	}
	s.mu.Lock()
	id, held := k.heldTok[tok]
	if !held || e.Revision() <= k.held[id] {
		s.mu.Unlock()
		return // not ours, or older than our claim
	}
	conn := k.conns[id]
	k.unhold(id)
	k.takenOver.Add(1)
	var stale []*mqtt.Client
	if ss := s.sessions[id]; ss != nil {
		stale = s.forgetLocked(ss, nil)
	}
	if conn != nil && !slices.Contains(stale, conn) && !conn.Closed() {
		// The connection that claimed it, not yet (or no more) mochi's
		// client of that ID: between its claim and joining mochi.
		atomic.StoreUint32(&conn.Properties.Will.Flag, 0)
		stale = append(stale, conn)
	}
	s.mu.Unlock()
	s.log.Info().Str("client", id).Str("by", o.node).Uint64("revision", e.Revision()).
		Int("disconnected", len(stale)).Msg("session taken over by another node")
	s.disconnect(stale)
}

// adopt takes back, at start, the sessions whose owner record names this
// node: each is claimed anew (a session claimed elsewhere meanwhile stays
// there) and loaded, not parked (Attach parks them, as Open's).
func (s *Store) adopt(mine []jetstream.KeyValueEntry) int {
	return s.takeOver(mine, false, "session this node owned not taken back")
}

// takeOver claims the sessions of owner records read a moment ago, each
// with a revision check (one claimed elsewhere meanwhile stays there:
// ErrFenced, logged at debug), and loads them — parked here when park.
// It returns how many it took; failed ones are logged with failed.
func (s *Store) takeOver(entries []jetstream.KeyValueEntry, park bool, failed string) int {
	k := s.kv
	n := 0
	for _, cur := range entries {
		o, err := decodeOwner(cur.Value())
		if err != nil {
			continue
		}
		s.mu.Lock()
		var ds []discard
		rev, _, err := k.claim(o.id, cur, true)
		if err == nil {
			k.hold(o.id, rev, nil)
			var items []jetstream.KeyValueEntry
			if items, err = k.load(o.id); err == nil {
				ds = s.installLocked(o.id, items, park)
				k.preload = nil
				if s.sessions[o.id] == nil {
					k.release(o.id) // no client record: nothing to take
				} else {
					n++
				}
			}
		}
		s.mu.Unlock()
		s.tell(ds)
		switch {
		case errors.Is(err, ErrFenced):
			s.log.Debug().Err(err).Str("client", o.id).Str("node", o.node).Msg(failed)
		case err != nil:
			s.log.Warn().Err(err).Str("client", o.id).Str("node", o.node).Msg(failed)
		}
	}
	return n
}

// AdoptGone takes over the sessions whose owner record names a node for
// which alive reports false — gateway nodes that are gone (their liveness
// lease expired) — and parks them here, so that what arrives for them (commands for a parked session,
// publishes to their subscriptions) is queued again until the devices come
// back, on any node. Each is claimed with a revision check, so a session a
// device reclaimed meanwhile, or another node adopted, stays there. It
// returns how many it took. Only for a store opened with OpenKV.
func (s *Store) AdoptGone(ctx context.Context, alive func(node string) bool) (int, error) {
	k := s.kv
	if k == nil {
		return 0, ErrNotShared
	}
	w, cancel, err := k.watch(ctx, kvOwner+"*")
	if err != nil {
		return 0, fmt.Errorf("session: adopt sessions of gone nodes: %w", err)
	}
	var theirs []jetstream.KeyValueEntry
	err = initial(ctx, w, max(10*k.timeout, time.Minute), func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			return
		}
		if o, err := decodeOwner(e.Value()); err == nil && o.node != k.node && !alive(o.node) && ownerKey(o.id) == e.Key() {
			theirs = append(theirs, e)
		}
	})
	stopWatch(w)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("session: adopt sessions of gone nodes: %w", err)
	}
	n := s.takeOver(theirs, true, "session of a gone node not adopted")
	if len(theirs) > 0 {
		s.log.Info().Int("sessions", n).Int("owned_by_gone_nodes", len(theirs)).Msg("sessions of gone nodes adopted")
	}
	return n, nil
}
