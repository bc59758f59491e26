package shadow

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
)

// KVOptions configure the JetStream backend (OpenKV).
type KVOptions struct {
	// Bucket is the key-value bucket of the latest documents; default
	// DefaultBucket. Created with file storage, history 1 and Replicas
	// when missing; an existing one is used as it is.
	Bucket string
	// Replicas of the bucket when it is created; default 1.
	Replicas int
	// Timeout bounds one request to JetStream; default 5 s.
	Timeout time.Duration
}

// Defaults of KVOptions.
const (
	DefaultBucket    = "ferrymq_shadows"
	DefaultKVTimeout = 5 * time.Second
	// eventTries is how often the JetStream backend tries to append an
	// event whose document it stored.
	eventTries = 3
)

// kvBackend keeps the latest event of every device in a JetStream
// key-value bucket shared by the nodes: the key's revision is the
// optimistic lock (Create for a first document, Update with the revision
// read for the rest), so two nodes never both accept a change of the
// same version. The event is appended to the topic after the bucket took
// the change: a node killed between the two loses that event (not the
// document), and events of one device written by two nodes at nearly the
// same time may reach the topic out of version order — consumers order
// them by Event.Version. Every node watches the bucket and tells its
// watchers of every node's changes.
type kvBackend struct {
	kv      jetstream.KeyValue
	broker  core.Broker
	topic   string
	timeout time.Duration
	log     zerolog.Logger
	notify  func(*Event)

	watcher jetstream.KeyWatcher
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// OpenKV opens the service over a JetStream key-value bucket (created if
// missing) with events appended to o.Topic of broker, and starts watching
// the bucket.
func OpenKV(ctx context.Context, js jetstream.JetStream, broker core.Broker, o Options, ko KVOptions) (*Service, error) {
	s, err := newService(o)
	if err != nil {
		return nil, err
	}
	if ko.Bucket == "" {
		ko.Bucket = DefaultBucket
	}
	if ko.Replicas == 0 {
		ko.Replicas = 1
	}
	if ko.Timeout == 0 {
		ko.Timeout = DefaultKVTimeout
	}
	kv, err := js.KeyValue(ctx, ko.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: ko.Bucket, History: 1,
			Storage: jetstream.FileStorage, Replicas: ko.Replicas, Description: "ferrymq device shadows"})
	}
	if err != nil {
		return nil, fmt.Errorf("shadow: bucket %s: %w", ko.Bucket, err)
	}
	if _, err := broker.Topic(ctx, s.opts.Topic); errors.Is(err, core.ErrTopicNotFound) {
		if _, err := broker.CreateTopic(ctx, core.TopicConfig{Name: s.opts.Topic}); err != nil && !errors.Is(err, core.ErrTopicExists) {
			return nil, fmt.Errorf("shadow: create topic %s: %w", s.opts.Topic, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("shadow: topic %s: %w", s.opts.Topic, err)
	}
	b := &kvBackend{kv: kv, broker: broker, topic: s.opts.Topic, timeout: ko.Timeout, log: s.log, notify: s.notify}
	wctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	if b.watcher, err = kv.WatchAll(wctx, jetstream.UpdatesOnly()); err != nil {
		cancel()
		return nil, fmt.Errorf("shadow: watch bucket %s: %w", ko.Bucket, err)
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.watch(wctx)
	}()
	s.b = b
	return s, nil
}

// kvKey is a client ID's key: base64url, since a client ID may hold any
// character and a key only [-/_=.a-zA-Z0-9].
func kvKey(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

func (b *kvBackend) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.timeout)
}

func (b *kvBackend) load(ctx context.Context, id string) (*Event, uint64, error) {
	ctx, cancel := b.reqCtx(ctx)
	defer cancel()
	ent, err := b.kv.Get(ctx, kvKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("bucket get: %w", err)
	}
	ev, err := DecodeEvent(ent.Value())
	if err != nil {
		return nil, 0, err
	}
	return ev, ent.Revision(), nil
}

func (b *kvBackend) save(ctx context.Context, id string, rev uint64, ev *Event) error {
	body, err := EncodeEvent(ev)
	if err != nil {
		return err
	}
	kctx, cancel := b.reqCtx(ctx)
	if rev == 0 {
		_, err = b.kv.Create(kctx, kvKey(id), body)
	} else {
		_, err = b.kv.Update(kctx, kvKey(id), body, rev)
	}
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return errStale
	case err != nil:
		return fmt.Errorf("bucket write: %w", err)
	}
	// Stored: the change is accepted. Its event follows.
	for try := 1; ; try++ {
		pctx, cancel := b.reqCtx(context.WithoutCancel(ctx))
		_, err = b.broker.Produce(pctx, &core.Message{Topic: b.topic, ShardingKey: id, Tag: string(ev.Op), Body: body})
		cancel()
		if err == nil {
			return nil
		}
		if try == eventTries {
			b.log.Error().Err(err).Str(logClient, id).Int64("version", ev.Version).
				Msg("shadow change stored, its event not appended: the history misses this version")
			return nil
		}
	}
}

// watch tells the service's watchers of every change in the bucket.
func (b *kvBackend) watch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ent, ok := <-b.watcher.Updates():
			if !ok {
				return
			}
			if ent == nil || ent.Operation() != jetstream.KeyValuePut {
				continue
			}
			ev, err := DecodeEvent(ent.Value())
			if err != nil {
				b.log.Warn().Err(err).Str("key", ent.Key()).Msg("shadow record skipped")
				continue
			}
			b.notify(ev)
		}
	}
}

func (b *kvBackend) close() error {
	err := b.watcher.Stop()
	b.cancel()
	b.wg.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("shadow: stop watcher: %w", err)
	}
	return nil
}
