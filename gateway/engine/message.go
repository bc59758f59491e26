package engine

import "time"

// Message is an application message on its way through the engine. Once
// published it is shared by every subscriber it goes to and never changed:
// who needs another topic, QoS or retain flag gets a copy.
type Message struct {
	Topic   string
	Payload []byte
	QoS     byte
	Retain  bool
	// Origin is the client ID of the publisher ("" for the server's own),
	// for no-local subscriptions [MQTT-3.8.3-3].
	Origin string
	// Will marks a will, published for its client.
	Will bool
	// PacketID is the publisher's packet ID of a QoS 1/2 PUBLISH as the
	// engine received it (for the Uplink hook's records); 0 otherwise.
	PacketID uint16
	// QoS2ID names an inbound QoS 2 publish once and for all: the engine
	// stores it in the session with the packet ID before the Uplink sees
	// the publish (SessionStore.SaveInbound), and the Uplink stores it with
	// the message (the bridge: core property mqtt.qos2_id), so that a
	// resend after a crash is recognised (QoS2Unsure). 0 for other
	// messages.
	QoS2ID uint64
	// QoS2Unsure marks a client's resend of QoS 2 publish QoS2ID that an
	// earlier process took and did not answer before it ended: it may be
	// stored already. The Uplink must look for QoS2ID before it stores the
	// message again (docs/commands.md, "QoS 2: exactly once into the
	// core").
	QoS2Unsure bool
	// Ref is the publisher's own reference (a core message ID, say): kept
	// with every queued copy and handed back to the Delivery hook.
	Ref string
	// Created is when the engine received it, unix nanoseconds.
	Created int64
	// Expiry is when it expires, unix seconds; 0 never. It is the MQTT 5
	// message expiry interval made absolute [MQTT-3.3.2-5]; a subscriber
	// is sent what is left of it [MQTT-3.3.2-6].
	Expiry int64
	// Props are the MQTT 5 properties passed through to subscribers; nil
	// when there are none (most messages), to keep a message small.
	Props *Props

	// stub: the payload and properties were dropped from memory (an
	// offline session's message held by the store; SessionStore.LoadMessages).
	stub bool
	size int // the payload's size, kept by a stub
}

// Stub reports whether m is a stub: an offline session's message whose
// payload stays in the session store.
func (m *Message) Stub() bool { return m.stub }

// stubOf returns m without payload and properties.
func stubOf(m *Message) *Message {
	if m.stub {
		return m
	}
	return &Message{Topic: m.Topic, QoS: m.QoS, Retain: m.Retain, Origin: m.Origin, Ref: m.Ref, Created: m.Created,
		Expiry: m.Expiry, stub: true, size: len(m.Payload)}
}

func (m *Message) payloadSize() int {
	if m.stub {
		return m.size
	}
	return len(m.Payload)
}

// Props are the MQTT 5 PUBLISH properties the engine passes through
// unchanged [MQTT-3.3.2-4] [MQTT-3.3.2-15] [MQTT-3.3.2-16]
// [MQTT-3.3.2-17] [MQTT-3.3.2-20].
type Props struct {
	PayloadFormat    byte
	PayloadFormatSet bool
	ContentType      string
	ResponseTopic    string
	CorrelationData  []byte
	User             []UserProperty
}

// UserProperty is an MQTT 5 user property (a name/value pair, repeatable).
type UserProperty struct {
	Key, Value string
}

// expired reports whether m's expiry has passed at now (unix seconds).
func (m *Message) expired(now int64) bool { return m.Expiry != 0 && now >= m.Expiry }

// withFlags returns m with another QoS and retain flag: m itself when they
// are the same, else a shallow copy.
func (m *Message) withFlags(qos byte, retain bool) *Message {
	if m.QoS == qos && m.Retain == retain {
		return m
	}
	c := *m
	c.QoS, c.Retain = qos, retain
	return &c
}

func nowUnix() int64 { return time.Now().Unix() }
