package trace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
)

// Topic holds the trace records.
const Topic = "%TRACE%"

// topicQueues spreads trace records over queues (by traced ID).
const topicQueues = 4

// Hops, in the order a message usually meets them.
const (
	HopPublish    = "mqtt.publish"    // a device's PUBLISH reached a gateway
	HopProduce    = "produce"         // a backend produced it (wire or HTTP)
	HopStored     = "stored"          // appended to its topic
	HopPuback     = "mqtt.ack"        // the gateway acknowledged it to the device (PUBACK/PUBREC)
	HopDelayed    = "delayed"         // stored to be delivered later
	HopDelivered  = "delivered"       // handed to a consumer group's member
	HopCommitted  = "committed"       // the group's offset passed it
	HopAcked      = "acked"           // acknowledged by a POP consumer
	HopRetry      = "retry"           // sent back by a consumer: redelivered later
	HopDeadLetter = "dead-letter"     // moved to the group's dead-letter topic
	HopDownlink   = "mqtt.deliver"    // sent to a device by the downlink
	HopDeviceAck  = "mqtt.device-ack" // the device acknowledged the downlink
	HopReceipt    = "receipt"         // a downlink receipt was produced
)

// Event is one hop of a message.
type Event struct {
	// ID is the traced message: its first ID.
	ID  core.MessageID `json:"id"`
	Hop string         `json:"hop"`
	At  time.Time      `json:"at"`
	// Actor is who acted: a client ID, "group/member", a node.
	Actor string `json:"actor,omitempty"`
	// Node is the ferrymq node that recorded the hop.
	Node string `json:"node,omitempty"`
	// Attrs are the hop's details (topic, queue, offset, packet ID, reason…).
	Attrs map[string]string `json:"attrs,omitempty"`
}

// ErrBadEvent is returned by DecodeEvent for a record that is not an event.
var ErrBadEvent = errors.New("trace: malformed trace record")

// maxEventBytes bounds a trace record's body.
const maxEventBytes = 16 << 10

// DecodeEvent parses a trace record's body. It never panics.
func DecodeEvent(b []byte) (Event, error) {
	var e Event
	if len(b) > maxEventBytes {
		return e, fmt.Errorf("%w: %d bytes", ErrBadEvent, len(b))
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("%w: %v", ErrBadEvent, err)
	}
	if e.Hop == "" || e.At.IsZero() {
		return e, fmt.Errorf("%w: no hop or time", ErrBadEvent)
	}
	return e, nil
}

// Options configure a Recorder. A zero field means its default.
type Options struct {
	// All traces every topic; Topics traces these (ignored with All).
	All    bool
	Topics []string
	// Node names this node in the events it records; default: none.
	Node string
	// Flush, when set, is the store's flush policy, noted on every "stored"
	// hop (flush=sync: fsynced before it was acknowledged).
	Flush string
	// Sample, between 0 and 1, keeps the hops of that fraction of the
	// traced messages (0 means 1: all). The choice hashes the message ID, so
	// every node keeps all the hops of a sampled message or none.
	Sample float64
	// Queue bounds events waiting to be written; default 8192.
	Queue int
	// Batch bounds events written at once; default 256.
	Batch  int
	Logger *zerolog.Logger
}

// Writer is what a Recorder needs of the core: to create Topic and append
// to it. Every core.Broker is one; so is a gateway's connection to a remote
// core server.
type Writer interface {
	CreateTopic(ctx context.Context, cfg core.TopicConfig) (core.TopicInfo, error)
	ProduceAsync(msgs []*core.Message, done func([]core.SendResult, error))
}

// Recorder writes trace events. Safe for concurrent use; a nil Recorder
// records nothing.
type Recorder struct {
	b    Writer
	opts Options
	log  zerolog.Logger

	// filter is nil when nothing is traced.
	filter atomic.Pointer[filter]
	events chan Event

	dropped, written atomic.Int64

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	startOnce sync.Once
	closeOnce sync.Once
}

type filter struct {
	all    bool
	topics map[string]bool
}

// New creates Topic (4 queues) through b and returns a Recorder that
// writes there; Start it.
func New(b Writer, opts Options) (*Recorder, error) {
	if b == nil {
		return nil, errors.New("trace: nil writer")
	}
	if opts.Queue <= 0 {
		opts.Queue = 8192
	}
	if opts.Batch <= 0 {
		opts.Batch = 256
	}
	if opts.Logger == nil {
		l := zerolog.Nop()
		opts.Logger = &l
	}
	r := &Recorder{b: b, opts: opts, log: opts.Logger.With().Str("component", "trace").Logger(), events: make(chan Event, opts.Queue)}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if _, err := b.CreateTopic(r.ctx, core.TopicConfig{Name: Topic, Queues: topicQueues}); err != nil {
		r.cancel()
		return nil, fmt.Errorf("create %s: %w", Topic, err)
	}
	r.SetTopics(opts.All, opts.Topics)
	return r, nil
}

// SetTopics changes what is traced: every topic (all), or these.
func (r *Recorder) SetTopics(all bool, topics []string) {
	if r == nil {
		return
	}
	if !all && len(topics) == 0 {
		r.filter.Store(nil)
		return
	}
	f := &filter{all: all, topics: map[string]bool{}}
	for _, t := range topics {
		f.topics[t] = true
	}
	r.filter.Store(f)
}

// Traced reports what is traced.
func (r *Recorder) Traced() (all bool, topics []string) {
	if r == nil {
		return false, nil
	}
	f := r.filter.Load()
	if f == nil {
		return false, nil
	}
	for t := range f.topics {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	return f.all, topics
}

// Enabled reports whether messages of topic are traced. Retry and
// dead-letter topics follow the topic their messages came from, which the
// caller passes.
func (r *Recorder) Enabled(topic string) bool {
	if r == nil {
		return false
	}
	f := r.filter.Load()
	return f != nil && (f.all || f.topics[topic]) && !strings.HasPrefix(topic, Topic)
}

// Node is the node name the Recorder stamps on events.
func (r *Recorder) Node() string {
	if r == nil {
		return ""
	}
	return r.opts.Node
}

// Record queues e for writing; it never blocks. A zero At is now; an empty
// Node is the Recorder's.
func (r *Recorder) Record(e Event) {
	if r == nil || e.ID.IsZero() || !r.sampled(e.ID) {
		return
	}
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if e.Node == "" {
		e.Node = r.opts.Node
	}
	if e.Hop == HopStored && r.opts.Flush != "" && e.Attrs["flush"] == "" {
		if e.Attrs == nil {
			e.Attrs = map[string]string{}
		}
		e.Attrs["flush"] = r.opts.Flush
	}
	select {
	case r.events <- e:
	default:
		r.dropped.Add(1)
	}
}

// sampled reports whether id's hops are kept under Options.Sample.
func (r *Recorder) sampled(id core.MessageID) bool {
	if r.opts.Sample <= 0 || r.opts.Sample >= 1 {
		return true
	}
	h := core.FNV64a(core.FNV64Offset, string(id[:]))
	return float64(h%1_000_000) < r.opts.Sample*1_000_000
}

// Stats says how many events were written and dropped (queue full).
func (r *Recorder) Stats() (written, dropped int64) {
	if r == nil {
		return 0, 0
	}
	return r.written.Load(), r.dropped.Load()
}

// Start starts the writer. Calls after the first do nothing.
func (r *Recorder) Start() {
	if r == nil {
		return
	}
	r.startOnce.Do(func() { r.wg.Go(r.run) })
}

// Close writes what is queued (for at most a few seconds) and stops.
func (r *Recorder) Close() error {
	if r == nil {
		return nil
	}
	r.closeOnce.Do(func() {
		r.startOnce.Do(func() {})
		r.cancel()
		r.wg.Wait()
	})
	return nil
}

func (r *Recorder) run() {
	batch := make([]*core.Message, 0, r.opts.Batch)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	add := func(e Event) {
		body, err := json.Marshal(e)
		if err != nil {
			return
		}
		key := e.ID.String()
		batch = append(batch, &core.Message{Topic: Topic, ShardingKey: key, Keys: []string{key}, Tag: e.Hop, Body: body, BornAt: e.At})
	}
	flush := func() {
		if len(batch) == 0 {
			return
		}
		msgs := batch
		batch = make([]*core.Message, 0, r.opts.Batch)
		inflight.Add(1)
		r.b.ProduceAsync(msgs, func(_ []core.SendResult, err error) {
			defer inflight.Done()
			if err != nil {
				r.dropped.Add(int64(len(msgs)))
				r.log.Debug().Err(err).Int("count", len(msgs)).Msg("trace records not written")
				return
			}
			r.written.Add(int64(len(msgs)))
		})
	}
	for {
		select {
		case e := <-r.events:
			add(e)
		more:
			for len(batch) < r.opts.Batch {
				select {
				case e := <-r.events:
					add(e)
				default:
					break more
				}
			}
			flush()
		case <-r.ctx.Done():
			for {
				select {
				case e := <-r.events:
					add(e)
					if len(batch) == r.opts.Batch {
						flush()
					}
				default:
					flush()
					return
				}
			}
		}
	}
}

// MaxHops bounds the events Lookup returns.
const MaxHops = 1000

// Lookup returns the recorded hops of message id, in time order (at most
// max, 0 meaning MaxHops).
func Lookup(ctx context.Context, b core.Broker, id core.MessageID, max int) ([]Event, error) {
	if max <= 0 || max > MaxHops {
		max = MaxHops
	}
	msgs, err := b.FindByKey(ctx, Topic, id.String(), core.KeyQuery{Max: max})
	if err != nil && !errors.Is(err, core.ErrMessageNotFound) && !errors.Is(err, core.ErrTopicNotFound) {
		return nil, err
	}
	out := make([]Event, 0, len(msgs))
	for _, m := range msgs {
		e, err := DecodeEvent(m.Body)
		if err != nil || e.ID != id {
			continue
		}
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(a, b Event) int { return a.At.Compare(b.At) })
	return out, nil
}

// Properties by which a stored copy names the message it stands for. They
// are retry.PropOriginID and delay.PropID (which import this package, so it
// names them itself; a test keeps them equal).
const (
	propRetryOrigin = "retry.origin_id"
	propDelayID     = "delay.id"
)

// IDOf is the ID a stored message is traced under: its first original's
// for a redelivered copy or dead letter, its producer's for a delivered
// delayed message, else its own.
func IDOf(m *core.StoredMessage) core.MessageID {
	// delay.id first: a retried copy of a delayed message carries both, and
	// its retry.origin_id names the delivered copy, not what the producer got.
	for _, p := range []string{propDelayID, propRetryOrigin} {
		if v := m.Properties[p]; v != "" {
			if id, err := core.ParseMessageID(v); err == nil {
				return id
			}
		}
	}
	return m.ID
}

// TopicOf is the topic a stored message's tracing follows: the original
// topic of a redelivered copy or dead letter, else its own.
func TopicOf(m *core.StoredMessage) string {
	if v := m.Properties["retry.origin_topic"]; v != "" {
		return v
	}
	return m.Topic
}
