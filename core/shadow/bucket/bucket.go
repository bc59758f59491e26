// Package bucket keeps device shadows (package shadow) in a NATS
// JetStream key-value bucket shared by the gateway nodes of the JetStream
// engine: Open returns a shadow.Service over it. See Backend below for
// how a change, its event on the topic and the nodes' watchers fit
// together, and what a node killed in between leaves (nothing lost; an
// event possibly repeated).
//
// The record of a device, key base64url(client ID), is JSON:
//
//	{"event": <shadow.Event: the latest change>, "appended": true}
//
// appended says the event is in the topic. The Backend is safe for
// concurrent use; Close stops its watcher and returns once it ended.
package bucket

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/shadow"
)

// Options configure the bucket.
type Options struct {
	// Bucket is the key-value bucket of the latest documents; default
	// DefaultBucket. Created with file storage, history 1 and Replicas
	// when missing; an existing one is used as it is.
	Bucket string
	// Replicas of the bucket when it is created; default 1.
	Replicas int
	// Timeout bounds one request to JetStream; default 5 s.
	Timeout time.Duration
	// RepairAfter is how long a change may stay stored without its event
	// (its node died in between, or the topic refused it) before the
	// nodes' watchers append it, when the device changes no more; default
	// DefaultRepairAfter (each node waits between it and twice it).
	RepairAfter time.Duration
}

// Defaults of Options.
const (
	DefaultBucket      = "ferrymq_shadows"
	DefaultTimeout     = 5 * time.Second
	DefaultRepairAfter = 3 * time.Second
	// eventTries is how often the backend tries to append an event whose
	// document it stored.
	eventTries = 3
)

// Backend keeps the latest event of every device in a JetStream
// key-value bucket shared by the nodes: the key's revision is the
// optimistic lock (Create for a first document, Update with the revision
// read for the rest), so two nodes never both accept a change of the
// same version.
//
// The event follows the bucket: a change is stored with appended false,
// its event produced, then the record marked appended. Before a change is
// applied on top of a record that is not marked, that record's event is
// produced (and marked) first; a record left unmarked on a device that
// changes no more is found by the other nodes' watchers and appended
// after Options.RepairAfter (when every node was down at once, by the
// device's next change). So every accepted change reaches the topic, and
// a version's event is produced before any later version of the device is
// even stored: in version order — but an event may be produced more than
// once (a node killed after producing it and before marking it, two nodes
// repairing at once), and such a repeat may land after later versions:
// consumers skip an event whose version is not newer than the last one
// they saw of that device.
type Backend struct {
	kv          jetstream.KeyValue
	broker      core.Broker
	topic       string
	timeout     time.Duration
	repairAfter time.Duration
	log         zerolog.Logger
	notify      func(*shadow.Event)
	skipEvent   atomic.Pointer[func() bool] // tests: a crash between store and event

	pmu     sync.Mutex // guards pending
	pending map[string]pendingRecord

	watcher jetstream.KeyWatcher
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// pendingRecord is a record seen without its event appended.
type pendingRecord struct {
	id    string
	rev   uint64
	since time.Time
}

// record is a device's record in the bucket: its latest event, and
// whether that event is in the topic yet.
type record struct {
	Event    *shadow.Event `json:"event"`
	Appended bool          `json:"appended,omitempty"`
}

// rawRecord is a record as decoded, its event still to be checked.
type rawRecord struct {
	Event    json.RawMessage `json:"event"`
	Appended bool            `json:"appended,omitempty"`
}

func encodeRecord(ev *shadow.Event, appended bool) ([]byte, error) {
	return json.Marshal(record{Event: ev, Appended: appended})
}

// decodeRecord decodes and checks a bucket record. Errors wrap
// shadow.ErrCorrupt.
func decodeRecord(b []byte) (*record, error) {
	var r rawRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: bucket record: %v", shadow.ErrCorrupt, err)
	}
	if r.Event == nil {
		return nil, fmt.Errorf("%w: bucket record without its event", shadow.ErrCorrupt)
	}
	ev, err := shadow.DecodeEvent(r.Event)
	if err != nil {
		return nil, fmt.Errorf("bucket record: %w", err)
	}
	return &record{Event: ev, Appended: r.Appended}, nil
}

// Open opens the service over the key-value bucket (created if missing)
// with events appended to o.Topic of broker, and starts watching the
// bucket.
func Open(ctx context.Context, js jetstream.JetStream, broker core.Broker, o shadow.Options, bo Options) (*shadow.Service, error) {
	return shadow.Open(o, func(env shadow.BackendEnv) (shadow.Backend, error) {
		return newBackend(ctx, js, broker, env, bo)
	})
}

func newBackend(ctx context.Context, js jetstream.JetStream, broker core.Broker, env shadow.BackendEnv, bo Options) (*Backend, error) {
	if bo.Bucket == "" {
		bo.Bucket = DefaultBucket
	}
	if bo.Replicas == 0 {
		bo.Replicas = 1
	}
	if bo.Timeout == 0 {
		bo.Timeout = DefaultTimeout
	}
	if bo.RepairAfter == 0 {
		bo.RepairAfter = DefaultRepairAfter
	}
	kv, err := js.KeyValue(ctx, bo.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bo.Bucket, History: 1,
			Storage: jetstream.FileStorage, Replicas: bo.Replicas, Description: "ferrymq device shadows"})
	}
	if err != nil {
		return nil, fmt.Errorf("shadow: bucket %s: %w", bo.Bucket, err)
	}
	if _, err := broker.Topic(ctx, env.Topic); errors.Is(err, core.ErrTopicNotFound) {
		if _, err := broker.CreateTopic(ctx, core.TopicConfig{Name: env.Topic}); err != nil && !errors.Is(err, core.ErrTopicExists) {
			return nil, fmt.Errorf("shadow: create topic %s: %w", env.Topic, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("shadow: topic %s: %w", env.Topic, err)
	}
	b := &Backend{kv: kv, broker: broker, topic: env.Topic, timeout: bo.Timeout, repairAfter: bo.RepairAfter,
		log: env.Log, notify: env.Notify, pending: map[string]pendingRecord{}}
	wctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	if b.watcher, err = kv.WatchAll(wctx, jetstream.UpdatesOnly()); err != nil {
		cancel()
		return nil, fmt.Errorf("shadow: watch bucket %s: %w", bo.Bucket, err)
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.watch(wctx)
	}()
	return b, nil
}

// Log field names.
const (
	logClient  = "client"
	logVersion = "version"
	logKey     = "key"
)

// kvKey is a client ID's key: base64url, since a client ID may hold any
// character and a key only [-/_=.a-zA-Z0-9].
func kvKey(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

func (b *Backend) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.timeout)
}

// get reads id's record; nil, 0 when there is none.
func (b *Backend) get(ctx context.Context, id string) (*record, uint64, error) {
	ctx, cancel := b.reqCtx(ctx)
	defer cancel()
	ent, err := b.kv.Get(ctx, kvKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("bucket get: %w", err)
	}
	rec, err := decodeRecord(ent.Value())
	if err != nil {
		return nil, 0, err
	}
	return rec, ent.Revision(), nil
}

// Load implements shadow.Backend; for a change, the event of a record not
// marked appended is appended (and the record marked) first.
func (b *Backend) Load(ctx context.Context, id string, forChange bool) (*shadow.Event, uint64, error) {
	for {
		rec, rev, err := b.get(ctx, id)
		if err != nil || rec == nil {
			return nil, 0, err
		}
		if rec.Appended || !forChange {
			return rec.Event, rev, nil
		}
		// The last change's event may be missing (its node died, or the
		// topic refused it): it goes first.
		if err := b.append(ctx, rec.Event); err != nil {
			return nil, 0, err
		}
		switch rev, err = b.mark(ctx, rec.Event, rev); {
		case errors.Is(err, shadow.ErrStale):
			continue // someone else did, or changed it meanwhile
		case err != nil:
			return nil, 0, err
		}
		return rec.Event, rev, nil
	}
}

// Save implements shadow.Backend: the change is stored unmarked, its
// event produced, then the record marked.
func (b *Backend) Save(ctx context.Context, id string, rev uint64, ev *shadow.Event) error {
	body, err := encodeRecord(ev, false)
	if err != nil {
		return err
	}
	kctx, cancel := b.reqCtx(context.WithoutCancel(ctx)) // a write once sent is seen through
	if rev == 0 {
		rev, err = b.kv.Create(kctx, kvKey(id), body)
	} else {
		rev, err = b.kv.Update(kctx, kvKey(id), body, rev)
	}
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return shadow.ErrStale
	case err != nil:
		return fmt.Errorf("bucket write: %w", err)
	}
	// Stored: the change is accepted. Its event follows; what fails here
	// is done by the next change of the device or the watchers' repair.
	if skip := b.skipEvent.Load(); skip != nil && (*skip)() {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	if err := b.append(ctx, ev); err != nil {
		b.log.Warn().Err(err).Str(logClient, id).Int64(logVersion, ev.Version).Msg("shadow change stored, its event not appended yet: the next change or the repair appends it")
		return nil
	}
	if _, err := b.mark(ctx, ev, rev); err != nil && !errors.Is(err, shadow.ErrStale) {
		b.log.Debug().Err(err).Str(logClient, id).Msg("shadow event appended, the record not marked: it may be appended again")
	}
	return nil
}

// append produces ev's event to the topic, trying eventTries times.
func (b *Backend) append(ctx context.Context, ev *shadow.Event) error {
	body, err := shadow.EncodeEvent(ev)
	if err != nil {
		return err
	}
	for try := 1; ; try++ {
		pctx, cancel := b.reqCtx(ctx)
		_, err = b.broker.Produce(pctx, &core.Message{Topic: b.topic, ShardingKey: ev.ClientID, Tag: string(ev.Op), Body: body})
		cancel()
		if err == nil || try == eventTries || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("append event of %s version %d: %w", ev.ClientID, ev.Version, err)
			}
			return nil
		}
	}
}

// mark records that ev (stored at rev) is in the topic; shadow.ErrStale
// when the record changed since.
func (b *Backend) mark(ctx context.Context, ev *shadow.Event, rev uint64) (uint64, error) {
	body, err := encodeRecord(ev, true)
	if err != nil {
		return 0, err
	}
	ctx, cancel := b.reqCtx(ctx)
	defer cancel()
	rev, err = b.kv.Update(ctx, kvKey(ev.ClientID), body, rev)
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return 0, shadow.ErrStale
	case err != nil:
		return 0, fmt.Errorf("bucket mark: %w", err)
	}
	return rev, nil
}

// watch tells the service's watchers of every change in the bucket (a
// change is seen twice when its mark is, or only marked when the watcher
// fell behind), and appends the events of records left unmarked for
// longer than repairAfter.
func (b *Backend) watch(ctx context.Context) {
	// Nodes repair at different times, so that mostly one of them does.
	period := b.repairAfter + time.Duration(rand.Int64N(int64(b.repairAfter)))
	tick := time.NewTicker(period / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			b.repair(ctx, period)
		case ent, ok := <-b.watcher.Updates():
			if !ok {
				return
			}
			if ent == nil || ent.Operation() != jetstream.KeyValuePut {
				continue
			}
			rec, err := decodeRecord(ent.Value())
			if err != nil {
				b.log.Warn().Err(err).Str(logKey, ent.Key()).Msg("shadow record skipped")
				continue
			}
			b.pmu.Lock()
			if rec.Appended {
				delete(b.pending, ent.Key())
			} else {
				b.pending[ent.Key()] = pendingRecord{id: rec.Event.ClientID, rev: ent.Revision(), since: time.Now()}
			}
			b.pmu.Unlock()
			b.notify(rec.Event)
		}
	}
}

// repair appends the events of records unmarked for longer than after.
func (b *Backend) repair(ctx context.Context, after time.Duration) {
	var due []pendingRecord
	b.pmu.Lock()
	for k, p := range b.pending {
		if time.Since(p.since) >= after {
			due = append(due, p)
			delete(b.pending, k)
		}
	}
	b.pmu.Unlock()
	for _, p := range due {
		if _, _, err := b.Load(ctx, p.id, true); err != nil && ctx.Err() == nil {
			b.log.Warn().Err(err).Str(logClient, p.id).Msg("shadow event not repaired: trying again later")
			b.pmu.Lock()
			if _, ok := b.pending[kvKey(p.id)]; !ok {
				b.pending[kvKey(p.id)] = pendingRecord{id: p.id, rev: p.rev, since: time.Now()}
			}
			b.pmu.Unlock()
		}
	}
}

// Close implements shadow.Backend: it stops the watcher.
func (b *Backend) Close() error {
	err := b.watcher.Stop()
	b.cancel()
	b.wg.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("shadow: stop watcher: %w", err)
	}
	return nil
}
