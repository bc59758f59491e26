package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// queueScanner is a Core that can read the queue a key maps to from a
// time: the look for an unsure QoS 2 resend falls back to it when the key
// index does not have the message. The JetStream engine writes a message's
// key-index entry after the message itself, so a process killed between
// the two leaves it out of FindByKey (core/jetstream, index.go) — but not
// out of its queue.
type queueScanner interface {
	scanKeyQueues(ctx context.Context, topic, key string, begin time.Time, max int, match func(*core.StoredMessage) bool) (*core.StoredMessage, error)
}

// scanKeyQueues reads, in each queue key was placed on since begin (one
// per epoch of the topic that was in force then; every queue for an empty
// key), the messages stored from begin on, at most max in all, and
// returns the first that match takes; nil when none does.
func (e embedded) scanKeyQueues(ctx context.Context, topic, key string, begin time.Time, max int, match func(*core.StoredMessage) bool) (*core.StoredMessage, error) {
	info, err := e.Topic(ctx, topic)
	if errors.Is(err, core.ErrTopicNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("topic %s: %w", topic, err)
	}
	scanned := 0
	for _, q := range keyQueuesSince(info, key, begin) {
		off, err := e.OffsetAt(ctx, topic, q, begin)
		if err != nil {
			return nil, fmt.Errorf("offset of %s/%d at %v: %w", topic, q, begin, err)
		}
		for scanned < max {
			res, err := e.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: min(256, max-scanned)})
			if err != nil {
				return nil, fmt.Errorf("read %s/%d at %d: %w", topic, q, off, err)
			}
			for _, m := range res.Messages {
				if match(m) {
					return m, nil
				}
			}
			scanned += len(res.Messages)
			if len(res.Messages) == 0 || res.NextOffset <= off {
				break
			}
			off = res.NextOffset
		}
	}
	return nil, nil
}

// keyQueuesSince returns the queues key was placed on by the epochs of
// info in force at or after begin; every queue for an empty key.
func keyQueuesSince(info core.TopicInfo, key string, begin time.Time) []int {
	var out []int
	add := func(n int) {
		if n > 0 {
			if q := core.QueueFor(key, n); !slices.Contains(out, q) {
				out = append(out, q)
			}
		}
	}
	if key == "" { // spread round-robin: any queue
		for q := range len(info.Ranges) {
			out = append(out, q)
		}
		return out
	}
	if len(info.Epochs) == 0 {
		add(info.Queues)
		return out
	}
	for i, ep := range info.Epochs {
		if i+1 < len(info.Epochs) && !info.Epochs[i+1].Started.After(begin) {
			continue // ended before begin
		}
		add(ep.Queues)
	}
	return out
}
