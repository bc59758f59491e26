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
package session
