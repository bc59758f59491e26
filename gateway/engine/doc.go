// Package engine is ferrymq's MQTT server: MQTT 3.1, 3.1.1 and 5 over TCP
// (TLS, WebSocket, PROXY protocol) for very many mostly idle devices.
//
// # Connections
//
// Sockets live on the gateway's event loop (gateway/eventloop:
// edge-triggered epoll whose pollers wait on Go's netpoller, not in a
// blocking epoll_wait). An idle connection holds no goroutine and no
// buffer: its state is a few hundred bytes of structs. When a socket
// becomes readable the poller reads it into the connection's inbox at once
// and schedules a turn of the connection on the
// engine's work pool, a bounded set of goroutines shared by every
// connection. A turn decodes what arrived (PROXY header, TLS, WebSocket,
// then MQTT framing; packets are decoded with mochi-mqtt's packets codec),
// handles each packet — the hooks run there — and writes what it queued in
// one write. Only one turn of a connection runs at a time, so a
// connection's packets are handled in order without a lock; other
// goroutines reach a connection only through its write buffer (under its
// lock) and by scheduling a turn.
//
// Writes are queued per connection and bounded (Options.MaxPendingWrites
// packets and MaxPendingBytes not yet taken by the socket; allocated only
// while something waits): a QoS 0 message that finds the queue full is
// dropped for that subscriber; QoS 1/2 messages wait in the
// session within its inflight window. Deliveries to a connection coalesce:
// everything queued before its next turn goes out in one write.
//
// Keepalives (1.5 × the keepalive [MQTT-3.1.2-24]), the connect timeout,
// the write timeout, credential expiry, pacing waits, lingering closes,
// session expiry and delayed wills share one timing wheel advanced by one
// goroutine.
//
// # Hooks
//
// Everything the gateway adds to MQTT — authentication, topic ACLs,
// quotas, persistent sessions, the uplink into the core with its ack
// decision, presence events, delivery receipts, routing between nodes — is
// a small typed interface in Hooks (hooks.go, store.go). No hook sees a
// malformed packet: the engine enforces the rules of MQTT 3.1.1 §4.8 and
// MQTT 5 §4.13 and every "MUST close" of the packet sections itself, tagged
// [MQTT-x.y.z-n] where the specs number them (docs/conformance.md lists
// them with their tests).
//
// # Sessions
//
// Every session — online or offline — is the engine's: subscriptions in
// the trie (gateway/topictree), outbound QoS 1/2 messages in an inflight
// window bounded by the client's Receive Maximum and a queue behind it,
// inbound QoS 2 packet IDs until PUBREL, the will. A SessionStore persists
// the sessions that outlive their connection, written through as they
// change; an offline session's queued messages are kept there, not in
// memory (stubs), and reloaded when it resumes. An inbound QoS 2 publish is
// taken under a QoS2ID that is written to the store before the Uplink sees
// the publish; after a restart, the resend of one taken and not answered
// goes to the Uplink marked unsure (Message.QoS2Unsure), to be looked for
// where the Uplink stored it (exactly once: docs/commands.md).
//
// # Concurrency
//
// An Engine is safe for concurrent use. New binds the listeners; Start
// starts the event loop, an accept goroutine per listener and the wheel;
// Shutdown stops accepting, ends every connection (MQTT 5: DISCONNECT
// 0x8B, wills published), waits for the work they started, and stops the
// rest: it returns after every goroutine the engine started has ended.
//
// Lock order: Engine.mu (the session map), session.mu, the subscription
// trie's lock, conn.upMu, conn.wmu (write buffer); conn.mu (scheduling and
// the inbox) is a leaf. Hooks are called with no engine lock held, except
// SessionStore's write-through methods and Router's Subscribed and
// Unsubscribed, and RouterPresence's Online (under the session's lock:
// they must not call back).
package engine
