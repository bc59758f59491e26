package bridge

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// DownlinkRule maps a core topic onto MQTT: every gateway node consumes
// the topic in broadcast mode (its own offsets) and publishes each message
// to its MQTT clients.
type DownlinkRule struct {
	// Topic is the core topic to consume.
	Topic string `json:"topic"`
	// MQTTTopic is the MQTT topic template (${key}, ${prop:NAME}, literal
	// text). A message's mqtt.topic property, when set, wins.
	MQTTTopic string `json:"mqtt_topic"`
	// QoS is the MQTT QoS (0–2); a message's mqtt.qos property wins.
	QoS byte `json:"qos"`
	// TTL, when > 0, drops messages older than this (since they were
	// produced) with an "expired" receipt; a message's mqtt.ttl property (a
	// Go duration or seconds) wins. MQTT 5 devices get the rest as Message
	// Expiry Interval.
	TTL time.Duration `json:"ttl"`
}

// DefaultDownlinkRules is the downlink with no configuration: core topic
// "commands" goes to the MQTT topic in the message's mqtt.topic property,
// or commands/<key>, at QoS 1.
func DefaultDownlinkRules() []DownlinkRule {
	return []DownlinkRule{{Topic: "commands", MQTTTopic: "commands/${key}", QoS: 1}}
}

// Properties a downlink message may carry.
const (
	PropTTL = "mqtt.ttl" // Go duration ("90s") or whole seconds
	// PropClientID (mqtt.clientid) makes a message point-to-point: only that
	// client gets it, subscribed or not. PropTopic, PropQoS and PropRetain
	// (mqtt.topic, mqtt.qos, mqtt.retain) override the rule.
)

// DefaultReceiptsTopic receives delivery receipts.
const DefaultReceiptsTopic = "device-receipts"

// Receipt outcomes.
const (
	OutcomeDelivered    = "delivered"     // the device acknowledged it (PUBACK / PUBCOMP)
	OutcomeExpired      = "expired"       // its TTL passed before the device acknowledged it
	OutcomeDropped      = "dropped"       // the device's queue or inflight window was full
	OutcomeInvalidTopic = "invalid_topic" // no valid MQTT topic: never published
)

// Receipt is the JSON body of a message on the receipts topic (key = the
// client ID, or the command's key when no single client is meant).
type Receipt struct {
	MessageID string    `json:"message_id"`
	ClientID  string    `json:"clientid,omitempty"`
	Outcome   string    `json:"outcome"`
	Time      time.Time `json:"ts"`
	Topic     string    `json:"topic,omitempty"` // the MQTT topic
	Node      string    `json:"node,omitempty"`
	Reason    string    `json:"reason,omitempty"`
}

type downlinkRule struct {
	DownlinkRule
	mqtt template
}

func compileDownlink(rules []DownlinkRule) ([]downlinkRule, error) {
	if rules == nil {
		rules = DefaultDownlinkRules()
	}
	var out []downlinkRule
	var errs []error
	seen := map[string]bool{}
	for i, r := range rules {
		var err error
		switch {
		case core.ValidateTopic(r.Topic) != nil:
			err = fmt.Errorf("%w: %w", ErrBadRule, core.ValidateTopic(r.Topic))
		case seen[r.Topic]:
			err = fmt.Errorf("%w: core topic %q consumed twice", ErrBadRule, r.Topic)
		case r.QoS > 2:
			err = fmt.Errorf("%w: qos %d", ErrBadRule, r.QoS)
		case r.MQTTTopic == "":
			err = fmt.Errorf("%w: no mqtt topic", ErrBadRule)
		}
		cr := downlinkRule{DownlinkRule: r}
		if err == nil {
			cr.mqtt, err = parseTemplate(r.MQTTTopic)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("downlink rule %d: %w", i+1, err))
			continue
		}
		seen[r.Topic] = true
		out = append(out, cr)
	}
	return out, errors.Join(errs...)
}

// downlink consumes the downlink topics; started once the engine serves
// (Hook.Start), stopped by Drain.
type downlink struct {
	group  string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	held      map[string]*heldQueue // unknown client → commands held for it (held.go)
	heldN     int
	heldBytes int
	waiters   map[string]chan struct{} // client → closed when its inflight window moves
}

// downWindow is how many QoS 1/2 messages one client may have in flight or
// queued before point-to-point delivery to it waits (so a burst of commands
// is not dropped by the session's bounded queue); downWait bounds the
// wait.
const (
	downWindow = 64
	downWait   = 30 * time.Second
)

// waitWindow waits until client has room, it goes away, or downWait
// passes (false: not delivered).
func (h *Hook) waitWindow(ctx context.Context, client string) bool {
	deadline := time.NewTimer(downWait)
	defer deadline.Stop()
	busy := func() bool {
		inflight, queued, _, ok := h.e.Window(client)
		return ok && inflight+queued >= downWindow
	}
	for busy() {
		if !h.e.Connected(client) {
			return false
		}
		h.dl.mu.Lock()
		ch := h.dl.waiters[client]
		if ch == nil {
			ch = make(chan struct{})
			h.dl.waiters[client] = ch
		}
		h.dl.mu.Unlock()
		if !busy() { // moved while registering
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return false
		}
	}
	return true
}

// wake releases whoever waits for client's window.
func (h *Hook) wake(client string) {
	h.dl.mu.Lock()
	if ch := h.dl.waiters[client]; ch != nil {
		close(ch)
		delete(h.dl.waiters, client)
	}
	h.dl.mu.Unlock()
}

// groupName is the per-node broadcast group: each node has its own offsets.
func groupName(node string) string {
	b := []byte("gateway-" + node)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// Start starts consuming the downlink topics; call it once the engine
// serves.
func (h *Hook) Start() {
	if h.opts.DisableDownlink || h.e == nil || len(h.down) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.dl.cancel = cancel
	start := time.Now() // before the gateway's Start returns: nothing produced after that is skipped
	if h.opts.HoldUnknown > 0 {
		h.dl.wg.Go(func() { h.sweepHeld(ctx) })
	}
	for i := range h.down {
		r := &h.down[i]
		h.dl.wg.Go(func() { h.consumeDownlink(ctx, r, start) })
	}
}

func (h *Hook) stopDownlink() {
	if h.dl.cancel != nil {
		h.dl.cancel()
		h.dl.wg.Wait()
	}
}

// consumeDownlink delivers every message of r.Topic on this node until
// ctx ends (the Core retries errors; the last one is logged).
func (h *Hook) consumeDownlink(ctx context.Context, r *downlinkRule, start time.Time) {
	err := h.core.Broadcast(ctx, r.Topic, h.dl.group, h.opts.Node, start, func(ctx context.Context, m *core.StoredMessage) {
		h.deliverDown(ctx, r, m)
	})
	if err != nil && ctx.Err() == nil {
		h.log.Error().Err(err).Str("topic", r.Topic).Msg("downlink stopped")
	} else if err != nil {
		h.log.Debug().Err(err).Str("topic", r.Topic).Msg("downlink ended")
	}
}

// deliverDown publishes one core message to MQTT on this node.
func (h *Hook) deliverDown(ctx context.Context, r *downlinkRule, m *core.StoredMessage) {
	props := m.Properties
	target := props[PropClientID]
	topic := props[PropTopic]
	if topic == "" {
		topic = r.mqtt.expand(&vars{key: m.ShardingKey, props: props})
	}
	qos := r.QoS
	if v, ok := props[PropQoS]; ok {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 && n <= 2 {
			qos = byte(n)
		}
	}
	ttl := r.TTL
	if v, ok := props[PropTTL]; ok {
		if d, err := time.ParseDuration(v); err == nil {
			ttl = d
		} else if n, err := strconv.Atoi(v); err == nil {
			ttl = time.Duration(n) * time.Second
		}
	}
	id := m.ID.String()
	tr := h.downTraceOf(r.Topic, m)
	receiptKey := target
	if receiptKey == "" {
		receiptKey = m.ShardingKey
	}
	h.m.downlink.WithLabelValues("consumed").Inc()
	var left time.Duration
	if ttl > 0 {
		if left = ttl - time.Since(m.BornAt); left <= 0 {
			h.receipt(receiptKey, &Receipt{MessageID: id, ClientID: target, Outcome: OutcomeExpired, Topic: topic}, tr)
			return
		}
	}
	if !validTopicName(topic) {
		const reason = "not a valid MQTT topic name (empty, wildcards, $ferrymq/, or over 65535 bytes)"
		h.receipt(receiptKey, &Receipt{MessageID: id, ClientID: target, Outcome: OutcomeInvalidTopic, Topic: topic, Reason: reason}, tr)
		h.deadLetter(m, reason)
		return
	}
	now := time.Now()
	msg := &engine.Message{Topic: topic, Payload: m.Body, QoS: qos, Ref: tr.ref(id), Created: now.UnixNano()}
	if left > 0 {
		msg.Expiry = now.Unix() + int64((left+time.Second-1)/time.Second)
	}
	if target == "" {
		msg.Retain = props[PropRetain] == "true"
		if err := h.e.Publish(msg, false); err != nil {
			h.log.Debug().Err(err).Str("topic", topic).Msg("downlink publish")
			return
		}
		h.m.downlink.WithLabelValues("published").Inc()
		return
	}
	// Point-to-point: that client only, subscribed or not.
	drop := func(reason string) {
		h.receipt(receiptKey, &Receipt{MessageID: id, ClientID: target, Outcome: OutcomeDropped, Topic: topic, Reason: reason}, tr)
	}
	switch {
	case !validP2PClient(target):
		h.m.downlink.WithLabelValues("not_here").Inc()
		return
	case h.e.Connected(target):
		if qos > 0 && !h.waitWindow(ctx, target) {
			if ctx.Err() == nil {
				drop("the device did not acknowledge earlier messages in time")
			}
			return
		}
	case h.e.HasSession(target):
		if qos == 0 {
			drop("QoS 0 is not queued for an offline device")
			return
		}
		if err := h.e.Send(target, msg); err != nil {
			drop(err.Error())
			return
		}
		h.m.downlink.WithLabelValues("queued").Inc()
		h.traceDeliver(tr, target, topic, qos, 0, false, downQueued, time.Time{})
		return
	case h.opts.HoldUnknown > 0 && qos > 0:
		deadline := now.Add(h.opts.HoldUnknown)
		if left > 0 && now.Add(left).Before(deadline) {
			deadline = now.Add(left)
		}
		h.hold(target, heldMsg{m: msg, id: id, topic: topic, receiptKey: receiptKey, deadline: deadline, tr: tr})
		return
	default:
		h.m.downlink.WithLabelValues("not_here").Inc()
		return // connected to another node (holding is off), or QoS 0
	}
	switch err := h.e.Send(target, msg); {
	case err == nil:
		h.m.downlink.WithLabelValues("published").Inc()
	case errors.Is(err, engine.ErrNotConnected):
		drop("QoS 0 is not queued for an offline device")
	default:
		h.m.downlink.WithLabelValues("not_here").Inc() // the session went away meanwhile
	}
}

// Sent implements engine.Delivery: a downlink PUBLISH was written to a
// device at at (the deliver hop of a traced command).
func (h *Hook) Sent(clientID string, m *engine.Message, pid uint16, dup bool, at time.Time) {
	if h.opts.Trace == nil {
		return
	}
	_, tr := splitRef(m.Ref)
	h.traceDeliver(tr, clientID, m.Topic, m.QoS, pid, dup, downWritten, at)
}

// Delivered implements engine.Delivery: the device acknowledged a command
// (PUBACK, PUBCOMP) — its "delivered" receipt. QoS 0 has none: nothing
// acknowledges it.
func (h *Hook) Delivered(clientID string, m *engine.Message, pid uint16) {
	h.wake(clientID)
	if m.QoS == 0 {
		return
	}
	id, tr := splitRef(m.Ref)
	h.traceDeviceAck(tr, clientID, m.Topic, m.QoS, pid)
	h.receipt(clientID, &Receipt{MessageID: id, ClientID: clientID, Outcome: OutcomeDelivered, Topic: m.Topic}, tr)
}

// Discarded implements engine.Delivery: a command will never reach the
// device — its "expired" or "dropped" receipt.
func (h *Hook) Discarded(clientID string, m *engine.Message, expired bool, reason string) {
	h.wake(clientID)
	r, tr := discardReceipt(clientID, m, expired, reason)
	h.receipt(clientID, r, tr)
}

func discardReceipt(clientID string, m *engine.Message, expired bool, reason string) (*Receipt, downTrace) {
	id, tr := splitRef(m.Ref)
	outcome := OutcomeDropped
	if expired {
		outcome = OutcomeExpired
	}
	return &Receipt{MessageID: id, ClientID: clientID, Outcome: outcome, Topic: m.Topic, Reason: reason}, tr
}

// DiscardedDurably implements engine.DurableDelivery: Discarded for a
// command leaving an offline session (expired there, or its session
// expired), stored before the engine lets it go. nil: stored (or receipts
// are off); an error: not stored (the core refuses writes, ctx ended), and
// the engine offers it again at its next sweep.
func (h *Hook) DiscardedDurably(ctx context.Context, clientID string, m *engine.Message, expired bool, reason string) error {
	r, tr := discardReceipt(clientID, m, expired, reason)
	if !h.opts.DisableReceipts {
		done := make(chan error, 1)
		h.core.ProduceAsync([]*core.Message{h.receiptMessage(clientID, r)}, func(_ []core.SendResult, err error) { done <- err })
		var err error
		select {
		case err = <-done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err != nil {
			h.m.receiptFailures.Inc()
			return fmt.Errorf("store the %s receipt of %s for %s: %w", r.Outcome, r.MessageID, clientID, err)
		}
		h.m.receipts.Inc()
	}
	h.m.downlink.WithLabelValues(r.Outcome).Inc()
	h.traceReceipt(tr, r)
	return nil
}

// validTopicName: non-empty, no wildcards, no NUL, at most 65535 bytes
// [MQTT-3.3.2-2] [MQTT-4.7.3-1].
func validTopicName(t string) bool {
	return t != "" && len(t) <= 65535 && !strings.ContainsAny(t, "+#\x00") && !strings.HasPrefix(t, mqtttopic.Internal)
}

// validP2PClient: the client ID can be part of a topic filter.
func validP2PClient(id string) bool { return id != "" && !strings.ContainsAny(id, "+#\x00") }

// receipt counts a downlink message's outcome and stores its receipt; a
// traced message (tr) records its receipt hop.
func (h *Hook) receipt(key string, r *Receipt, tr downTrace) {
	h.m.downlink.WithLabelValues(r.Outcome).Inc()
	if h.opts.DisableReceipts {
		return
	}
	h.enqueue(h.receiptMessage(key, r))
	h.traceReceipt(tr, r)
}

// receiptMessage stamps r (time, node) and encodes it as the message
// stored in the receipts topic under key.
func (h *Hook) receiptMessage(key string, r *Receipt) *core.Message {
	r.Time = time.Now().UTC()
	r.Node = h.opts.Node
	return &core.Message{Topic: h.opts.ReceiptsTopic, ShardingKey: key, Tag: r.Outcome, Body: r.appendJSON(nil)}
}

// appendJSON encodes r as encoding/json would.
func (r *Receipt) appendJSON(b []byte) []byte {
	b = append(b, `{"message_id":`...)
	b = appendJSONString(b, r.MessageID)
	if r.ClientID != "" {
		b = append(b, `,"clientid":`...)
		b = appendJSONString(b, r.ClientID)
	}
	b = append(b, `,"outcome":`...)
	b = appendJSONString(b, r.Outcome)
	b = append(b, `,"ts":"`...)
	b = r.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	for _, f := range [...]struct{ k, v string }{{"topic", r.Topic}, {"node", r.Node}, {"reason", r.Reason}} {
		if f.v != "" {
			b = append(b, ',', '"')
			b = append(b, f.k...)
			b = append(b, '"', ':')
			b = appendJSONString(b, f.v)
		}
	}
	return append(b, '}')
}

// Properties of a dead-lettered downlink message (besides the original's).
const (
	PropDLQReason      = "dlq.reason"
	PropDLQOriginID    = "dlq.origin_id"
	PropDLQOriginTopic = "dlq.origin_topic"
)

// deadLetter stores a copy of a downlink message that can never be
// delivered in the dead-letter topic, with the reason; each node that
// consumed it does so (the copies carry the same dlq.origin_id).
func (h *Hook) deadLetter(m *core.StoredMessage, reason string) {
	if h.opts.DeadLetterTopic == "-" {
		return
	}
	props := make(map[string]string, len(m.Properties)+3)
	for k, v := range m.Properties {
		props[k] = v
	}
	props[PropDLQReason] = reason
	props[PropDLQOriginID] = m.ID.String()
	props[PropDLQOriginTopic] = m.Topic
	msg := &core.Message{Topic: h.opts.DeadLetterTopic, ShardingKey: m.ShardingKey, Tag: m.Tag, Keys: m.Keys,
		Properties: props, Body: m.Body, BornAt: m.BornAt}
	h.produces.Add(1)
	h.core.ProduceAsync([]*core.Message{msg}, func(_ []core.SendResult, err error) {
		defer h.produces.Done()
		if err != nil {
			h.log.Warn().Err(err).Str("id", m.ID.String()).Msg("dead-letter downlink message")
		}
	})
}
