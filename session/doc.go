// Package session keeps persistent MQTT sessions across gateway restarts
// and crashes, as a mochi-mqtt hook (Store).
//
// What is kept, for sessions that outlive their connection (MQTT 3 clean
// session 0, MQTT 5 session expiry > 0): the client record with its will
// and session expiry, when it went offline, its subscriptions, every
// outbound QoS 1/2 message not yet acknowledged — including messages
// queued while the client is offline, with their absolute expiry — and the
// inbound QoS 2 packet IDs awaiting PUBREL; plus all retained messages.
// Sessions that end with their connection are never written.
//
// An offline session is parked (park.go): taken out of mochi, its queue on
// disk and only offsets in memory; it is rebuilt as a mochi client when
// the client connects again. At start every stored session is parked,
// except those with a pending will, which mochi gets back (StoredClients)
// for the gateway to publish the will after its delay.
//
// Storage is one append-only log (dir/sessions.log, format in log.go and
// codec.go): every change is written at once (a process crash loses
// nothing written) and fsynced every Options.SyncInterval (a power loss
// loses at most that). Each record has a CRC-32C; a damaged record is
// skipped with a log line and the rest loads; a torn tail is cut. The log
// is compacted when more than half of it is dead.
//
// The same Store can instead keep its records in a NATS JetStream
// key-value bucket (OpenKV; kv.go, kvcodec.go for the keys and the owner
// record, owner.go for ownership), so that several stateless gateway nodes
// share the sessions: a device may reconnect to any node and resume its
// session there. The Store's logic — parking, routing to parked sessions,
// expiry, rebuilding a session in mochi — is the same over both backends
// (the backend interface in store.go). On a bucket, every change is
// written at once and acknowledged by JetStream (with the bucket's
// replicas) before the store goes on; one node at a time owns a session
// (the owner record o.<client>, claimed with a revision-checked write when
// its client connects), every write of a session is fenced by the owner
// revision the node holds, and a node that sees another claim a session it
// serves drops it without writing and disconnects its client (DISCONNECT
// 0x8E, no will). Retained messages are shared: every node watches them
// and applies them to its mochi server. When JetStream is unreachable,
// writes fail with a logged, counted error and the clients are served on
// from memory.
package session
