package engine

import (
	"context"
	"crypto/tls"
	"time"
)

// The engine's hooks: one small interface per concern. Every one is
// optional; a nil hook means the default the doc names. Hooks are called on
// the engine's work pool, one connection's calls in the order of its
// packets; a hook that blocks holds one worker (the pool has many), never
// a poller. No hook is ever handed a malformed packet: the engine refuses
// those itself.
type Hooks struct {
	// Auth decides every CONNECT. Nil: every client is let in with the
	// username it sent.
	Auth Authenticator
	// ACL decides what each client may publish, subscribe to and read.
	// Nil: everything.
	ACL Authorizer
	// Limits admits sockets and paces clients. Nil: no limits.
	Limits Limiter
	// Sessions persists the sessions that outlive their connection. Nil:
	// they live in memory until they expire or the process ends.
	Sessions SessionStore
	// Uplink sees every PUBLISH and decides when it is acknowledged. Nil:
	// every publish is delivered to subscribers and acknowledged at once.
	Uplink Uplink
	// Presence hears connections come and go. Nil: nobody.
	Presence Presence
	// Delivery hears what became of messages published with a Ref. Nil:
	// nobody.
	Delivery Delivery
	// Router carries publishes between nodes. Nil: one node.
	Router Router
}

// ConnectInfo is what a CONNECT says, and where it came from.
type ConnectInfo struct {
	ClientID string
	// Assigned is set when the client sent an empty client ID and the
	// engine made one up.
	Assigned bool
	Username string
	Password []byte
	// Protocol is 3 (MQTT 3.1), 4 (3.1.1) or 5.
	Protocol  byte
	Clean     bool
	Keepalive uint16
	// SessionExpiry is the MQTT 5 session expiry interval asked for (MQTT
	// 3: 0 for a clean session, the engine's maximum otherwise).
	SessionExpiry uint32
	Listener      string
	// Remote is the client's address: the PROXY protocol header's source
	// when the listener takes one, else the socket's peer.
	Remote string
	// TLS is the connection's TLS state (client certificates with mTLS);
	// nil on plain TCP and WebSocket.
	TLS *tls.ConnectionState
	// Will is the will the client asked for, nil if none.
	Will *Message
	// User are the CONNECT's MQTT 5 user properties.
	User []UserProperty
}

// Identity is what authentication decided a client is.
type Identity struct {
	// Username is the client's username from now on: what ACL templates
	// and session ownership use (for HMAC or mTLS it need not be the
	// CONNECT's).
	Username string
	// State is the hook's own per-connection state, kept in the Client
	// (Client.AuthState) so that no hook needs a map of its own.
	State any
	// Expires, if set, disconnects the client when it passes (a JWT's exp).
	Expires time.Time
}

// Authenticator decides a CONNECT.
type Authenticator interface {
	// Authenticate returns the client's identity, or an error: a *Refusal
	// says which CONNACK code the client gets, anything else is "bad user
	// name or password" (0x86; 4 on MQTT 3). It may block.
	Authenticate(ctx context.Context, c *ConnectInfo) (Identity, error)
}

// Authorizer decides topics. It is called for every publish, every
// subscription filter, and every delivery, so it should be fast.
type Authorizer interface {
	// CanPublish reports whether c may publish to topic (wills too).
	CanPublish(c *Client, topic string) bool
	// CanSubscribe reports whether c may subscribe to filter (plain, or
	// the filter of a "$share/…" subscription, which is passed whole).
	CanSubscribe(c *Client, filter string) bool
	// CanRead reports whether the session of clientID, owned by username,
	// may receive a message on topic; c is its connection, or nil while
	// the session is offline.
	CanRead(c *Client, clientID, username, topic string) bool
}

// Limiter admits sockets and paces clients.
type Limiter interface {
	// Admit decides a new socket before a byte is read from it (after the
	// PROXY header, on listeners that take one); release is called once
	// when it closes.
	Admit(remote string) (release func(), err error)
	// AllowPublish decides c's publish of size payload bytes to topic:
	// Success, or
	//   - MessageRateTooHigh with wait > 0: MQTT 5 gets 0x96; an MQTT 3
	//     client cannot be told, so the engine stops reading from it for
	//     wait (its own TCP backpressure) and drops the publish, or ends the
	//     connection when disconnect is set (out of patience);
	//   - any other code (TopicNameInvalid for a topic past the limits): the
	//     publish is refused as the ACL refuses.
	AllowPublish(c *Client, topic string, size int) (code ReasonCode, wait time.Duration, disconnect bool)
	// AllowSubscription decides one more subscription of c (holding held)
	// to filter: Success, or the SUBACK code (QuotaExceeded,
	// TopicFilterInvalid).
	AllowSubscription(c *Client, filter string, held int) ReasonCode
}

// Refusal refuses a CONNECT with a reason code.
type Refusal struct {
	Code   ReasonCode
	Reason string
}

func (r *Refusal) Error() string { return "refused: " + r.Code.String() + ": " + r.Reason }

// Decision is what Uplink.Publish decided.
type Decision uint8

const (
	// Deliver: deliver the message to subscribers now and acknowledge it.
	Deliver Decision = iota
	// Defer: the hook took the message; it calls done exactly once, and
	// only then does the engine acknowledge it and (on success) deliver
	// it. Acknowledgements are written in the order the client sent the
	// publishes [MQTT-4.6.0-2].
	Defer
	// Consume: the hook took the message and nobody else gets it; it is
	// acknowledged now (a delayed publish, say, delivered later).
	Consume
	// Refuse: acknowledge with Result.Code (MQTT 5) or disconnect (MQTT
	// 3, QoS 1/2); the message goes nowhere.
	Refuse
)

// Result ends a deferred publish.
type Result struct {
	// Code is 0 for success or a reason code ≥ 0x80 for the PUBACK/PUBREC
	// (MQTT 5); an MQTT 3 client gets no ack and is disconnected.
	Code   ReasonCode
	Reason string
	// Disconnect, with a code, ends the connection instead (a message the
	// core cannot take: DISCONNECT 0x95).
	Disconnect ReasonCode
	// Hold: acknowledged, but not delivered to subscribers (the hook will
	// publish it later).
	Hold bool
	// Findable: the hook stored a QoS 2 publish with its QoS2ID where it
	// looks for unsure resends (Message.QoS2Unsure). The session store
	// then keeps the publish as taken rather than recording its PUBREC —
	// one write less per publish; a resend after a restart is looked for
	// and answered.
	Findable bool
}

// Uplink decides each PUBLISH a client sends, after the engine validated
// it, resolved its topic alias and checked the ACL — and each will, as a
// publish of its client when it is due.
type Uplink interface {
	// Publish decides m (m.Origin is c's client ID). done must be called
	// exactly once if, and only if, the decision is Defer (for QoS 0 that
	// means "deliver when done is called"; for a will, "deliver unless the
	// Result refuses"). For Refuse, the returned Result says the code. m
	// belongs to the engine: the hook must not change it.
	Publish(c *Client, m *Message, done func(Result)) (Decision, Result)
}

// Presence hears connections.
type Presence interface {
	// Connected is called once a connection is accepted, before its
	// CONNACK is written (so what the hook records comes before anything
	// the client does after it); replaced is the connection of the same
	// client ID it took over, or nil.
	Connected(c *Client, sessionPresent bool, replaced *Client)
	// Disconnected is called once per Connected, when the connection has
	// ended; takenOver says a new connection of the same client ID
	// replaced it (cause is nil then).
	Disconnected(c *Client, reason string, cause error, takenOver bool)
}

// Delivery hears what became of messages that carry a Ref. Its calls may
// come from any goroutine, never under an engine lock.
type Delivery interface {
	// Sent: a PUBLISH of the message was written for clientID at at, with
	// packet ID pid (0 for QoS 0); dup: a resend. It runs on the pool, so
	// the client's acknowledgement (Delivered) may be heard first: at, not
	// the order of the calls, says when the PUBLISH left.
	Sent(clientID string, m *Message, pid uint16, dup bool, at time.Time)
	// Delivered: clientID acknowledged the message (PUBACK, PUBCOMP of
	// pid), or for QoS 0 it was written.
	Delivered(clientID string, m *Message, pid uint16)
	// Discarded: the message will never reach clientID; expired says its
	// time ran out — its own expiry (reason empty) or its session's
	// ("the session expired") — reason says why otherwise. m may be a
	// stub (no payload) for a message of an offline session held by the
	// store.
	Discarded(clientID string, m *Message, expired bool, reason string)
}

// DurableDelivery is a Delivery whose record of a discard must be durable
// before the message leaves an offline session (a receipt in the core):
// for messages that expire while their session is offline, and for the
// messages of a session that expires, the engine calls DiscardedDurably
// and keeps the message (and the session) until it returns nil, trying
// again at the next sweep.
type DurableDelivery interface {
	Delivery
	DiscardedDurably(ctx context.Context, clientID string, m *Message, expired bool, reason string) error
}

// Router carries publishes between nodes and tells them what this node's
// sessions want.
type Router interface {
	// Routed is called for every message published on this node, after
	// local delivery; served names the shared groups ("group/filter", as
	// in the "$share/group/filter" subscription) a member of which on this
	// node took the message, so that no other node's member does. Messages
	// the router injected (Engine.PublishRouted) are not passed back.
	Routed(m *Message, served []string)
	// Subscribed and Unsubscribed track the filters of the sessions on
	// this node (online and offline), one call per session and filter.
	// They are called under the session's lock: they must not block or
	// call into the engine.
	Subscribed(clientID, filter string)
	Unsubscribed(clientID, filter string)
}

// RouterPresence is a Router that also hears its sessions get a connection
// and lose it (a takeover is no change): shared subscriptions are served by
// connected members only [MQTT-4.8.2-2], so a router keeps a group's
// interest on this node only while a member is connected here. Online is
// called under the session's lock, in order with Subscribed and
// Unsubscribed: it must not block or call into the engine.
type RouterPresence interface {
	Router
	Online(clientID string, online bool)
}
