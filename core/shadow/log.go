package shadow

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
)

// LogOptions configure the embedded backend (OpenLog).
type LogOptions struct {
	// SnapshotInterval is how often the latest documents are written to
	// the snapshot file, when anything changed; default 1 minute. Close
	// writes one too.
	SnapshotInterval time.Duration
}

// DefaultSnapshotInterval is LogOptions.SnapshotInterval's default.
const DefaultSnapshotInterval = time.Minute

// readBatch is how many events Open reads from the topic at a time.
const readBatch = 256

// logBackend keeps the topic as the log of record: a change is accepted
// once its event is stored in the topic (under the broker's flush policy),
// and the latest event per device lives in memory, rebuilt at Open from
// the snapshot file plus the topic's events after it. There is one write
// per change, so the history and the latest documents cannot disagree.
type logBackend struct {
	broker core.Broker
	topic  string
	dir    string
	log    zerolog.Logger
	notify func(*Event)

	mu     sync.Mutex // guards latest (the map; each entry has its own lock)
	latest map[string]*entry

	snapMu  sync.Mutex   // one snapshot at a time
	changed atomic.Int64 // changes since the last snapshot began

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// entry is one device's latest event. Its lock is held across the produce
// of a change, so that one device's events reach the topic in version
// order.
type entry struct {
	mu sync.Mutex
	ev *Event // nil: none yet
}

// OpenLog opens the service over the embedded engine: events in o.Topic
// of broker (created with the engine's default queues when missing), the
// snapshot in dir (created). It reads the snapshot and the topic's events
// after it before it returns, and writes a snapshot every
// lo.SnapshotInterval until Close.
func OpenLog(ctx context.Context, broker core.Broker, dir string, o Options, lo LogOptions) (*Service, error) {
	if lo.SnapshotInterval == 0 {
		lo.SnapshotInterval = DefaultSnapshotInterval
	}
	return Open(o, func(env BackendEnv) (Backend, error) {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("shadow: %w", err)
		}
		b := &logBackend{broker: broker, topic: env.Topic, dir: dir, log: env.Log, notify: env.Notify, latest: map[string]*entry{}}
		if err := b.recover(ctx); err != nil {
			return nil, fmt.Errorf("shadow: %w", err)
		}
		lctx, cancel := context.WithCancel(context.Background())
		b.cancel = cancel
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.snapshotEvery(lctx, lo.SnapshotInterval)
		}()
		return b, nil
	})
}

// recover loads the snapshot, then the topic's events after it.
func (b *logBackend) recover(ctx context.Context) error {
	snap, err := readSnapshot(b.dir)
	if errors.Is(err, ErrCorrupt) {
		// The topic is the record; the snapshot only saves reading all of
		// it. Without it every event the topic still holds is read.
		b.log.Warn().Err(err).Msg("shadow snapshot damaged: reading the whole topic")
		snap = nil
	} else if err != nil {
		return err
	}
	if snap != nil && snap.Topic != b.topic {
		b.log.Warn().Str(logTopic, snap.Topic).Msg("shadow snapshot of another topic: reading the whole topic")
		snap = nil
	}
	var offsets []int64
	if snap != nil {
		for _, ev := range snap.Shadows {
			b.latest[ev.ClientID] = &entry{ev: ev}
		}
		offsets = snap.Offsets
	}
	info, err := b.broker.Topic(ctx, b.topic)
	if errors.Is(err, core.ErrTopicNotFound) {
		if _, err := b.broker.CreateTopic(ctx, core.TopicConfig{Name: b.topic}); err != nil && !errors.Is(err, core.ErrTopicExists) {
			return fmt.Errorf("create topic %s: %w", b.topic, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("topic %s: %w", b.topic, err)
	}
	read := 0
	for q, r := range info.Ranges {
		from := r.Min
		if q < len(offsets) {
			if offsets[q] < r.Min {
				b.log.Warn().Int(logQueue, q).Int64(logSnapshot, offsets[q]).Int64(logMin, r.Min).
					Msg("shadow events the snapshot did not cover were deleted by retention: those changes are missing")
			}
			from = max(offsets[q], r.Min)
		}
		n, err := b.replay(ctx, q, from)
		if err != nil {
			return err
		}
		read += n
	}
	b.changed.Store(int64(read)) // the next snapshot saves reading them again
	b.log.Info().Int(logDevices, len(b.latest)).Int(logEvents, read).Bool(logSnapshot, snap != nil).Msg("shadows loaded")
	return nil
}

// replay applies queue q's events from offset from on.
func (b *logBackend) replay(ctx context.Context, q int, from int64) (int, error) {
	n := 0
	for {
		res, err := b.broker.Read(ctx, core.ReadRequest{Topic: b.topic, Queue: q, Offset: from, MaxCount: readBatch})
		if err != nil {
			return n, fmt.Errorf("read %s queue %d at %d: %w", b.topic, q, from, err)
		}
		for _, m := range res.Messages {
			ev, err := DecodeEvent(m.Body)
			if err != nil {
				b.log.Warn().Err(err).Int(logQueue, q).Int64(logOffset, m.QueueOffset).Msg("shadow event skipped")
				continue
			}
			n++
			if e := b.latest[ev.ClientID]; e == nil || e.ev.Version < ev.Version {
				b.latest[ev.ClientID] = &entry{ev: ev}
			}
		}
		if len(res.Messages) == 0 || res.NextOffset <= from {
			return n, nil
		}
		from = res.NextOffset
	}
}

func (b *logBackend) entry(id string, create bool) *entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.latest[id]
	if e == nil && create {
		e = &entry{}
		b.latest[id] = e
	}
	return e
}

// Load implements Backend.
func (b *logBackend) Load(_ context.Context, id string, _ bool) (*Event, uint64, error) {
	e := b.entry(id, false)
	if e == nil {
		return nil, 0, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ev == nil {
		return nil, 0, nil
	}
	return e.ev, uint64(e.ev.Version), nil
}

// Save implements Backend: the event is produced under the device's
// lock, and is the change.
func (b *logBackend) Save(ctx context.Context, id string, rev uint64, ev *Event) error {
	body, err := EncodeEvent(ev)
	if err != nil {
		return err
	}
	e := b.entry(id, true)
	e.mu.Lock()
	defer e.mu.Unlock()
	var cur uint64
	if e.ev != nil {
		cur = uint64(e.ev.Version)
	}
	if cur != rev {
		return ErrStale
	}
	// Not cut short by the caller going away: a produce that stored the
	// event and then returned the caller's cancellation would leave this
	// version in the topic and not here, and the next change would write
	// the same version again.
	if _, err := b.broker.Produce(context.WithoutCancel(ctx), &core.Message{Topic: b.topic, ShardingKey: id, Tag: string(ev.Op), Body: body}); err != nil {
		return err
	}
	e.ev = ev
	b.changed.Add(1)
	b.notify(ev) // under the lock: one device's changes are told in order
	return nil
}

// snapshotEvery writes a snapshot every period when something changed.
func (b *logBackend) snapshotEvery(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if b.changed.Load() == 0 {
			continue
		}
		if err := b.snapshot(ctx); err != nil {
			b.log.Warn().Err(err).Msg("shadow snapshot not written: the next start reads more of the topic")
		}
	}
}

// snapshot writes the latest events. The queues' heads are taken first:
// every event below them was produced under its entry's lock, and the
// copy below takes each lock, so it holds every one of them (it may hold
// later ones too; Open applies only newer versions).
func (b *logBackend) snapshot(ctx context.Context) error {
	b.snapMu.Lock()
	defer b.snapMu.Unlock()
	n := b.changed.Swap(0)
	info, err := b.broker.Topic(ctx, b.topic)
	if err != nil {
		b.changed.Add(n)
		return fmt.Errorf("topic %s: %w", b.topic, err)
	}
	body := &snapshotBody{Topic: b.topic, Offsets: make([]int64, len(info.Ranges))}
	for q, r := range info.Ranges {
		body.Offsets[q] = r.Max
	}
	b.mu.Lock()
	entries := make([]*entry, 0, len(b.latest))
	for _, e := range b.latest {
		entries = append(entries, e)
	}
	b.mu.Unlock()
	body.Shadows = make([]*Event, 0, len(entries))
	for _, e := range entries {
		e.mu.Lock()
		if e.ev != nil {
			body.Shadows = append(body.Shadows, e.ev)
		}
		e.mu.Unlock()
	}
	if err := writeSnapshot(b.dir, body); err != nil {
		b.changed.Add(n)
		return err
	}
	return nil
}

// Close implements Backend: it stops the snapshot loop and writes a last
// snapshot.
func (b *logBackend) Close() error {
	b.cancel()
	b.wg.Wait()
	if b.changed.Load() == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.snapshot(ctx); err != nil {
		return fmt.Errorf("shadow: %w", err)
	}
	return nil
}
