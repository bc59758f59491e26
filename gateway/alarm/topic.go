package alarm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	// Spill, if set, is a file that Close writes the events B refused to
	// (a full disk refuses the raise of store_failed), and that Restore
	// reads back and Store stores first: the alarm is restored after the
	// restart, and its clear follows.
	Spill string

	created atomic.Bool
	mu      sync.Mutex
	pending []Event // refused by B, stored before the next events
	spilled bool    // pending came from Spill: remove it once stored
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
	if l.spilled {
		l.spilled = false
		if err := os.Remove(l.Spill); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove stored spill: %w", err)
		}
	}
	return nil
}

// Close writes the events B refused to Spill (one JSON event per line,
// fsynced, then renamed into place), if there are any and Spill is set. It
// fails when the filesystem refuses that too: they are then lost.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Spill == "" || len(l.pending) == 0 {
		return nil
	}
	var b []byte
	for _, e := range l.pending {
		line, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode alarm event: %w", err)
		}
		b = append(append(b, line...), '\n')
	}
	if err := writeFileSync(l.Spill, b); err != nil {
		return fmt.Errorf("alarm events %s refused, not spilled: %w", Topic, err)
	}
	return nil
}

// writeFileSync writes b to path through a temporary file, fsynced before
// the rename and the folder after it.
func writeFileSync(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readSpill reads the events a Close spilled; a line that is not an
// event is skipped (logged).
func (l *Log) readSpill() ([]Event, error) {
	b, err := os.ReadFile(l.Spill)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read spilled alarm events: %w", err)
	}
	var out []Event
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		e, err := DecodeEvent(line)
		if err != nil {
			if l.Logger != nil {
				l.Logger.Warn().Err(err).Str("file", l.Spill).Msg("not an alarm event: skipped")
			}
			continue
		}
		out = append(out, e)
	}
	return out, nil
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
// Topic (of each queue, should it have several), then those spilled by
// the last Close that Topic does not hold (stored by the next Store),
// oldest first. Messages that are not events are skipped (logged): anyone
// allowed to produce could have written them.
func (l *Log) Restore(ctx context.Context) ([]Event, error) {
	out, err := l.restoreTopic(ctx)
	if err != nil || l.Spill == "" {
		return out, err
	}
	spilled, err := l.readSpill()
	if err != nil {
		return out, err
	}
	if len(spilled) == 0 {
		return out, nil
	}
	have := make(map[string]bool, len(out))
	for _, e := range out {
		have[e.key()+"\x00"+e.State+"\x00"+strconv.FormatInt(e.Time.UnixNano(), 10)] = true
	}
	l.mu.Lock()
	for _, e := range spilled {
		if !have[e.key()+"\x00"+e.State+"\x00"+strconv.FormatInt(e.Time.UnixNano(), 10)] { // stored before a crash removed the file
			l.pending = append(l.pending, e)
			out = append(out, e)
		}
	}
	l.spilled = true
	l.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Event) int { return a.Time.Compare(b.Time) })
	return out, nil
}

func (l *Log) restoreTopic(ctx context.Context) ([]Event, error) {
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
