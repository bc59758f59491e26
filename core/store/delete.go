package store

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// DeleteTopic implements core.Broker. The topic's consume queues and its
// groups' committed offsets are removed at once; its records stay in the
// commit log until retention deletes their segments, fenced off by a
// tombstone in topics.meta — the commit-log offset where the topic ended —
// so that they are never served (Get, FindByKey), re-dispatched by recovery
// or mistaken for a topic of the same name created later, which starts
// empty. Produces to the topic racing the deletion fail with
// core.ErrTopicNotFound (a retry creates the new incarnation, unless
// auto-creation is off); reads racing it may fail. System topics ('%…')
// cannot be deleted.
func (s *Store) DeleteTopic(ctx context.Context, name string) error {
	if s.closed.Load() {
		return core.ErrClosed
	}
	if err := core.ValidateTopic(name); err != nil {
		return err
	}
	s.deleteMu.Lock()
	defer s.deleteMu.Unlock()
	t, err := s.topic(name, false, 0)
	if err != nil {
		return err
	}

	// Fence: nothing more is appended to this incarnation; wait until what
	// was appended is dispatched, so no dispatch touches its queues later.
	s.appendMu.Lock()
	t.deleted = true
	fence := s.nextOffset
	s.appendMu.Unlock()
	undo := func() {
		s.appendMu.Lock()
		t.deleted = false
		s.appendMu.Unlock()
	}
	for s.confirmed.Load() < fence {
		s.appendMu.Lock()
		failed := s.failErr
		s.appendMu.Unlock()
		if failed != nil {
			undo()
			return fmt.Errorf("delete topic %s: %w", name, failed)
		}
		if err := ctx.Err(); err != nil {
			undo()
			return fmt.Errorf("delete topic %s: %w", name, err)
		}
		time.Sleep(time.Millisecond)
	}

	s.topicsMu.Lock()
	prev, had := s.tombstones[name]
	delete(s.topics, name)
	s.tombstones[name] = fence
	if err := s.persistTopicsLocked(); err != nil {
		s.topics[name] = t
		if had {
			s.tombstones[name] = prev
		} else {
			delete(s.tombstones, name)
		}
		s.topicsMu.Unlock()
		undo()
		return fmt.Errorf("delete topic %s: %w", name, err)
	}
	s.topicsMu.Unlock()

	// The tombstone is durable: the queue files can go (a crash before this
	// leaves them to Open, which removes them).
	for _, cq := range t.slots() {
		cq.gone.Store(true)
		_ = cq.close()
	}
	if err := s.fs.RemoveAll(filepath.Join(s.dir, dirConsumeQueue, name)); err != nil {
		s.log.Error().Err(err).Str("topic", name).Msg("queue files of a deleted topic not removed; Open removes them")
	}
	s.offsetsMu.Lock()
	for k := range s.offsets {
		if k.topic == name {
			delete(s.offsets, k)
			s.offsetsDirty = true
		}
	}
	s.offsetsMu.Unlock()
	s.announce([]*topic{t}) // long polls on it answer now
	s.log.Info().Str("topic", name).Int64("fence", fence).Msg("topic deleted")
	return nil
}

// deletedAt reports whether a record of topic name at commit-log offset off
// belongs to a deleted incarnation.
func (s *Store) deletedAt(name string, off int64) bool {
	s.topicsMu.RLock()
	fence, ok := s.tombstones[name]
	s.topicsMu.RUnlock()
	return ok && off < fence
}
