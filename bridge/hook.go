package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// Defaults.
const (
	DefaultDeadLetterTopic = "downlink-dlq"
	DefaultEventsTopic     = "device-events"
	DefaultMaxInflight     = 256
	DefaultHoldUnknown     = time.Hour
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
	// queued for an offline device. Defaults 1,000 and 1 MiB.
	OfflineMaxMessages int
	OfflineMaxBytes    int
	// Sessions, if set, holds the parked persistent sessions (offline ones
	// that are no longer mochi clients): point-to-point messages for them
	// are queued there (package session's Store).
	Sessions Sessions
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
	Trace  *trace.Recorder
	Logger *zerolog.Logger
}

// Sessions is what the downlink needs of the session store.
type Sessions interface {
	// Parked reports whether clientID has a parked session.
	Parked(clientID string) bool
	// Enqueue queues a QoS 1/2 publish for a parked session; an error says
	// why it was refused (queue full, say).
	Enqueue(clientID string, pk packets.Packet) error
	// InboundQoS2 records that a QoS 2 publish of clientID was stored and
	// is answered PUBREC (its PUBREL may come after a restart).
	InboundQoS2(clientID string, pid uint16)
}

// Hook is the bridge as one mochi-mqtt hook: uplink (publishes into the
// core, acknowledged once durable) and device presence events. Add it to
// the server, then call Attach with that server before serving.
type Hook struct {
	mqtt.HookBase

	opts   Options
	core   Core
	up     *Uplink
	log    zerolog.Logger
	m      *metrics
	server *mqtt.Server
	inline *mqtt.Client // republishes durable messages to MQTT subscribers

	clients   sync.Map // *mqtt.Client → *clientState, while QoS≥1 publishes are on the way
	takenOver sync.Map // *mqtt.Client → struct{}: its session was taken over
	// conns: *mqtt.Client → connSession, while connected and only when
	// tracing is on: the connect session a traced publish names.
	conns sync.Map
	seq   atomic.Uint64

	produces sync.WaitGroup // ProduceAsync calls whose done has not run
	flushers sync.WaitGroup // ack flushers running

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
		o.OfflineMaxMessages = 1000
	}
	if o.OfflineMaxBytes <= 0 {
		o.OfflineMaxBytes = 1 << 20
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
	h.dl.pending = map[string]map[uint16]pendingDown{}
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

// Attach gives the hook the server it republishes through. Call it once,
// after mqtt.New and before Serve.
func (h *Hook) Attach(s *mqtt.Server) {
	h.server = s
	h.inline = s.NewClient(nil, mqtt.LocalListener, "$ferrymq-bridge", true)
}

// ID implements mqtt.Hook.
func (h *Hook) ID() string { return "ferrymq-bridge" }

// Provides implements mqtt.Hook.
func (h *Hook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnPublish, mqtt.OnWillSent, mqtt.OnSessionEstablish, mqtt.OnSessionEstablished, mqtt.OnDisconnect,
		mqtt.OnStarted, mqtt.OnSubscribe, mqtt.OnUnsubscribe, mqtt.OnPacketEncode,
		mqtt.OnQosPublish, mqtt.OnQosComplete, mqtt.OnQosDropped, mqtt.OnPublishDropped,
	}, []byte{b})
}

// Collectors returns the bridge's metrics for a Prometheus registry.
func (h *Hook) Collectors() []prometheus.Collector { return h.m.collectors() }

// Stop implements mqtt.Hook: mochi calls it when the server closes, after
// every client is gone. It stores the queued presence events.
func (h *Hook) Stop() error {
	h.stopDownlink()
	h.stopNotices()
	return nil
}

// Drain waits until everything handed to the core has completed and its
// acknowledgement was written (or the client was gone). Call it after the
// listeners are closed and before closing the core; it also ends the
// presence-events goroutine if mochi did not (Stop).
func (h *Hook) Drain(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		h.stopDownlink()
		h.stopNotices()
		h.produces.Wait()
		h.flushers.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bridge drain: %w", ctx.Err())
	}
}

// OnPublish maps an MQTT publish onto the core. QoS 0 is appended without
// waiting. QoS 1/2 is taken over from mochi (ErrRejectPacket): the PUBACK
// or PUBREC is written, and the message delivered to MQTT subscribers, only
// once the core has it durably; many publishes of one client are in flight
// at once and share the core's group commit.
func (h *Hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl == h.inline {
		// Our own republish of a durable message: restore its origin so
		// no-local subscriptions and retained messages see the publisher.
		pk.Origin, pk.Connect.ClientIdentifier = pk.Connect.ClientIdentifier, ""
		return pk, nil
	}
	if cl.Net.Inline {
		return pk, nil
	}
	var received time.Time // when tracing: the publish hop's time
	if h.opts.Trace != nil {
		received = time.Now()
	}
	qos := pk.FixedHeader.Qos
	h.m.received.WithLabelValues(qosLabel[qos&3]).Inc()
	if inner, d, ok, err := mqtttopic.Delayed(pk.TopicName); ok {
		return h.delayedPublish(cl, pk, inner, d, err, received)
	}
	msg, rule, ok := h.mapPublish(cl, &pk)
	if !ok {
		return pk, nil
	}
	tr := h.traceUplink(cl, &pk, msg, rule, received)
	if qos == 0 {
		h.produce(msg, tr, nil)
		return pk, nil
	}
	st := h.state(cl)
	if !st.admit(&pk, h.opts.MaxInflight) {
		h.m.duplicates.Inc()
		return pk, packets.ErrRejectPacket
	}
	h.m.inflight.Inc()
	takeReceiveQuota(cl)
	h.produce(msg, tr, func(r core.SendResult, err error) {
		st.complete(h, ack{pk: pk, err: err, id: r.ID, traced: tr != nil})
	})
	return pk, packets.ErrRejectPacket
}

// delayedPublish bridges a publish to "$delayed/{seconds}/{topic}" as a
// publish to {topic} that the core delivers {seconds} later (EMQX's
// convention). It never reaches MQTT subscribers: not at once (the time has
// not come) and not later either — consumers of the core topic get it, and
// a downlink rule may send it back to devices. A malformed topic, a delay
// beyond MaxDelay or a topic no rule bridges is refused: reason code 0x90
// on MQTT 5 (QoS 1/2); an MQTT 3 client is disconnected without an ack, as
// for any refused publish; a QoS 0 one is dropped and counted.
func (h *Hook) delayedPublish(cl *mqtt.Client, pk packets.Packet, inner string, d time.Duration, err error,
	received time.Time) (packets.Packet, error) {
	var msg *core.Message
	var tr *upTrace
	if err == nil && d > h.opts.MaxDelay {
		err = fmt.Errorf("%w: %q: %v is beyond the longest delay, %v", mqtttopic.ErrBadDelayed, pk.TopicName, d, h.opts.MaxDelay)
	}
	if err == nil {
		mapped := pk
		mapped.TopicName = inner
		var ok bool
		var rule string
		if msg, rule, ok = h.mapPublish(cl, &mapped); ok {
			setDelay(msg, d)
			tr = h.traceUplink(cl, &pk, msg, rule, received)
			tr.delayedUntil(msg.DeliverAt, d)
		} else {
			err = fmt.Errorf("%w: %q: no uplink rule bridges %q", mqtttopic.ErrBadDelayed, pk.TopicName, inner)
		}
	}
	if err != nil {
		h.m.unbridged.WithLabelValues("bad_delayed").Inc()
		h.log.Debug().Err(err).Str("client", cl.ID).Msg("delayed publish refused")
	}
	if pk.FixedHeader.Qos == 0 {
		if err == nil {
			h.produce(msg, tr, nil)
		}
		return pk, packets.ErrRejectPacket // not for MQTT subscribers
	}
	st := h.state(cl)
	if !st.admit(&pk, h.opts.MaxInflight) {
		h.m.duplicates.Inc()
		return pk, packets.ErrRejectPacket
	}
	h.m.inflight.Inc()
	takeReceiveQuota(cl)
	if err != nil {
		st.complete(h, ack{pk: pk, err: err, held: true})
		return pk, packets.ErrRejectPacket
	}
	h.produce(msg, tr, func(r core.SendResult, err error) {
		st.complete(h, ack{pk: pk, err: err, held: true, id: r.ID, traced: tr != nil})
	})
	return pk, packets.ErrRejectPacket
}

// setDelay makes msg a delayed message, due d from now.
func setDelay(msg *core.Message, d time.Duration) {
	msg.DeliverAt = time.Now().Add(d)
	msg.Properties[PropDelay] = strconv.FormatInt(int64(d/time.Second), 10)
}

// OnWillSent bridges a will message like any publish (it is not
// acknowledged to anyone, so nothing waits for it).
func (h *Hook) OnWillSent(cl *mqtt.Client, pk packets.Packet) {
	var received time.Time
	if h.opts.Trace != nil {
		received = time.Now()
	}
	var msg *core.Message
	var rule string
	var ok bool
	inner, d, delayed, err := mqtttopic.Delayed(pk.TopicName)
	if delayed {
		// A will to "$delayed/{seconds}/{topic}" is delayed like a publish.
		if err != nil || d > h.opts.MaxDelay {
			h.m.unbridged.WithLabelValues("bad_delayed").Inc()
			return
		}
		mapped := pk
		mapped.TopicName = inner
		if msg, rule, ok = h.mapPublish(cl, &mapped); !ok {
			return
		}
		setDelay(msg, d)
	} else if msg, rule, ok = h.mapPublish(cl, &pk); !ok {
		return
	}
	tr := h.traceUplink(cl, &pk, msg, rule, received)
	if tr != nil {
		tr.attrs["will"] = "true"
	}
	if delayed {
		tr.delayedUntil(msg.DeliverAt, d)
	}
	h.produce(msg, tr, func(_ core.SendResult, err error) {
		if err != nil {
			h.log.Warn().Err(err).Str("client", cl.ID).Msg("will not bridged")
		}
	})
}

// mapPublish applies the uplink rules to pk and says which rule's filter
// matched; false (counted by reason) when it stays MQTT-only. No loops: a
// downlink topic is fed by backends only, never by the uplink.
func (h *Hook) mapPublish(cl *mqtt.Client, pk *packets.Packet) (*core.Message, string, bool) {
	msg, rule, err := h.up.MapRule(publishOf(cl, pk))
	if err == nil && h.downTopic[msg.Topic] {
		err = errDownlinkTopic
	}
	if err != nil {
		h.m.unbridged.WithLabelValues(unbridgedReason(err)).Inc()
		return nil, "", false
	}
	return msg, rule.Filter, true
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

func (h *Hook) state(cl *mqtt.Client) *clientState {
	if v, ok := h.clients.Load(cl); ok {
		return v.(*clientState)
	}
	v, _ := h.clients.LoadOrStore(cl, &clientState{cl: cl})
	return v.(*clientState)
}

// republish hands a durable message to mochi for its MQTT subscribers and
// retained store, as the publisher's own publish would have been.
func (h *Hook) republish(origin string, pk packets.Packet) {
	pk.Connect.ClientIdentifier = origin
	pk.FixedHeader.Dup = false
	if err := h.server.InjectPacket(h.inline, pk); err != nil {
		h.log.Debug().Err(err).Str("client", origin).Msg("republish to mqtt subscribers")
	}
}

var qosLabel = [4]string{"0", "1", "2", "3"}

func publishOf(cl *mqtt.Client, pk *packets.Packet) *Publish {
	p := &Publish{
		Topic:    pk.TopicName,
		ClientID: cl.ID,
		Username: string(cl.Properties.Username),
		QoS:      pk.FixedHeader.Qos,
		Retain:   pk.FixedHeader.Retain,
		Payload:  pk.Payload,
	}
	if cl.Properties.ProtocolVersion == 5 {
		for _, u := range pk.Properties.User {
			p.User = append(p.User, UserProperty{Key: u.Key, Value: u.Val})
		}
		p.ContentType = pk.Properties.ContentType
		p.ResponseTopic = pk.Properties.ResponseTopic
		p.CorrelationData = pk.Properties.CorrelationData
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

func atomicAdd(p *int64, d int64) { atomic.AddInt64(p, d) }
