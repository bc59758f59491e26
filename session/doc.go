// Package session keeps persistent MQTT sessions across gateway restarts
// and crashes, as a mochi-mqtt storage hook (Store).
//
// What is kept, for sessions that outlive their connection (MQTT 3 clean
// session 0, MQTT 5 session expiry > 0): the client record with its will
// and session expiry, its subscriptions, and every outbound QoS 1/2
// message not yet acknowledged — including messages queued while the
// client is offline — plus all retained messages. At start mochi loads
// them back: offline sessions are present again, expire on schedule, and a
// reconnecting client gets its unacknowledged messages again (DUP).
// Sessions that end with their connection are never written.
//
// Storage is one append-only log (dir/sessions.log, format in log.go):
// every change is written at once (a process crash loses nothing written)
// and fsynced every Options.SyncInterval (a power loss loses at most that).
// Each record has a CRC-32C; a damaged record is skipped with a log line
// and the rest loads; a torn tail is cut. The log is compacted when more
// than half of it is dead. Only keys and offsets stay in memory.
//
// Not kept (see docs/gateway.md): a will's pending delay (a will waiting out
// its delay at a crash is not sent), the expiry time of queued messages
// (their MQTT 5 Message Expiry Interval is kept), inbound QoS 2 packet IDs.
package session
