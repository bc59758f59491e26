package bridge

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/ferrymq/ferrymq/core"
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

// Each client is subscribed to mqtttopic.P2P+clientID so point-to-point
// messages travel mochi's normal path (queue, inflight, packet IDs,
// resend); the topic is rewritten to the real one as the packet is
// encoded. Clients cannot subscribe or unsubscribe in mqtttopic.Internal.
//
// Origins of downlink packets (never a client ID: '$' prefix): originDown+id
// for topic deliveries, originP2P+id+"/"+topic for P2P.
const (
	originDown = mqtttopic.Internal + "down/"
	originP2P  = mqtttopic.P2P
)

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

// downlink consumes the downlink topics; started when mochi serves
// (OnStarted), stopped before mochi's hooks stop.
type downlink struct {
	group  string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	pending   map[string]map[uint16]pendingDown // online client → packet ID → what it carries
	held      map[string]*heldQueue             // unknown client → commands held for it (held.go)
	heldN     int
	heldBytes int
	waiters   map[string]chan struct{} // client → closed when its inflight window moves
}

// downWindow is how many QoS 1/2 messages one client may have unacknowledged
// before point-to-point delivery to it waits (so a burst of commands is not
// dropped by mochi's bounded per-client queue); downWait bounds the wait.
const (
	downWindow = 64
	downWait   = 30 * time.Second
)

// waitWindow waits until cl has room in its inflight window, it goes away,
// or downWait passes (false: not delivered).
func (h *Hook) waitWindow(ctx context.Context, cl *mqtt.Client) bool {
	deadline := time.NewTimer(downWait)
	defer deadline.Stop()
	for cl.State.Inflight.Len() >= downWindow {
		if cl.Closed() {
			return false
		}
		h.dl.mu.Lock()
		ch := h.dl.waiters[cl.ID]
		if ch == nil {
			ch = make(chan struct{})
			h.dl.waiters[cl.ID] = ch
		}
		h.dl.mu.Unlock()
		if cl.State.Inflight.Len() < downWindow { // moved while registering
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

// wake releases whoever waits for cl's window.
func (h *Hook) wake(client string) {
	h.dl.mu.Lock()
	if ch := h.dl.waiters[client]; ch != nil {
		close(ch)
		delete(h.dl.waiters, client)
	}
	h.dl.mu.Unlock()
}

// pendingDown is what a downlink packet sent to a device carries: the
// message ID, its MQTT topic and its trace.
type pendingDown struct {
	id, topic string
	tr        downTrace
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

// OnStarted starts consuming the downlink topics.
func (h *Hook) OnStarted() {
	if h.opts.DisableDownlink || h.server == nil || len(h.down) == 0 {
		return
	}
	for _, cl := range h.server.Clients.GetAll() { // sessions restored from storage
		h.subscribeP2P(cl)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.dl.cancel = cancel
	start := time.Now() // before Gateway.Start returns: nothing produced after that is skipped
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
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos},
		TopicName:   topic,
		Payload:     m.Body,
		Created:     now.Unix(),
		PacketID:    uint16(qos), // mochi's validity check wants one for QoS > 0; never used inbound
	}
	if left > 0 {
		secs := int64((left + time.Second - 1) / time.Second)
		pk.Properties.MessageExpiryInterval = uint32(secs)
		pk.Expiry = now.Unix() + secs
	}
	origin := originDown + tr.ref(id)
	queued := false // for an offline client, in mochi's inflight window
	if target != "" {
		if !validP2PClient(target) {
			h.m.downlink.WithLabelValues("not_here").Inc()
			return
		}
		pk.TopicName = mqtttopic.P2P + target
		origin = originP2P + tr.ref(id) + "/" + topic
		pk.Origin = origin // a queued packet keeps it; an injected one gets it from Connect.ClientIdentifier
		pk.Connect.ClientIdentifier = origin
		cl, here := h.server.Clients.Get(target)
		switch {
		case here: // delivered below
		case h.opts.Sessions != nil && h.opts.Sessions.Parked(target):
			h.queueParked(receiptKey, target, id, topic, pk, tr)
			return
		case h.opts.HoldUnknown > 0 && qos > 0:
			deadline := now.Add(h.opts.HoldUnknown)
			if left > 0 && now.Add(left).Before(deadline) {
				deadline = now.Add(left)
			}
			h.hold(target, heldMsg{pk: pk, id: id, topic: topic, receiptKey: receiptKey, deadline: deadline, tr: tr})
			return
		default:
			h.m.downlink.WithLabelValues("not_here").Inc()
			return // connected to another node (holding is off), or QoS 0
		}
		if cl.Closed() { // offline, not parked yet: mochi queues QoS 1/2 in its inflight window
			reason := ""
			n, bytes := inflightOf(cl)
			switch {
			case qos == 0:
				reason = "QoS 0 is not queued for an offline device"
			case n >= h.opts.OfflineMaxMessages || n >= int(h.server.Options.Capabilities.MaximumInflight):
				reason = "the offline device's queue is full (messages)"
			case bytes+len(m.Body) > h.opts.OfflineMaxBytes:
				reason = "the offline device's queue is full (bytes)"
			}
			if reason != "" {
				h.receipt(receiptKey, &Receipt{MessageID: id, ClientID: target, Outcome: OutcomeDropped, Topic: topic, Reason: reason}, tr)
				return
			}
			queued = true
		} else if qos > 0 && !h.waitWindow(ctx, cl) {
			if ctx.Err() == nil {
				h.receipt(receiptKey, &Receipt{MessageID: id, ClientID: target, Outcome: OutcomeDropped, Topic: topic,
					Reason: "the device did not acknowledge earlier messages in time"}, tr)
			}
			return
		}
	} else {
		pk.FixedHeader.Retain = props[PropRetain] == "true"
	}
	pk.Connect.ClientIdentifier = origin // becomes pk.Origin in OnPublish
	if err := h.server.InjectPacket(h.inline, pk); err != nil {
		h.log.Debug().Err(err).Str("topic", topic).Msg("downlink publish")
		return
	}
	h.m.downlink.WithLabelValues("published").Inc()
	if queued { // a connected device's deliver hop is recorded as the packet is written (OnPacketEncode)
		h.traceDeliver(tr, target, topic, &pk, downQueued)
	}
}

// queueParked queues a point-to-point message (addressed and with its
// origin) for a parked session.
func (h *Hook) queueParked(receiptKey, target, id, topic string, pk packets.Packet, tr downTrace) {
	reason := "QoS 0 is not queued for an offline device"
	if pk.FixedHeader.Qos > 0 {
		err := h.opts.Sessions.Enqueue(target, pk)
		if err == nil {
			h.m.downlink.WithLabelValues("queued").Inc()
			h.traceDeliver(tr, target, topic, &pk, downQueued)
			return
		}
		reason = err.Error()
	}
	h.receipt(receiptKey, &Receipt{MessageID: id, ClientID: target, Outcome: OutcomeDropped, Topic: topic, Reason: reason}, tr)
}

// inflightOf counts an offline client's queued messages and their bytes.
func inflightOf(cl *mqtt.Client) (n, bytes int) {
	for _, pk := range cl.State.Inflight.GetAll(false) {
		n++
		bytes += len(pk.Payload)
	}
	return n, bytes
}

// Discarded turns a queued message the session store gave up on into a
// receipt, when it is a downlink message.
func (h *Hook) Discarded(clientID string, pk packets.Packet, expired bool, reason string) {
	if r, tr, ok := discardReceipt(clientID, pk, expired, reason); ok {
		h.receipt(clientID, r, tr)
	}
}

// discardReceipt is the receipt of a queued message the session store
// discarded, if it is a downlink command (ok).
func discardReceipt(clientID string, pk packets.Packet, expired bool, reason string) (*Receipt, downTrace, bool) {
	d, ok := downlinkOf(pk.Origin, pk.TopicName)
	if !ok {
		return nil, downTrace{}, false
	}
	outcome := OutcomeDropped
	if expired {
		outcome = OutcomeExpired
	}
	return &Receipt{MessageID: d.id, ClientID: clientID, Outcome: outcome, Topic: d.topic, Reason: reason}, d.tr, true
}

// DiscardedDurably is Discarded for a message the session store keeps
// queued until its receipt is stored (session.Options.DiscardedDurably): it
// stores the receipt and waits for the core. nil: stored, or none is due
// (not a downlink command, receipts disabled); an error: not stored (the
// core refuses writes, ctx ended), and the store offers it again later.
func (h *Hook) DiscardedDurably(ctx context.Context, clientID string, pk packets.Packet, expired bool, reason string) error {
	r, tr, ok := discardReceipt(clientID, pk, expired, reason)
	if !ok {
		return nil
	}
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

// subscribeP2P gives a client its internal point-to-point subscription.
func (h *Hook) subscribeP2P(cl *mqtt.Client) {
	if !validP2PClient(cl.ID) {
		return
	}
	sub := packets.Subscription{Filter: mqtttopic.P2P + cl.ID, Qos: 2}
	if h.server.Topics.Subscribe(cl.ID, sub) {
		atomicAdd(&h.server.Info.Subscriptions, 1)
	}
	cl.State.Subscriptions.Add(sub.Filter, sub)
}

// OnSubscribe refuses filters in the internal namespace: a client must not
// read another client's point-to-point messages.
func (h *Hook) OnSubscribe(_ *mqtt.Client, pk packets.Packet) packets.Packet {
	for i := range pk.Filters {
		if _, f, _ := mqtttopic.Unshare(pk.Filters[i].Filter); strings.HasPrefix(f, mqtttopic.Internal) {
			pk.Filters[i].Filter = "#/refused" // invalid: answered 0x8F (v5) / 0x80 (v3)
		}
	}
	return pk
}

// OnUnsubscribe keeps the internal subscription in place.
func (h *Hook) OnUnsubscribe(_ *mqtt.Client, pk packets.Packet) packets.Packet {
	for i := range pk.Filters {
		if strings.HasPrefix(pk.Filters[i].Filter, mqtttopic.Internal) {
			pk.Filters[i].Filter = mqtttopic.Internal + "none"
		}
	}
	return pk
}

// OnPacketEncode gives point-to-point packets their real topic (and no
// topic alias: the alias mochi may have set names the internal topic),
// and records the deliver hop of traced downlink packets as they are
// written.
func (h *Hook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type != packets.Publish {
		return pk
	}
	switch {
	case strings.HasPrefix(pk.Origin, originP2P):
		ref, topic, ok := parseP2POrigin(pk.Origin)
		if !ok {
			return pk
		}
		pk.TopicName = topic
		pk.Properties.TopicAlias, pk.Properties.TopicAliasFlag = 0, false
		if h.opts.Trace != nil {
			_, tr := splitRef(ref)
			h.traceDeliver(tr, cl.ID, topic, &pk, downWritten)
		}
	case h.opts.Trace != nil && strings.HasPrefix(pk.Origin, originDown):
		_, tr := splitRef(pk.Origin[len(originDown):])
		h.traceDeliver(tr, cl.ID, pk.TopicName, &pk, downWritten)
	}
	return pk
}

// parseP2POrigin splits a point-to-point origin into the message's
// reference (its ID, and its trace: splitRef) and MQTT topic.
func parseP2POrigin(o string) (ref, topic string, ok bool) {
	rest := strings.TrimPrefix(o, originP2P)
	return strings.Cut(rest, "/")
}

// downlinkOf says which downlink message a packet with this origin and
// topic carries; false if none.
func downlinkOf(origin, topic string) (pendingDown, bool) {
	var ref string
	switch {
	case strings.HasPrefix(origin, originP2P):
		var ok bool
		if ref, topic, ok = parseP2POrigin(origin); !ok {
			return pendingDown{}, false
		}
	case strings.HasPrefix(origin, originDown):
		ref = origin[len(originDown):]
	default:
		return pendingDown{}, false
	}
	id, tr := splitRef(ref)
	return pendingDown{id: id, topic: topic, tr: tr}, true
}

// OnQosPublish remembers which downlink message a QoS 1/2 packet carries.
func (h *Hook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, _ int) {
	d, ok := downlinkOf(pk.Origin, pk.TopicName)
	if !ok || pk.FixedHeader.Type != packets.Publish || cl.Closed() {
		return // an offline client's queue is tracked again when it is resent
	}
	h.dl.mu.Lock()
	m := h.dl.pending[cl.ID]
	if m == nil {
		m = map[uint16]pendingDown{}
		h.dl.pending[cl.ID] = m
	}
	m[pk.PacketID] = d // a resend replaces the entry
	h.dl.mu.Unlock()
}

func (h *Hook) takePending(client string, pid uint16) (pendingDown, bool) {
	h.dl.mu.Lock()
	defer h.dl.mu.Unlock()
	m := h.dl.pending[client]
	p, ok := m[pid]
	if ok {
		delete(m, pid)
		if len(m) == 0 {
			delete(h.dl.pending, client)
		}
	}
	return p, ok
}

// OnQosComplete turns a device's PUBACK / PUBCOMP into a receipt.
func (h *Hook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type != packets.Puback && pk.FixedHeader.Type != packets.Pubcomp {
		return
	}
	h.wake(cl.ID)
	if p, ok := h.takePending(cl.ID, pk.PacketID); ok {
		h.traceDeviceAck(p.tr, cl.ID, &pk, p.topic)
		h.receipt(cl.ID, &Receipt{MessageID: p.id, ClientID: cl.ID, Outcome: OutcomeDelivered, Topic: p.topic}, p.tr)
	}
}

// OnQosDropped: mochi gave up on a packet — expired in the inflight
// window, or its session was discarded (a clean start). A takeover moving
// the packet to the new connection is not a drop.
func (h *Hook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	h.wake(cl.ID)
	if cl.IsTakenOver() {
		return
	}
	h.takePending(cl.ID, pk.PacketID)
	d, ok := downlinkOf(pk.Origin, pk.TopicName)
	if !ok || pk.FixedHeader.Type != packets.Publish {
		return
	}
	outcome, reason := OutcomeExpired, ""
	if pk.Expiry > 0 && pk.Expiry > time.Now().Unix() {
		outcome, reason = OutcomeDropped, "the session was discarded"
	}
	h.receipt(cl.ID, &Receipt{MessageID: d.id, ClientID: cl.ID, Outcome: outcome, Topic: d.topic, Reason: reason}, d.tr)
}

// forgetPending forgets a client's sent messages when its connection ends
// (a resumed session resends them, which tracks them again).
func (h *Hook) forgetPending(client string) {
	h.dl.mu.Lock()
	delete(h.dl.pending, client)
	h.dl.mu.Unlock()
}

// OnPublishDropped: mochi's queue to a device was full. A downlink message
// gets a "dropped" receipt.
func (h *Hook) OnPublishDropped(cl *mqtt.Client, pk packets.Packet) {
	d, ok := downlinkOf(pk.Origin, pk.TopicName)
	if !ok {
		return
	}
	h.receipt(cl.ID, &Receipt{MessageID: d.id, ClientID: cl.ID, Outcome: OutcomeDropped, Topic: d.topic,
		Reason: "the device's outbound queue was full"}, d.tr)
}

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
