// Package session persists the MQTT engine's sessions: a
// gateway/engine.SessionStore over a local append-only log (Open) or over
// a NATS JetStream key-value bucket shared by several gateway nodes
// (OpenKV, which is also an engine.SessionClaimer).
//
// The engine owns every session in memory — subscriptions, the messages on
// their way, inbound QoS 2 IDs, wills, expiry, delayed wills — and writes
// each change of a persistent session (MQTT 3 clean session 0, MQTT 5
// session expiry > 0) through to the store, once, in order, under that
// session's lock. The store keeps in memory only where each live record
// is (an index, never a value), and reads values back at Load (the
// engine's Start) and LoadMessages (an offline session resuming: the
// engine keeps only stubs of its messages). Sessions that end with their
// connection are never written. Safe for concurrent use; the write-through
// methods cost a log append or a queued bucket write, never a disk sync or
// a network round trip.
//
// # What is kept
//
// Per persistent session: the client record (username, protocol, session
// expiry, the will with its delay and expiry), when its connection ended,
// its subscriptions with their options, every outbound QoS 1/2 message
// not yet acknowledged (in flight or queued, in order, with its
// properties, absolute expiry, Ref, origin, subscription identifiers, and
// whether its PUBREC came), and the inbound QoS 2 packet IDs awaiting
// PUBREL: taken (with the QoS2ID the engine took the publish under,
// written before the publish reaches the Uplink) or answered PUBREC. Plus
// every retained message.
//
// # Crashes (the log)
//
// Every change is written to the file at once: a process crash loses
// nothing written. The file is fsynced every Options.SyncInterval (200
// ms): a power loss loses at most that. Each record carries a CRC-32C
// seeded with the log's random nonce; at Open a record that fails its
// checks is skipped with a log line (that record is lost: a subscription,
// a message, an offline time; a client record loses its session unless a
// later one follows) and the reader resyncs at the next valid record; a
// torn last record is cut off and writing resumes where it began. A
// session connected when the process ended loads with no offline time (its
// will is due at the next start, after its delay) and is written offline
// from that start, so a second restart neither publishes the will again
// nor counts its expiry from an earlier start. A failed write or fsync is
// sticky: the store stops writing (ErrLogFailed, Stats.Failed, the
// metric ferrymq_sessions_log_failed) rather than leave a hole. The log
// is compacted — its live records copied, in order, into a new file
// renamed over it — once it is larger than Options.CompactBytes and more
// than half dead; writes go on meanwhile, and a crash at any point leaves
// one whole log.
//
// # The log's format
//
// dir/sessions.log is a header, then records. All integers are big-endian.
//
//	header (20 bytes)
//	offset  size  field
//	0       4     magic "FMQS"
//	4       1     version 1
//	5       3     reserved, zero
//	8       8     nonce: random at creation, kept by compaction
//	16      4     CRC-32C (Castagnoli) of bytes 0 … 15
//
//	record
//	offset  size  field
//	0       1     magic 0xF7
//	1       1     version 1
//	2       4     body length n (5 … 257 MiB)
//	6       4     CRC-32C of the nonce (8 bytes), bytes 1 … 5, and the body
//	10      n     body:
//	                0     1   op: 1 put, 2 delete
//	                1     2   key length k (2 … 65535)
//	                3     k   key (key.go)
//	                3+k   …   value (put only; a delete has none)
//
// Decoders check magic, then version, then length bounds (a record running
// past the end of the file is torn, ErrTorn; one out of bounds or failing
// its CRC is corrupt, ErrCorrupt), then the body, and never slice before
// checking a length. The newest record of a key wins; a delete of a
// session's client key deletes the whole session. Replay order carries
// meaning (index.go): a session's records count after its client record,
// its offline time after its latest client record, a PUBREC marker after
// its message.
//
// # Keys and values
//
//	key                                value
//	'c' | u16 n | client ID            client record
//	'd' | u16 n | client ID            offline since
//	's' | u16 n | client ID | filter   subscription
//	'm' | u16 n | client ID | u16 pid  outbound message
//	'p' | u16 n | client ID | u16 pid  marker: PUBREC received
//	'q' | u16 n | client ID | u16 pid  inbound QoS 2 ID awaiting PUBREL
//	'r' | topic                        retained message
//
// Every value starts with the value format version (1). A string or
// binary field is a u16 length and its bytes; a payload a u32 length (at
// most 256 MiB) and its bytes.
//
//	client record      version | flags (bit 0 will, bit 1 new session) | protocol (3, 4, 5) |
//	                   session expiry u32 s | username | [will delay u32 s | will expiry u32 s | message body]
//	subscription       version | options (MQTT 5 layout: bits 0-1 QoS, 2 no local, 3 retain as
//	                   published, 4-5 retain handling) | identifier u32 (0: none) | filter
//	outbound message   version | u16 k | k × subscription identifier u32 | message body
//	retained message   version | message body (payload not empty)
//	offline since      version | unix nanoseconds u64
//	marker             version
//	inbound QoS 2      version | [QoS2ID u64, not 0: taken, its PUBREC not sent yet];
//	                   the version alone: answered PUBREC
//	message body       flags (bits 0-1 QoS, 2 retain, 3 properties follow) | created u64 unix ns |
//	                   expiry u64 unix s (0: never) | topic | origin | ref | payload |
//	                   [property flags (bit 0 payload format set) | payload format |
//	                    content type | response topic | correlation data |
//	                    u16 k | k × (key, value) user properties]
//
// Reserved flag bits must be zero, QoS at most 2, retain handling at most
// 2, identifiers at most 268,435,455; a value with a byte left over is
// malformed (ErrBadValue); another version is ErrVersion. A client record
// with the new-session flag (the first of a session) drops whatever the
// log or bucket still holds of that client ID from before, so a lost
// delete does not bring an old session back. These constants are part of
// the format.
//
// # The bucket (OpenKV)
//
// The same keys and values, as the bucket's keys o.<client> (owner
// record), c.<client>, d.<client>, s.<client>.<filter>, m.<client>.<pid>,
// p.<client>.<pid>, q.<client>.<pid>, r.<topic> (kvcodec.go: each part
// one token). One node at a time serves a session: the one whose claim
// wrote the current revision of its owner record (owner.go). The engine
// claims at CONNECT (Claim); another node's claim makes this node forget
// the session (Engine.Forget: its connection here gets DISCONNECT 0x8E and
// no will); every write of a session is fenced by the owner revision held,
// so the stream refuses a stale node's writes; at start (Load) a node
// takes back the sessions it owned; AdoptGone takes over those of nodes
// that are gone. Writes are queued and made by a few workers, one at a
// time per session, in order (kvwriter.go); a failed one is counted and
// logged, not retried. Retained messages are shared: every node watches
// them and applies each change to its engine, the newest revision winning.
// When JetStream is unreachable, writes fail at once (counted as
// "unavailable") and the clients are served from the engine's memory.
package session
