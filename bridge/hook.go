package bridge

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// Defaults.
const (
	DefaultDeadLetterTopic = "downlink-dlq"
	DefaultEventsTopic     = "device-events"
	DefaultMaxInflight     = 256
	DefaultHoldUnknown     = time.Hour
	// DefaultOfflineMaxMessages and DefaultOfflineMaxBytes bound an
	// offline session's downlink queue: 1,000 messages and 16 MiB of
	// payload, four commands of the largest body (core.MaxBodyBytes). With
	// a session store the payloads wait there, not in memory.
	DefaultOfflineMaxMessages = 1000
	DefaultOfflineMaxBytes    = 4 * core.MaxBodyBytes
	// DefaultMaxDelay bounds the delay of a "$delayed/{seconds}/{topic}"
	// publish: the core's default longest delay, 40 days.
	DefaultMaxDelay = 40 * 24 * time.Hour
)

// Options configure the bridge hook.
type Options struct {
	// Core is the core queue the bridge produces to and consumes downlink
	// topics from (Embedded or Remote). If nil, Broker is used (Embedded).
	Core Core
	// Broker is the embedded engine; used when Core is nil.
	Broker core.Broker
	// Uplink rules; nil means DefaultUplinkRules.
	Uplink []UplinkRule
	// EventsTopic receives device presence events; "" means
	// DefaultEventsTopic. DisableEvents turns them off.
	EventsTopic   string
	DisableEvents bool
	// MaxInflight bounds, per client, QoS 1/2 publishes handed to the core
	// and not yet acknowledged; a client past it is not read from until
	// acks catch up (TCP backpressure). 0 means DefaultMaxInflight.
	MaxInflight int
	// MaxDelay bounds the delay of a "$delayed/{seconds}/{topic}" publish;
	// 0 means DefaultMaxDelay. Longer is refused (reason code 0x90 on MQTT
	// 5). Keep it at most the core's own maximum.
	MaxDelay time.Duration
	// Downlink rules; nil means DefaultDownlinkRules. DisableDownlink turns
	// the downlink off.
	Downlink        []DownlinkRule
	DisableDownlink bool
	// OfflineMaxMessages and OfflineMaxBytes bound the downlink messages
	// queued for one offline persistent session (counting those sent and
	// not yet acknowledged); a command past either bound is refused with a
	// "dropped" receipt, so the backend knows at once. QoS 0 is never
	// queued for an offline device. Defaults DefaultOfflineMaxMessages
	// (1,000) and DefaultOfflineMaxBytes (16 MiB).
	OfflineMaxMessages int
	OfflineMaxBytes    int
	// HoldUnknown is how long a point-to-point command for a client ID with
	// no session on this node is held in memory in case it connects (then
	// it gets it; else an "expired" receipt). 0 means DefaultHoldUnknown;
	// negative turns holding off (the command is skipped: with several
	// gateway nodes the one that has the client delivers it). Held commands
	// are bounded per client by OfflineMaxMessages/Bytes and in total by
	// HoldUnknownMax (default 10,000) and HoldUnknownMaxBytes (64 MiB).
	HoldUnknown         time.Duration
	HoldUnknownMax      int
	HoldUnknownMaxBytes int
	// DeadLetterTopic keeps a copy of every downlink message that can
	// never be delivered (an invalid MQTT topic), with dlq.* properties;
	// "" means DefaultDeadLetterTopic, "-" turns it off.
	DeadLetterTopic string
	// ReceiptsTopic receives delivery receipts; "" means
	// DefaultReceiptsTopic. DisableReceipts turns them off.
	ReceiptsTopic   string
	DisableReceipts bool
	// Node names this gateway in presence events and receipts, and its
	// downlink offsets; "" means the host name.
	Node string
	// Trace, if set, records the MQTT hops of messages whose core topic it
	// traces (see trace.go): a device's publish, where it was stored and
	// its acknowledgement; a command's delivery to a device, the device's
	// acknowledgement and the receipt. Nil records nothing. The bridge
	// neither starts nor closes it.
	Trace *trace.Recorder
	// Interceptors take reserved topic spaces ("$rpc/", "$shadow/") off
	// the bridge, before any uplink rule (see Interceptor).
	Interceptors []Interceptor
	Logger       *zerolog.Logger
}

// Hook is the bridge on the gateway engine: its Uplink (publishes into
// the core, acknowledged once durable), Presence (device events) and
// Delivery (receipts of downlink commands), and the downlink consumers.
// Attach it to the engine before the engine starts, Start it after.
type Hook struct {
	opts Options
	// presenceFailed counts presence events the core refused.
	presenceFailed atomic.Int64
	core           Core
	up             *Uplink
	log            zerolog.Logger
	m              *metrics
	e              *engine.Engine

	// conns: *engine.Client → connSession, while connected and only when
	// tracing is on: the connect session a traced publish names.
	conns sync.Map
	seq   atomic.Uint64

	produces sync.WaitGroup // ProduceAsync calls whose done has not run

	down      []downlinkRule
	downTopic map[string]bool // core topics consumed by the downlink: never uplink targets
	dl        downlink

	// Presence events and receipts go through one goroutine that stores
	// them in batches.
	evMu     sync.RWMutex // held for reading while sending on evCh
	evClosed bool
	evCh     chan *core.Message
	evOnce   sync.Once
	evDone   chan struct{} // closed when the events goroutine ended
}

var (
	_ engine.Uplink          = (*Hook)(nil)
	_ engine.Presence        = (*Hook)(nil)
	_ engine.DurableDelivery = (*Hook)(nil)
)

// New builds the hook. Rules are checked here: a bad rule is an error.
func New(o Options) (*Hook, error) {
	var err error
	if o.Core == nil {
		if o.Broker == nil {
			return nil, errors.New("bridge: Options.Core or Options.Broker is required")
		}
		o.Core = Embedded(o.Broker)
	}
	if o.EventsTopic == "" {
		o.EventsTopic = DefaultEventsTopic
	}
	if !o.DisableEvents {
		if err := core.ValidateTopic(o.EventsTopic); err != nil {
			return nil, fmt.Errorf("%w: events topic: %w", ErrBadRule, err)
		}
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = DefaultMaxInflight
	}
	if o.MaxDelay <= 0 {
		o.MaxDelay = DefaultMaxDelay
	}
	if o.Node == "" {
		o.Node, _ = os.Hostname()
	}
	up, err := NewUplink(o.Uplink)
	if err != nil {
		return nil, err
	}
	if o.OfflineMaxMessages <= 0 {
		o.OfflineMaxMessages = DefaultOfflineMaxMessages
	}
	if o.OfflineMaxBytes <= 0 {
		o.OfflineMaxBytes = DefaultOfflineMaxBytes
	}
	if o.HoldUnknown == 0 {
		o.HoldUnknown = DefaultHoldUnknown
	}
	if o.HoldUnknownMax <= 0 {
		o.HoldUnknownMax = 10000
	}
	if o.HoldUnknownMaxBytes <= 0 {
		o.HoldUnknownMaxBytes = 64 << 20
	}
	if o.DeadLetterTopic == "" {
		o.DeadLetterTopic = DefaultDeadLetterTopic
	}
	if o.DeadLetterTopic != "-" {
		if err := core.ValidateTopic(o.DeadLetterTopic); err != nil {
			return nil, fmt.Errorf("%w: dead-letter topic: %w", ErrBadRule, err)
		}
	}
	if o.ReceiptsTopic == "" {
		o.ReceiptsTopic = DefaultReceiptsTopic
	}
	if !o.DisableReceipts {
		if err := core.ValidateTopic(o.ReceiptsTopic); err != nil {
			return nil, fmt.Errorf("%w: receipts topic: %w", ErrBadRule, err)
		}
	}
	var down []downlinkRule
	if !o.DisableDownlink {
		if down, err = compileDownlink(o.Downlink); err != nil {
			return nil, err
		}
	}
	h := &Hook{opts: o, core: o.Core, up: up, log: zerolog.Nop(), m: newMetrics(), evCh: make(chan *core.Message, 4096),
		down: down, downTopic: map[string]bool{}}
	for _, r := range down {
		h.downTopic[r.Topic] = true
	}
	h.dl.group = groupName(o.Node)
	h.dl.waiters = map[string]chan struct{}{}
	h.dl.held = map[string]*heldQueue{}
	if o.Logger != nil {
		h.log = o.Logger.With().Str("component", "bridge").Logger()
	}
	// Event sequence numbers start at the boot time in microseconds, so they
	// keep growing across restarts without any stored state.
	h.seq.Store(uint64(time.Now().UnixMicro()))
	return h, nil
}

// Attach gives the hook the engine it delivers downlink commands through.
// Call it once, before the engine starts.
func (h *Hook) Attach(e *engine.Engine) {
	h.e = e
	for _, i := range h.opts.Interceptors { // they answer devices through it
		if a, ok := i.(interface{ Attach(*engine.Engine) }); ok {
			a.Attach(e)
		}
	}
}

// Collectors returns the bridge's metrics for a Prometheus registry.
func (h *Hook) Collectors() []prometheus.Collector { return h.m.collectors() }

// Drain stops the downlink, stores the queued presence events and receipts,
// and waits until everything handed to the core has completed. Call it
// after the engine shut down (every ack is written or its connection gone)
// and before closing the core.
func (h *Hook) Drain(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		h.stopDownlink()
		h.stopNotices()
		h.produces.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bridge drain: %w", ctx.Err())
	}
}

// Publish implements engine.Uplink: an MQTT publish (or a will) mapped onto
// the core. QoS 0 is appended without waiting and delivered at once. QoS
// 1/2 is deferred: the engine writes the PUBACK/PUBREC, and delivers the
// message to MQTT subscribers, only once the core has it durably; many
// publishes of one client are on their way at once (the engine's Receive
// Maximum bounds them) and share the core's group commit. A publish no rule
// maps stays MQTT-only.
func (h *Hook) Publish(c *engine.Client, m *engine.Message, done func(engine.Result)) (engine.Decision, engine.Result) {
	var received time.Time // when tracing: the publish hop's time
	if h.opts.Trace != nil {
		received = time.Now()
	}
	h.m.received.WithLabelValues(qosLabel[m.QoS&3]).Inc()
	if d, res, ok := h.intercept(c, m); ok {
		return d, res
	}
	if inner, d, ok, err := mqtttopic.Delayed(m.Topic); ok {
		return h.delayedPublish(c, m, inner, d, err, received, done)
	}
	msg, rule, ok := h.mapPublish(c, m, m.Topic)
	if !ok {
		return engine.Deliver, engine.Result{}
	}
	tr := h.traceUplink(c, m, msg, rule, received)
	if m.Will && tr != nil {
		tr.attrs["will"] = "true"
	}
	if m.QoS == 0 {
		h.produce(msg, tr, nil)
		return engine.Deliver, engine.Result{}
	}
	h.m.inflight.Inc()
	h.produceUplink(c, m, msg, tr, func(r core.SendResult, err error) {
		h.m.inflight.Dec()
		res := resultOf(err)
		// Stored with its QoS2ID in the topic an unsure resend is looked for in.
		res.Findable = err == nil && m.QoS == 2 && m.QoS2ID != 0
		if err == nil && tr != nil {
			h.traceAck(c, m, r.ID)
		}
		switch {
		case err == nil:
		case c.Protocol() < 5 || res.Disconnect != 0:
			// One line per connection ended (the client publishes again).
			h.log.Warn().Err(err).Str(logClient, c.ID()).Msg("core refused a publish; client disconnected without ack")
		default: // a negative PUBACK/PUBREC, possibly many a second: counted in the metrics
			h.log.Debug().Err(err).Str(logClient, c.ID()).Msg("core refused a publish; negative ack")
		}
		done(res)
	})
	return engine.Defer, engine.Result{}
}

// delayedPublish bridges a publish to "$delayed/{seconds}/{topic}" as a
// publish to {topic} that the core delivers {seconds} later (EMQX's
// convention). It never reaches MQTT subscribers: not at once (the time has
// not come) and not later either — consumers of the core topic get it, and
// a downlink rule may send it back to devices. A malformed topic, a delay
// beyond MaxDelay or a topic no rule bridges is refused: reason code 0x90
// on MQTT 5 (QoS 1/2); an MQTT 3 client is disconnected without an ack, as
// for any refused publish; a QoS 0 one is dropped and counted.
func (h *Hook) delayedPublish(c *engine.Client, m *engine.Message, inner string, d time.Duration, err error,
	received time.Time, done func(engine.Result)) (engine.Decision, engine.Result) {
	var msg *core.Message
	var tr *upTrace
	if err == nil && d > h.opts.MaxDelay {
		err = fmt.Errorf("%w: %q: %v is beyond the longest delay, %v", mqtttopic.ErrBadDelayed, m.Topic, d, h.opts.MaxDelay)
	}
	if err == nil {
		var ok bool
		var rule string
		if msg, rule, ok = h.mapPublish(c, m, inner); ok {
			setDelay(msg, d)
			tr = h.traceUplink(c, m, msg, rule, received)
			tr.delayedUntil(msg.DeliverAt, d)
		} else {
			err = fmt.Errorf("%w: %q: no uplink rule bridges %q", mqtttopic.ErrBadDelayed, m.Topic, inner)
		}
	}
	if err != nil {
		h.m.unbridged.WithLabelValues("bad_delayed").Inc()
		h.log.Debug().Err(err).Str(logClient, c.ID()).Msg("delayed publish refused")
		if m.QoS == 0 {
			return engine.Consume, engine.Result{}
		}
		return engine.Refuse, resultOf(err)
	}
	if m.QoS == 0 {
		h.produce(msg, tr, nil)
		return engine.Consume, engine.Result{} // not for MQTT subscribers
	}
	h.m.inflight.Inc()
	h.produceUplink(c, m, msg, tr, func(r core.SendResult, err error) {
		h.m.inflight.Dec()
		res := resultOf(err)
		res.Hold = true // acknowledged, never delivered to MQTT subscribers
		if err == nil && tr != nil {
			h.traceAck(c, m, r.ID)
		}
		done(res)
	})
	return engine.Defer, engine.Result{}
}

// setDelay makes msg a delayed message, due d from now.
func setDelay(msg *core.Message, d time.Duration) {
	msg.DeliverAt = time.Now().Add(d)
	msg.Properties[PropDelay] = strconv.FormatInt(int64(d/time.Second), 10)
	// While it waits, the delay topic's copy has a sharding key of the
	// delay service's: indexed by the client ID as well, it is found by
	// the look for an unsure QoS 2 resend (qos2.go) and by operators.
	if id := msg.Properties[PropClientID]; id != "" && !slices.Contains(msg.Keys, id) {
		msg.Keys = append(slices.Clip(msg.Keys), id)
	}
}

// mapPublish applies the uplink rules to pk and says which rule's filter
// matched; false (counted by reason) when it stays MQTT-only. No loops: a
// downlink topic is fed by backends only, never by the uplink.
func (h *Hook) mapPublish(c *engine.Client, m *engine.Message, topic string) (*core.Message, string, bool) {
	msg, rule, err := h.up.MapRule(publishOf(c, m, topic))
	if err == nil && h.downTopic[msg.Topic] {
		err = errDownlinkTopic
	}
	if err != nil {
		h.m.unbridged.WithLabelValues(unbridgedReason(err)).Inc()
		return nil, "", false
	}
	return msg, rule.Filter, true
}

// produceUplink produces a device's QoS 1/2 publish m as msg: an unsure
// QoS 2 resend only if it is not stored already (produceQoS2).
func (h *Hook) produceUplink(c *engine.Client, m *engine.Message, msg *core.Message, tr *upTrace, done func(core.SendResult, error)) {
	if m.QoS == 2 && m.QoS2Unsure && m.QoS2ID != 0 {
		h.produceQoS2(c.ID(), m.QoS2ID, msg, tr, done)
		return
	}
	h.produce(msg, tr, done)
}

// produce hands one bridged message to the core and counts the outcome;
// a traced one (tr set) records its hops once stored. done, if set, runs
// on the core's goroutine (it must not block) with where the message was
// stored (zero after an error).
func (h *Hook) produce(msg *core.Message, tr *upTrace, done func(core.SendResult, error)) {
	start := time.Now()
	h.produces.Add(1)
	h.core.ProduceAsync([]*core.Message{msg}, func(res []core.SendResult, err error) {
		defer h.produces.Done()
		h.m.appendSeconds.Observe(time.Since(start).Seconds())
		var r core.SendResult
		if err != nil {
			h.m.failures.WithLabelValues(failureReason(err)).Inc()
		} else {
			h.m.bridged.Inc()
			if len(res) > 0 {
				r = res[0]
			}
			if tr != nil {
				h.traceStored(tr, &r)
			}
		}
		if done != nil {
			done(r, err)
		}
	})
}

var qosLabel = [4]string{"0", "1", "2", "3"}

func publishOf(c *engine.Client, m *engine.Message, topic string) *Publish {
	p := &Publish{
		Topic:    topic,
		ClientID: c.ID(),
		Username: c.Username(),
		QoS:      m.QoS,
		Retain:   m.Retain,
		Payload:  m.Payload,
		QoS2ID:   qos2Of(m),
	}
	if pr := m.Props; pr != nil {
		for _, u := range pr.User {
			p.User = append(p.User, UserProperty{Key: u.Key, Value: u.Value})
		}
		p.ContentType = pr.ContentType
		p.ResponseTopic = pr.ResponseTopic
		p.CorrelationData = pr.CorrelationData
	}
	return p
}

var errDownlinkTopic = errors.New("bridge: core topic is a downlink topic")

func unbridgedReason(err error) string {
	switch {
	case errors.Is(err, ErrInvalidCoreTopic):
		return "invalid_core_topic"
	case errors.Is(err, errDownlinkTopic):
		return "downlink_topic"
	}
	return "no_rule"
}

// logClient is the log field naming a client.
const logClient = "client"
