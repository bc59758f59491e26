package store

import (
	"context"
	"fmt"
	"sort"

	"github.com/ferrymq/ferrymq/core"
)

// Consumer-group offsets live in memory and are written to offsets.meta by
// every checkpoint (default each second) and by Close. A crash can therefore
// lose the last second of commits: those messages are delivered again
// (at-least-once).

type offsetKey struct {
	group, topic string
	queue        int
}

type offsetRecord struct {
	Group  string `json:"group"`
	Topic  string `json:"topic"`
	Queue  int    `json:"queue"`
	Offset int64  `json:"offset"`
}

// CommitOffset implements core.Broker.
func (s *Store) CommitOffset(ctx context.Context, group, topicName string, queue int, offset int64) error {
	if s.closed.Load() {
		return core.ErrClosed
	}
	if group == "" {
		return fmt.Errorf("%w: empty group", core.ErrInvalidMessage)
	}
	t, err := s.topic(topicName, false, 0)
	if err != nil {
		return err
	}
	if queue < 0 || queue >= len(t.slots()) {
		return fmt.Errorf("%w: %s/%d", core.ErrQueueNotFound, topicName, queue)
	}
	if offset < 0 {
		return fmt.Errorf("%w: negative offset %d", core.ErrInvalidMessage, offset)
	}
	s.offsetsMu.Lock()
	s.offsets[offsetKey{group, topicName, queue}] = offset
	s.offsetsDirty = true
	s.offsetsMu.Unlock()
	return nil
}

// CommittedOffset implements core.Broker.
func (s *Store) CommittedOffset(ctx context.Context, group, topicName string, queue int) (int64, error) {
	if s.closed.Load() {
		return 0, core.ErrClosed
	}
	s.offsetsMu.Lock()
	o, ok := s.offsets[offsetKey{group, topicName, queue}]
	s.offsetsMu.Unlock()
	if !ok {
		return 0, fmt.Errorf("%w: group %s, %s/%d", core.ErrNoCommittedOffset, group, topicName, queue)
	}
	return o, nil
}

// persistOffsets writes offsets.meta if anything changed.
func (s *Store) persistOffsets() error {
	s.offsetsMu.Lock()
	if !s.offsetsDirty {
		s.offsetsMu.Unlock()
		return nil
	}
	list := make([]offsetRecord, 0, len(s.offsets))
	for k, v := range s.offsets {
		list = append(list, offsetRecord{Group: k.group, Topic: k.topic, Queue: k.queue, Offset: v})
	}
	s.offsetsDirty = false
	s.offsetsMu.Unlock()
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		return a.Queue < b.Queue
	})
	if err := writeMeta(s.fs, s.dir, fileOffsets, list); err != nil {
		s.offsetsMu.Lock()
		s.offsetsDirty = true
		s.offsetsMu.Unlock()
		return err
	}
	return nil
}
