package session

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// watch starts a watcher of keys whose consumer is created within ctx and
// Timeout, and that lives until the returned cancel is called (nats.go ends
// a watcher when the context it was created with ends).
func (k *kvBackend) watch(ctx context.Context, keys []string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, context.CancelFunc, error) {
	life, cancel := context.WithCancel(context.Background())
	late := time.AfterFunc(k.timeout, cancel)
	stopLink := context.AfterFunc(ctx, cancel)
	w, err := k.kv.WatchFiltered(life, keys, opts...)
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
func (k *kvBackend) watchLoop(w jetstream.KeyWatcher, cancel context.CancelFunc, fn func(jetstream.KeyValueEntry)) {
	defer func() {
		stopWatch(w)
		cancel()
	}()
	for {
		select {
		case <-k.s.stop:
			return
		case e, ok := <-w.Updates():
			if !ok {
				k.s.log.Error().Msg("session watcher ended (nats connection closed): takeovers and retained messages are no longer seen")
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

// Retained messages are shared: every node writes the ones its clients
// set (unfenced, one lane per topic) and watches r.*, applying every
// change to its engine (Engine.SetRetained). The newest revision of a topic
// wins, so every node ends with the bucket's message. A node's own write
// is applied locally before it lands; if the watcher applied an older one
// from another node meanwhile, the node's own is applied again once it is
// acknowledged.

// saveRetainedLocked queues the write of a retained message (an empty
// payload: its delete).
func (k *kvBackend) saveRetainedLocked(m *engine.Message) {
	s := k.s
	var value []byte
	if len(m.Payload) > 0 {
		var err error
		if value, err = encodeRetained(m); err != nil {
			s.failed(reasonOf(err), err, "", "retained")
			return
		}
		if len(value) > k.maxValue {
			err := fmt.Errorf("%w: %d bytes, at most %d", ErrValueTooLarge, len(value), k.maxValue)
			s.failed(reasonOf(err), err, "", "retained")
			return
		}
	}
	it := &kvWrite{lane: retainedLane(m.Topic), what: "retained", subj: k.prefix + kvRetained + token(m.Topic), value: value,
		del: value == nil, topic: m.Topic}
	if value != nil {
		it.m = m
	}
	if err := k.w.enqueue(it); err != nil {
		s.failed(reasonOf(err), err, "", "retained")
		return
	}
	k.retPending[m.Topic]++
	k.retTopic[token(m.Topic)] = m.Topic
	if value != nil {
		s.ix.putRetained(m.Topic, loc{n: uint32(len(value))})
	} else {
		s.ix.delRetained(m.Topic)
	}
}

// retainedAcked follows this node's write of topic's retained message (m,
// or a delete when m is nil): rev is its revision, 0 if it failed.
func (k *kvBackend) retainedAcked(topic string, m *engine.Message, rev uint64) {
	s := k.s
	s.mu.Lock()
	if n := k.retPending[topic] - 1; n > 0 {
		k.retPending[topic] = n
	} else {
		delete(k.retPending, topic)
	}
	reapply := false
	if rev > k.retApplied[topic] {
		k.retApplied[topic] = rev
		reapply = k.retPending[topic] == 0 && k.handed
	}
	k.cleanRetainedLocked(topic)
	s.mu.Unlock()
	if e := s.engine.Load(); reapply && e != nil {
		if m == nil {
			m = &engine.Message{Topic: topic}
		}
		e.SetRetained(m)
	}
}

// cleanRetainedLocked forgets the revision of a topic with no retained
// message and no write of this node on its way: the watcher delivers in
// order, nothing older can come.
func (k *kvBackend) cleanRetainedLocked(topic string) {
	if _, live := k.s.ix.retained[topic]; !live && k.retPending[topic] == 0 {
		delete(k.retApplied, topic)
		delete(k.retTopic, token(topic))
	}
}

// retainedEvent applies a retained message set or cleared on any node
// (this one included) to this node.
func (k *kvBackend) retainedEvent(e jetstream.KeyValueEntry) {
	s := k.s
	tok, ok := strings.CutPrefix(e.Key(), kvRetained)
	if !ok {
		return
	}
	rev := e.Revision()
	var m *engine.Message
	if e.Operation() == jetstream.KeyValuePut {
		var err error
		m, err = decodeRetained(e.Value())
		if err == nil && token(m.Topic) != tok {
			err = fmt.Errorf("%w: retained message of %q under %q", ErrBadKey, m.Topic, e.Key())
		}
		if err != nil {
			s.log.Warn().Err(err).Str(logKey, e.Key()).Msg("retained message in the bucket does not decode; ignored")
			return
		}
	}
	s.mu.Lock()
	topic, known := "", false
	if m != nil {
		topic, known = m.Topic, true
	} else if topic, known = k.retTopic[tok]; !known {
		topic, known = untoken(tok)
	}
	if !known || rev <= k.retApplied[topic] {
		s.mu.Unlock()
		return // a hashed topic never seen here (nothing to clear), or not newer than what is applied
	}
	k.retApplied[topic] = rev
	if m != nil {
		k.retTopic[tok] = topic
		s.ix.putRetained(topic, loc{off: int64(rev), n: uint32(len(e.Value()))})
	} else {
		s.ix.delRetained(topic)
		k.cleanRetainedLocked(topic)
	}
	handed := k.handed
	if !handed {
		if m != nil {
			k.initial[topic] = m
		} else {
			delete(k.initial, topic)
		}
	}
	s.mu.Unlock()
	if eng := s.engine.Load(); handed && eng != nil {
		if m == nil {
			m = &engine.Message{Topic: topic}
		}
		eng.SetRetained(m)
	}
}
