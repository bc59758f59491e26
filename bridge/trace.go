package bridge

import (
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// The bridge records the MQTT hops of traced messages (Options.Trace) —
// only of messages whose core topic the Recorder traces, which costs one
// atomic load per message when it traces nothing, and nothing at all when
// Options.Trace is nil.
//
// Uplink, under the ID the core gave the stored message:
//
//	mqtt.publish  when the PUBLISH arrived; actor the client ID
//	stored        when the core stored it (delayed: when it was scheduled)
//	mqtt.ack      when the PUBACK / PUBREC was written (QoS 1 and 2)
//
// Downlink, under the command's trace.IDOf:
//
//	mqtt.deliver     written to a device, or queued for one (queued=true)
//	mqtt.device-ack  the device's PUBACK / PUBCOMP
//	receipt          a receipt was produced, with its outcome

// Attributes of the bridge's hops.
const (
	attrMQTTTopic = "mqtt_topic"
	attrQoS       = "qos"
	attrPacketID  = "packet_id"
	attrTopic     = "topic" // the core topic
)

// connSession is when a traced client's connection began, and the
// sequence number of its "connected" presence event (in EventsTopic), which
// the publish hop names so that a trace leads to the device's connect
// session.
type connSession struct {
	at  time.Time
	seq uint64
}

// upTrace is a traced uplink publish on its way to the core: its hops are
// recorded once the core gives the message its ID.
type upTrace struct {
	at     time.Time // the PUBLISH arrived
	client string
	key    string            // the message's sharding key
	attrs  map[string]string // of the publish hop
	// delayed: a "$delayed/{seconds}/{topic}" publish, due then.
	delayed bool
	due     time.Time
	delay   time.Duration
}

// traceUplink returns the trace of pk, received at at and mapped by the
// uplink rule whose filter is rule onto msg, or nil when msg's core topic
// is not traced.
func (h *Hook) traceUplink(cl *engine.Client, pk *engine.Message, msg *core.Message, rule string, at time.Time) *upTrace {
	if !h.opts.Trace.Enabled(msg.Topic) {
		return nil
	}
	if at.IsZero() {
		at = time.Now()
	}
	qos := pk.QoS
	a := make(map[string]string, 8)
	a[attrMQTTTopic] = pk.Topic
	a[attrQoS] = qosLabel[qos&3]
	a["protocol"] = strconv.Itoa(int(cl.Protocol())) // 3 = 3.1, 4 = 3.1.1, 5 = 5.0
	if cl.Username() != "" {
		a["username"] = cl.Username()
	}
	if cl.Remote() != "" {
		a["remote"] = cl.Remote()
	}
	if pk.PacketID != 0 {
		a[attrPacketID] = strconv.Itoa(int(pk.PacketID))
	}
	a["rule"] = rule
	if v, ok := h.conns.Load(cl); ok {
		cs := v.(connSession)
		a["connected_at"] = cs.at.UTC().Format(time.RFC3339Nano)
		if cs.seq != 0 {
			a["connect_seq"] = strconv.FormatUint(cs.seq, 10) // the seq of its "connected" presence event
		}
	}
	return &upTrace{at: at, client: cl.ID(), key: msg.ShardingKey, attrs: a}
}

// delayedUntil marks t (if any) as a delayed publish, due at due, d after
// it arrived.
func (t *upTrace) delayedUntil(due time.Time, d time.Duration) {
	if t != nil {
		t.delayed, t.due, t.delay = true, due, d
	}
}

// traceStored records the publish hop of a traced publish and where the
// core stored it (r): the stored hop, or for a delayed publish the delayed
// hop (the core records stored when it is delivered).
func (h *Hook) traceStored(t *upTrace, r *core.SendResult) {
	rec := h.opts.Trace
	rec.Record(trace.Event{ID: r.ID, Hop: trace.HopPublish, At: t.at, Actor: t.client, Attrs: t.attrs})
	a := map[string]string{attrTopic: r.Topic}
	hop := trace.HopStored
	if t.delayed {
		hop = trace.HopDelayed
		a["due"] = t.due.UTC().Format(time.RFC3339Nano)
		a["delay_s"] = strconv.FormatInt(int64(t.delay/time.Second), 10)
	}
	if r.Queue >= 0 { // a delayed message's queue is known only when it is delivered
		a["queue"] = strconv.Itoa(r.Queue)
		a["offset"] = strconv.FormatInt(r.QueueOffset, 10)
	}
	if t.key != "" {
		a["key"] = t.key
	}
	rec.Record(trace.Event{ID: r.ID, Hop: hop, At: r.StoredAt, Attrs: a})
}

// traceAck records the ack hop of a traced publish, acknowledged once the
// core stored it as id (the engine writes the ack next, in order).
func (h *Hook) traceAck(cl *engine.Client, m *engine.Message, id core.MessageID) {
	if m.QoS == 0 || m.Will {
		return // nothing acknowledges QoS 0, nor a will
	}
	a := map[string]string{attrQoS: qosLabel[m.QoS&3], "code": "0x00"}
	if m.PacketID != 0 {
		a[attrPacketID] = strconv.Itoa(int(m.PacketID))
	}
	h.opts.Trace.Record(trace.Event{ID: id, Hop: trace.HopPuback, Actor: cl.ID(), Attrs: a})
}

// downTrace says how a downlink message is traced: under id, as a message
// of core topic topic. The zero value: it is not.
type downTrace struct {
	id    core.MessageID
	topic string
}

// A traced downlink message carries its downTrace in its engine Ref, so the
// trace follows it through the session's queue, the session store and a
// restart: the message ID (32 hex digits) is followed by
// "~" + the ID it is traced under + "~" + its core topic. Core topic names
// hold neither '~' nor '/'; an untraced message's origin is as before.
const refSep = "~"

// ref is what a packet's origin says of message id.
func (t downTrace) ref(id string) string {
	if t.id.IsZero() {
		return id
	}
	return id + refSep + t.id.String() + refSep + t.topic
}

// splitRef undoes ref.
func splitRef(ref string) (id string, t downTrace) {
	id, rest, ok := strings.Cut(ref, refSep)
	if !ok {
		return ref, t
	}
	tid, topic, _ := strings.Cut(rest, refSep)
	if x, err := core.ParseMessageID(tid); err == nil {
		t = downTrace{id: x, topic: topic}
	}
	return id, t
}

// downTraceOf is how the downlink message m, consumed from core topic
// topic, is traced.
func (h *Hook) downTraceOf(topic string, m *core.StoredMessage) downTrace {
	if !h.opts.Trace.Enabled(topic) {
		return downTrace{}
	}
	return downTrace{id: trace.IDOf(m), topic: topic}
}

// traced reports whether hops of t are recorded now.
func (h *Hook) traced(t downTrace) bool { return !t.id.IsZero() && h.opts.Trace.Enabled(t.topic) }

// Ways a downlink message reaches a device (the deliver hop).
const (
	downWritten = iota // written to the connection
	downQueued         // queued for an offline or parked session
	downHeld           // held for a client this node does not know yet
)

// traceDeliver records the deliver hop of a downlink message for client,
// which happened at at (zero: now).
func (h *Hook) traceDeliver(t downTrace, client, mqttTopic string, qos byte, pid uint16, dup bool, how int, at time.Time) {
	if !h.traced(t) {
		return
	}
	a := make(map[string]string, 6)
	if mqttTopic != "" {
		a[attrMQTTTopic] = mqttTopic
	}
	a[attrQoS] = qosLabel[qos&3]
	switch how {
	case downWritten:
		if pid != 0 {
			a[attrPacketID] = strconv.Itoa(int(pid))
		}
		if dup {
			a["dup"] = "true"
		}
	case downHeld:
		a["held"] = "true"
		a["queued"] = "true"
	default:
		a["queued"] = "true"
	}
	a["node"] = h.opts.Node
	h.opts.Trace.Record(trace.Event{ID: t.id, Hop: trace.HopDownlink, At: at, Actor: client, Attrs: a})
}

// traceDeviceAck records a device's acknowledgement (PUBACK or PUBCOMP) of
// a downlink message.
func (h *Hook) traceDeviceAck(t downTrace, client, mqttTopic string, qos byte, pid uint16) {
	if !h.traced(t) {
		return
	}
	a := map[string]string{attrQoS: qosLabel[qos&3]}
	if pid != 0 {
		a[attrPacketID] = strconv.Itoa(int(pid))
	}
	if mqttTopic != "" {
		a[attrMQTTTopic] = mqttTopic
	}
	h.opts.Trace.Record(trace.Event{ID: t.id, Hop: trace.HopDeviceAck, Actor: client, Attrs: a})
}

// traceReceipt records that receipt r was produced.
func (h *Hook) traceReceipt(t downTrace, r *Receipt) {
	if !h.traced(t) {
		return
	}
	a := map[string]string{"outcome": r.Outcome, attrTopic: h.opts.ReceiptsTopic}
	if r.Topic != "" {
		a[attrMQTTTopic] = r.Topic
	}
	if r.Reason != "" {
		a["reason"] = r.Reason
	}
	h.opts.Trace.Record(trace.Event{ID: t.id, Hop: trace.HopReceipt, At: r.Time, Actor: r.ClientID, Attrs: a})
}
