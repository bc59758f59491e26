package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/nats-io/nats.go/jetstream"
)

// startKV reads the retained messages and the owner records, takes back
// the sessions this node owned and starts the two watchers (owned by s.wg,
// ended by Close). On error nothing is left running once s.stop is closed
// and s.wg waited for.
func (s *Store) startKV(ctx context.Context) error {
	k := s.kv
	snapshot := max(10*k.timeout, time.Minute) // reading every owner record may take a while
	rw, rcancel, err := k.watch(ctx, kvRetained+"*")
	if err != nil {
		return fmt.Errorf("session: watch retained messages: %w", err)
	}
	if err := initial(ctx, rw, snapshot, s.retainedEvent); err != nil {
		stopWatch(rw)
		rcancel()
		return fmt.Errorf("session: load retained messages: %w", err)
	}
	ow, ocancel, err := k.watch(ctx, kvOwner+"*")
	if err != nil {
		stopWatch(rw)
		rcancel()
		return fmt.Errorf("session: watch owner records: %w", err)
	}
	var mine []jetstream.KeyValueEntry
	err = initial(ctx, ow, snapshot, func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			return
		}
		if o, err := decodeOwner(e.Value()); err == nil && o.node == k.node && ownerKey(o.id) == e.Key() {
			mine = append(mine, e)
		}
	})
	if err != nil {
		stopWatch(rw)
		rcancel()
		stopWatch(ow)
		ocancel()
		return fmt.Errorf("session: load owner records: %w", err)
	}
	s.wg.Go(func() { s.watchLoop(rw, rcancel, s.retainedEvent) })
	s.wg.Go(func() { s.watchLoop(ow, ocancel, s.ownerEvent) })
	n := s.adopt(mine)
	s.mu.Lock()
	s.log.Info().Str("bucket", k.bucket).Int("sessions", n).Int("retained", len(s.retained)).Msg("sessions loaded")
	s.mu.Unlock()
	return nil
}

// watch starts a watcher of keys whose consumer is created within ctx and
// k.timeout, and that lives until the returned cancel is called (nats.go
// ends a watcher when the context it was created with ends).
func (k *kvBackend) watch(ctx context.Context, keys string) (jetstream.KeyWatcher, context.CancelFunc, error) {
	life, cancel := context.WithCancel(context.Background())
	late := time.AfterFunc(k.timeout, cancel)
	stopLink := context.AfterFunc(ctx, cancel)
	w, err := k.kv.Watch(life, keys)
	inTime := late.Stop()
	linked := stopLink()
	if err == nil && (!inTime || !linked) {
		stopWatch(w)
		err = fmt.Errorf("watch %s: %w", keys, context.DeadlineExceeded)
	}
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return w, cancel, nil
}

// initial hands fn the watcher's initial values, up to the nil entry that
// ends them.
func initial(ctx context.Context, w jetstream.KeyWatcher, limit time.Duration, fn func(jetstream.KeyValueEntry)) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("%w: watcher closed", ErrUnavailable)
			}
			if e == nil {
				return nil
			}
			fn(e)
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return fmt.Errorf("%w: initial values not read in %s", ErrUnavailable, limit)
		}
	}
}

// watchLoop hands fn each update until Close, then stops the watcher.
func (s *Store) watchLoop(w jetstream.KeyWatcher, cancel context.CancelFunc, fn func(jetstream.KeyValueEntry)) {
	defer func() {
		stopWatch(w)
		cancel()
	}()
	for {
		select {
		case <-s.stop:
			return
		case e, ok := <-w.Updates():
			if !ok {
				s.log.Error().Msg("session watcher ended (nats connection closed): takeovers and retained messages are no longer seen")
				return
			}
			if e != nil {
				fn(e)
			}
		}
	}
}

// stopWatch stops w and drains its channel until nats.go closes it (its
// subscription's callback blocks on a full channel).
func stopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-t.C:
			return
		}
	}
}

// retainedEvent applies a retained message set or cleared on any node
// (this one included) to this node: the newest revision of a topic wins,
// so every node ends with the bucket's message. Until mochi loaded the
// retained messages (StoredRetainedMessages) they are kept for it.
func (s *Store) retainedEvent(e jetstream.KeyValueEntry) {
	k := s.kv
	tok, ok := strings.CutPrefix(e.Key(), kvRetained)
	if !ok {
		return
	}
	rev := e.Revision()
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		topic, ok := k.retTok[tok]
		if !ok {
			return
		}
		if k.tomb[topic] == rev {
			delete(k.tomb, topic) // our own delete, seen back: nothing older can follow
			if _, live := s.retained[topic]; !live {
				delete(k.retTok, tok)
			}
			return
		}
		old := s.retained[topic]
		if old == nil || uint64(old.off) >= rev {
			return
		}
		s.live -= int64(old.n)
		delete(s.retained, topic)
		delete(k.retTok, tok)
		s.applyRetainedLocked(topic, nil)
		return
	}
	m, err := decodeRetained(tok, e.Value())
	if err != nil {
		s.log.Warn().Err(err).Str("key", e.Key()).Msg("retained message in the bucket does not decode; ignored")
		return
	}
	topic := m.TopicName
	old := s.retained[topic]
	if (old != nil && uint64(old.off) >= rev) || k.tomb[topic] > rev {
		return // ours, or older than what this node set or cleared
	}
	delete(k.tomb, topic)
	if old != nil {
		s.live -= int64(old.n)
	}
	n := int32(max(len(e.Value()), 1))
	s.retained[topic] = &entry{int64(rev), n}
	s.live += int64(n)
	k.retTok[tok] = topic
	s.applyRetainedLocked(topic, &m)
}

// applyRetainedLocked sets (m) or clears (nil) topic's retained message in
// the attached mochi server, or, before mochi loaded the retained
// messages, in what it will load.
func (s *Store) applyRetainedLocked(topic string, m *storage.Message) {
	k := s.kv
	if !k.handed || s.server == nil {
		if m == nil {
			delete(k.pending, topic)
		} else {
			k.pending[topic] = m
		}
		return
	}
	pk := packets.Packet{TopicName: topic}
	if m != nil {
		pk = m.ToPacket()
	}
	s.server.Topics.RetainMessage(pk)
	atomic.StoreInt64(&s.server.Info.Retained, int64(s.server.Topics.Retained.Len()))
}

// retainedWrittenLocked follows this node's write of topic's retained
// message (pk, or a clear when pk is nil) on a bucket: mochi has pk again,
// in case the watcher applied an older message from another node between
// mochi's set and this write; a clear leaves a tombstone so that an older
// message still on its way is not applied.
func (s *Store) retainedWrittenLocked(topic string, pk *packets.Packet, written bool) {
	k := s.kv
	k.retTok[token(topic)] = topic
	if !written {
		return
	}
	if pk == nil {
		k.tomb[topic] = k.lastRev
		return
	}
	delete(k.tomb, topic)
	if s.server != nil && k.handed {
		s.server.Topics.RetainMessage(pk.Copy(false))
	}
}

// storedRetainedLocked hands mochi the retained messages read from the
// bucket; from then on the watcher applies changes to mochi directly.
func (s *Store) storedRetainedLocked() []storage.Message {
	k := s.kv
	out := make([]storage.Message, 0, len(k.pending))
	for _, m := range k.pending {
		out = append(out, *m)
	}
	k.pending = map[string]*storage.Message{}
	k.handed = s.server != nil
	return out
}

// ownerRemote reads the username of clientID's session from the bucket
// (a session this node does not hold).
func (k *kvBackend) ownerRemote(clientID string) (string, bool) {
	ctx, cancel := k.requestCtx()
	defer cancel()
	e, err := k.kv.Get(ctx, kvClient+token(clientID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", false
	}
	if err != nil {
		k.errLog.Warn().Err(err).Str("client", clientID).Msg("session owner not read from the bucket")
		return "", false
	}
	var c storage.Client
	if err := c.UnmarshalBinary(e.Value()); err != nil || c.ID != clientID {
		return "", true // stored but unreadable: owned by nobody anyone can prove to be
	}
	return string(c.Username), true
}
