package alarm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
)

// Topic is the system topic alarm events are stored in: one queue (one
// order for the whole feed), each message keyed by kind and subject
// ("disk_usage/data"), tagged with its state, its body an Event as JSON.
const Topic = "%ALARM%"

// RestoreEvents is how many of the latest events Restore reads back.
const RestoreEvents = 1000

// maxEventBytes bounds an event's JSON.
const maxEventBytes = 64 << 10

// Log stores events in Topic on b (creating it with one queue) and reads
// them back: Options.Store and Options.Restore of a node.
type Log struct {
	B      core.Broker
	Logger *zerolog.Logger

	created atomic.Bool
	mu      sync.Mutex
	pending []Event // refused by B, stored before the next events
}

// Store implements Options.Store. The first call creates Topic with one
// queue (before any produce could auto-create it with the default count).
// Events the broker refuses are kept (the latest RestoreEvents) and stored
// ahead of the next ones, in order: an alarm raised while NATS was down
// is in the topic once NATS answers again and its clear is stored.
func (l *Log) Store(ctx context.Context, events []Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	all := append(l.pending, events...)
	if err := l.store(ctx, all); err != nil {
		l.pending = all[max(0, len(all)-RestoreEvents):]
		return err
	}
	l.pending = nil
	return nil
}

func (l *Log) store(ctx context.Context, events []Event) error {
	if !l.created.Load() {
		if _, err := l.B.CreateTopic(ctx, core.TopicConfig{Name: Topic, Queues: 1}); err != nil && !errors.Is(err, core.ErrTopicExists) {
			return fmt.Errorf("create %s: %w", Topic, err)
		}
		l.created.Store(true)
	}
	msgs := make([]*core.Message, len(events))
	for i, e := range events {
		body, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode alarm event: %w", err)
		}
		msgs[i] = &core.Message{Topic: Topic, ShardingKey: string(e.Kind) + "/" + e.Subject, Tag: e.State, Body: body,
			Keys: []string{string(e.Kind)}}
	}
	if _, err := l.B.ProduceBatch(ctx, msgs); err != nil {
		return fmt.Errorf("store alarm events: %w", err)
	}
	return nil
}

// Restore implements Options.Restore: the last RestoreEvents events of
// Topic (of each queue, should it have several), oldest first. Messages that are not events are skipped (logged):
// anyone allowed to produce could have written them.
func (l *Log) Restore(ctx context.Context) ([]Event, error) {
	info, err := l.B.Topic(ctx, Topic)
	if errors.Is(err, core.ErrTopicNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", Topic, err)
	}
	var out []Event
	for q, r := range info.Ranges {
		off := max(r.Min, r.Max-RestoreEvents)
		for off < r.Max {
			res, err := l.B.Read(ctx, core.ReadRequest{Topic: Topic, Queue: q, Offset: off, MaxCount: 256})
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", Topic, err)
			}
			for _, m := range res.Messages {
				e, err := DecodeEvent(m.Body)
				if err != nil {
					if l.Logger != nil {
						l.Logger.Warn().Err(err).Str("id", m.ID.String()).Msg("not an alarm event: skipped")
					}
					continue
				}
				out = append(out, e)
			}
			if res.NextOffset <= off {
				break
			}
			off = res.NextOffset
		}
	}
	slices.SortStableFunc(out, func(a, b Event) int { return a.Time.Compare(b.Time) })
	return out, nil
}

// DecodeEvent decodes an Event's JSON, checking what a restore relies on:
// a known kind, a state, a since time.
func DecodeEvent(b []byte) (Event, error) {
	if len(b) > maxEventBytes {
		return Event{}, fmt.Errorf("%w: %d bytes, more than %d", ErrBadEvent, len(b), maxEventBytes)
	}
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrBadEvent, err)
	}
	known := false
	for _, k := range Kinds {
		known = known || k == e.Kind
	}
	switch {
	case !known:
		return Event{}, fmt.Errorf("%w: kind %q unknown", ErrBadEvent, e.Kind)
	case e.State != StateRaised && e.State != StateCleared:
		return Event{}, fmt.Errorf("%w: state %q", ErrBadEvent, e.State)
	case e.Since.IsZero() || e.Since.After(e.Time.Add(time.Second)) && !e.Time.IsZero():
		return Event{}, fmt.Errorf("%w: since %s, time %s", ErrBadEvent, e.Since, e.Time)
	}
	return e, nil
}
