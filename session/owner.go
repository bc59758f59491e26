package session

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Ownership of sessions kept in a bucket. One node at a time serves a
// session: the one whose claim wrote the current revision of its owner
// record o.<client>.
//
//   - A client connects: the engine calls Claim before it resumes or
//     discards the session. The node reads the owner record; if it holds
//     that revision already, there is nothing to claim (an offline
//     session's messages are read now, for the resume). Otherwise it
//     claims with kv.Create (no record) or kv.Update with the revision it
//     read — of two nodes racing, one fails, reads again and claims after
//     the other (the newest connection wins [MQTT-3.1.4-3]) — and loads
//     the session from the bucket for the engine to adopt. A clean session
//     with no stored session anywhere costs the one read.
//   - Every node watches the owner records. A newer revision written by
//     another process (or a delete) for a session this node holds means it
//     was taken over: the node forgets it without writing anything and the
//     engine drops it (Engine.Forget: its connection gets DISCONNECT 0x8E,
//     no will — the device is alive elsewhere [MQTT-3.1.3-9]).
//   - Every write of the session's other keys is fenced by the owner
//     revision held (kv.go): a write racing the takeover, before the
//     watcher told this node, is refused by the stream.
//   - At start (Load) a node takes back the sessions whose owner record
//     names its node ID, claiming each anew; AdoptGone takes those of nodes
//     that are gone.
//
// Claims and takeovers of one client ID are serialized here (claimLocks),
// so that the engine never adopts a session and then forgets it for an
// older takeover.

// claimLocks serialize the claims and takeovers of a client ID.
type claimLocks struct {
	seed maphash.Seed
	mu   [64]sync.Mutex
}

func (c *claimLocks) of(id string) *sync.Mutex {
	return &c.mu[maphash.String(c.seed, id)%uint64(len(c.mu))]
}

// getOwner reads session id's owner record; nil when there is none.
func (k *kvBackend) getOwner(ctx context.Context, id string) (jetstream.KeyValueEntry, error) {
	if st := k.nc.Status(); st != nats.CONNECTED {
		return nil, fmt.Errorf("%w: nats connection %s", ErrUnavailable, st)
	}
	rctx, cancel := k.requestCtx(ctx)
	defer cancel()
	e, err := k.kv.Get(rctx, ownerKey(id))
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
// another node's claim came first it reads again and retries, unless once
// is set (taking back a session: one claimed elsewhere meanwhile stays
// there; ErrFenced).
func (k *kvBackend) claim(ctx context.Context, id string, cur jetstream.KeyValueEntry, once bool) (rev, prev uint64, err error) {
	key := ownerKey(id)
	for attempt := 0; ; attempt++ {
		if st := k.nc.Status(); st != nats.CONNECTED {
			return 0, 0, fmt.Errorf("%w: nats connection %s", ErrUnavailable, st)
		}
		v := encodeOwner(owner{gen: k.gen.Add(1), inc: k.inc, since: time.Now().UnixNano(), node: k.node, id: id})
		rctx, cancel := k.requestCtx(ctx)
		prev = 0
		if cur == nil {
			rev, err = k.kv.Create(rctx, key, v)
		} else {
			prev = cur.Revision()
			rev, err = k.kv.Update(rctx, key, v, prev)
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
		if cur, err = k.getOwner(ctx, id); err != nil {
			return 0, 0, err
		}
	}
}

// Claim claims clientID's session for a connection to this node (see the
// ownership notes above) and returns it as stored when another node served
// it last, for the engine to adopt; nil when this node holds it already or
// there is none. On a store opened with Open it returns nil: one node owns
// everything.
func (s *Store) Claim(ctx context.Context, clientID string, clean bool) (*engine.StoredSession, error) {
	k := s.kv
	if k == nil {
		return nil, nil
	}
	lk := k.claims.of(clientID)
	lk.Lock()
	defer lk.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	k.pruneCacheLocked(time.Now())
	held := k.held[clientID]
	ss := s.ix.sessions[clientID]
	resume := !clean && ss != nil && ss.offline.ok() && len(ss.msgs) > 0
	s.mu.Unlock()

	cur, err := k.getOwner(ctx, clientID)
	if err != nil {
		return nil, err
	}
	switch {
	case held != 0 && cur != nil && cur.Revision() == held:
		// This node serves it. An offline session's messages are read now,
		// not under the engine's locks (LoadMessages).
		if resume {
			if err := k.fetchMessages(ctx, clientID); err != nil {
				s.log.Warn().Err(err).Str(logClient, clientID).Msg("queued messages not read ahead of the resume")
			}
		}
		return nil, nil
	case held == 0 && cur == nil && clean:
		return nil, nil // no session anywhere, none to store
	case held != 0:
		// The copy here is stale: another node served the session since, or
		// ended it.
		k.forgetLocally(clientID)
	}
	k.askHandover(ctx, clientID, cur)
	rev, prev, err := k.claim(ctx, clientID, cur, false)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	k.holdLocked(clientID, rev)
	s.mu.Unlock()
	if prev == 0 {
		return nil, nil // no session anywhere: a new one
	}
	return k.loadSession(ctx, clientID, rev, true)
}

// loadSession reads session id, claimed at owner revision rev, from the
// bucket into the index and returns it; nil if the bucket holds no client
// record of it. cache keeps its messages for LoadMessages.
func (k *kvBackend) loadSession(ctx context.Context, id string, rev uint64, cache bool) (*engine.StoredSession, error) {
	s := k.s
	items, err := k.read(ctx, id, sessionSubjects(id))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k.held[id] != rev {
		return nil, fmt.Errorf("%w: %q was claimed elsewhere while it loaded", ErrFenced, id)
	}
	st, ok := k.installLocked(id, items)
	if !ok {
		return nil, nil
	}
	if cache {
		c := &msgCache{at: time.Now(), msgs: make(map[uint16]engine.StoredMessage, len(st.Messages))}
		for _, sm := range st.Messages {
			c.msgs[sm.PID] = sm
		}
		k.cache[id] = c
	}
	return &st, nil
}

// installLocked indexes session id's keys read from the bucket and builds
// the session. The bucket keeps one value per key, so the order rules of
// the log (index.go) are revision comparisons here: the client record
// first; with the new-session flag, keys older than it belong to an
// earlier session of that ID; an offline time counts if newer than the
// client record, a PUBREC marker if newer than its message.
func (k *kvBackend) installLocked(id string, items []jetstream.KeyValueEntry) (engine.StoredSession, bool) {
	s := k.s
	type item struct {
		k key
		e jetstream.KeyValueEntry
	}
	var client jetstream.KeyValueEntry
	var rest []item
	for _, e := range items {
		pk, err := storeKey(id, e.Key(), e.Value())
		if err != nil {
			s.log.Warn().Err(err).Str(logClient, id).Str(logKey, e.Key()).Msg("session key in the bucket does not decode; skipped")
			continue
		}
		if pk.kind == kClient {
			client = e
			continue
		}
		rest = append(rest, item{pk, e})
	}
	s.ix.dropSession(id)
	if client == nil {
		if len(rest) > 0 {
			s.log.Warn().Str(logClient, id).Int("keys", len(rest)).Msg("session in the bucket has no client record; starts afresh")
		}
		return engine.StoredSession{}, false
	}
	crev := int64(client.Revision())
	fresh := freshClient(client.Value())
	vals := map[string][]byte{clientKey(id): client.Value()}
	s.ix.putClient(id, loc{crev, uint32(len(client.Value()))}, true)
	ss := s.ix.sessions[id]
	for _, it := range rest {
		rev := int64(it.e.Revision())
		at := loc{rev, uint32(max(len(it.e.Value()), 1))}
		if fresh && rev < crev {
			continue
		}
		switch it.k.kind {
		case kOffline:
			if rev < crev {
				continue
			}
		case kReleased:
			if i := ss.findMsg(it.k.pid); i < 0 || rev < ss.msgs[i].at.off {
				continue
			}
		}
		if s.ix.apply(opPut, it.k, it.e.Value(), at) {
			vals[it.k.String()] = it.e.Value()
		}
	}
	st, bad, err := build(ss, func(sk string, _ loc) ([]byte, error) {
		if v, ok := vals[sk]; ok {
			return v, nil
		}
		return nil, fmt.Errorf("%w: not read", ErrBadKey)
	})
	for _, e := range bad {
		s.log.Warn().Err(e).Str(logClient, id).Msg("stored session record does not load; skipped")
	}
	if err != nil {
		s.log.Warn().Err(err).Str(logClient, id).Msg("stored session does not load; dropped")
		s.ix.dropSession(id)
		return engine.StoredSession{}, false
	}
	return st, true
}

// forgetLocally drops what this node has of session id without writing
// anything — another node serves it, or the copy here is stale — and tells
// the engine (its connection here, if any, gets DISCONNECT 0x8E). The
// claim lock of id is held, Store.mu is not.
func (k *kvBackend) forgetLocally(id string) {
	s := k.s
	s.mu.Lock()
	k.unholdLocked(id)
	s.ix.dropSession(id)
	s.mu.Unlock()
	if e := s.engine.Load(); e != nil {
		e.Forget(id)
	}
}

// ownerEvent handles a change of an owner record seen by the watcher: a
// session this node holds, claimed by another process or ended there, is
// forgotten here.
func (k *kvBackend) ownerEvent(e jetstream.KeyValueEntry) {
	s := k.s
	tok, ok := strings.CutPrefix(e.Key(), kvOwner)
	if !ok {
		return
	}
	by := ""
	if e.Operation() == jetstream.KeyValuePut {
		o, err := decodeOwner(e.Value())
		if err == nil && token(o.id) != tok {
			err = fmt.Errorf("%w: owner record of %q under %q", ErrBadKey, o.id, e.Key())
		}
		if err != nil {
			s.log.Warn().Err(err).Str(logKey, e.Key()).Msg("owner record does not decode; ignored")
			return
		}
		if o.inc == k.inc {
			return // this process's own claim
		}
		by = o.node
	}
	s.mu.Lock()
	id, held := k.heldTok[tok]
	s.mu.Unlock()
	if !held {
		return
	}
	lk := k.claims.of(id)
	lk.Lock()
	defer lk.Unlock()
	s.mu.Lock()
	rev := k.held[id]
	s.mu.Unlock()
	if rev == 0 || e.Revision() <= rev {
		return // not ours (any more), or older than our claim
	}
	k.takenOver.Add(1)
	k.forgetLocally(id)
	s.log.Info().Str(logClient, id).Str("by", by).Uint64(logRevision, e.Revision()).Msg("session taken over by another node")
}

// owners reads every owner record and returns those keep accepts.
func (k *kvBackend) owners(ctx context.Context, keep func(owner) bool) ([]jetstream.KeyValueEntry, error) {
	w, cancel, err := k.watch(ctx, []string{kvOwner + "*"}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() {
		stopWatch(w)
		cancel()
	}()
	var out []jetstream.KeyValueEntry
	err = initial(ctx, w, k.snapshotTimeout(), func(e jetstream.KeyValueEntry) {
		if o, err := decodeOwner(e.Value()); err == nil && ownerKey(o.id) == e.Key() && keep(o) {
			out = append(out, e)
		}
	})
	return out, err
}

// takeOver claims the sessions of owner records read a moment ago, each
// with a revision check (one claimed elsewhere meanwhile stays there), and
// loads them. Those that were connected when their node stopped are
// written as offline from now. failed names the log line of one not taken.
func (k *kvBackend) takeOver(ctx context.Context, entries []jetstream.KeyValueEntry, failed string, install func(*engine.StoredSession)) []engine.StoredSession {
	s := k.s
	var out []engine.StoredSession
	for _, cur := range entries {
		o, err := decodeOwner(cur.Value())
		if err != nil {
			continue
		}
		st, err := k.takeOne(ctx, o.id, cur, func(st *engine.StoredSession) {
			if st.Offline.IsZero() {
				s.SaveOffline(o.id, time.Now())
			}
			if install != nil {
				install(st)
			}
		})
		switch {
		case errors.Is(err, ErrFenced):
			s.log.Debug().Err(err).Str(logClient, o.id).Str(logNode, o.node).Msg(failed)
		case err != nil:
			s.log.Warn().Err(err).Str(logClient, o.id).Str(logNode, o.node).Msg(failed)
		case st != nil:
			out = append(out, *st)
		}
	}
	return out
}

// takeOne claims session id from the owner record cur and loads it; then,
// when there is a session, runs under the client's claim lock — so a
// CONNECT of that client (Claim) finds the session either not held here
// or held and installed by then, never held and not yet installed.
func (k *kvBackend) takeOne(ctx context.Context, id string, cur jetstream.KeyValueEntry, then func(*engine.StoredSession)) (*engine.StoredSession, error) {
	s := k.s
	lk := k.claims.of(id)
	lk.Lock()
	defer lk.Unlock()
	rev, _, err := k.claim(ctx, id, cur, true)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	k.holdLocked(id, rev)
	s.mu.Unlock()
	st, err := k.loadSession(ctx, id, rev, false)
	if err == nil && st == nil {
		s.mu.Lock()
		k.releaseLocked(id) // no client record: nothing to take
		s.mu.Unlock()
	}
	if err == nil && st != nil {
		if k.afterClaim != nil {
			k.afterClaim(id)
		}
		then(st)
	}
	return st, err
}

// load takes back the sessions this node owned (a restart) and hands over
// the retained messages read at OpenKV; from then on the watcher applies
// retained changes to the attached engine.
func (k *kvBackend) load() ([]engine.StoredSession, []*engine.Message, error) {
	s := k.s
	ctx, cancel := context.WithTimeout(context.Background(), k.snapshotTimeout())
	defer cancel()
	mine, err := k.owners(ctx, func(o owner) bool { return o.node == k.node })
	if err != nil {
		return nil, nil, fmt.Errorf("session: read owner records: %w", err)
	}
	sessions := k.takeOver(ctx, mine, "session this node owned not taken back", nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	retained := make([]*engine.Message, 0, len(k.initial))
	for _, topic := range slices.Sorted(maps.Keys(k.initial)) {
		retained = append(retained, k.initial[topic])
	}
	k.initial, k.handed = nil, true
	s.log.Info().Int("sessions", len(sessions)).Int("owned", len(mine)).Int("retained", len(retained)).Msg("sessions taken back")
	return sessions, retained, nil
}

// AdoptGone takes over the sessions whose owner record names a node for
// which alive reports false — gateway nodes that are gone (their liveness
// lease expired) — and hands them to the attached engine (Engine.Adopt) as
// offline sessions of this node: what arrives for them is queued here
// until their devices come back, on any node; a will whose connection
// died with its node is published after its delay. Each is claimed with a
// revision check, so a session a device reclaimed meanwhile, or another
// node adopted, stays there. It returns how many it took. Only for a
// store opened with OpenKV, once attached.
func (s *Store) AdoptGone(ctx context.Context, alive func(node string) bool) (int, error) {
	k := s.kv
	if k == nil {
		return 0, ErrNotShared
	}
	e := s.engine.Load()
	if e == nil {
		return 0, ErrNotAttached
	}
	theirs, err := k.owners(ctx, func(o owner) bool { return o.node != k.node && !alive(o.node) })
	if err != nil {
		return 0, fmt.Errorf("session: adopt sessions of gone nodes: %w", err)
	}
	// Each installed as it is claimed, under its claim lock: a device that
	// reconnects here meanwhile must not find its session held by this
	// node and not yet in the engine — it would get a new session, which
	// the adoption then replaced, disconnecting it (its unacknowledged
	// commands resent to nobody).
	sessions := k.takeOver(ctx, theirs, "session of a gone node not adopted", e.Adopt)
	if len(theirs) > 0 {
		s.log.Info().Int("sessions", len(sessions)).Int("owned_by_gone_nodes", len(theirs)).Msg("sessions of gone nodes adopted")
	}
	return len(sessions), nil
}
