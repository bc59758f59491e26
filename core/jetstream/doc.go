// Package jetstream is core.Broker on NATS JetStream: ferrymq's queue kept
// in the streams and key-value buckets of a NATS cluster, so that several
// `ferrymq serve` nodes share one queue (docs/engines.md). Open connects and
// prepares the engine's bucket and index stream; the services above the
// queue (groups, retry, POP, delay, transactions) run unchanged on it, on
// the node that holds the core lease (Elect).
//
// # Mapping
//
// A topic T with N queues is one file-storage stream FMQ_<tok(T)>; queue q
// is the literal subject fmq.<tok(T)>.<q> (names.go has the encoding). A
// sharding key picks its queue with core.QueueFor, as on the embedded
// engine. A message ID is kind 2, a 56-bit hash of the topic and the
// stream sequence (IDKindJetStream). Committed offsets, deleted-topic
// fences and resize locks (r.<tok(T)>) live in the bucket Options.Bucket
// (default ferrymq_core), index keys in the stream FMQ__KEYS, arrival
// notices on core-NATS subjects fmqa.<tok(T)> (not stored), leases in
// ferrymq_leases and delayed-message cancellations in
// ferrymq_delay_cancels.
//
// A resized topic (ResizeTopic, resize.go) has epochs, one per queue
// count, kept in its stream's metadata ("ferrymq.epochs", epochs.go has
// the format). Epoch 0 keeps the subjects above; in epoch e ≥ 1 queue q is
// fmq.<tok(T)>.<q>.<e>, and the stream takes only the current epoch's
// subjects (fmq.<tok(T)>.*.<e>) and its marker subject fmqe.<tok(T)>.<e>:
// a node that publishes with the queue count of an ended epoch is refused
// by the stream, not by the nodes' good will, learns the new count from
// the metadata and publishes again, in order. An epoch's Begin[q] is the
// sequence of queue q's last message before it (the queue's next offset).
// A queue is read epoch by epoch, each on its literal subject, up to that
// boundary; the queues a shrink retired stay readable until retention
// takes their messages. Engines that know a topic was resized listen to
// its ended epochs' subjects (fence.go) to answer stale publishes at once.
//
// # Guarantees
//
//   - Durable once acknowledged: Produce and ProduceBatch return, and
//     ProduceAsync's done runs, only after JetStream acknowledged every
//     message: the stream stored it, on a majority of its Options.Replicas.
//     Whether stored means fsynced is the servers' sync_interval, not this
//     package's: with the default (2 min), a power loss of a majority of
//     the servers within it can lose acknowledged messages; run them with
//     sync_interval: always, as our configs and tests do. A produce that
//     failed may still have been stored, and none is deduplicated (no
//     Nats-Msg-Id is sent), so a retry can store a message twice:
//     at-least-once.
//   - Order per queue: a queue is read in stream-sequence order, the order
//     its stream's leader stored the messages. One engine publishes on one
//     connection in call order, so its produces to one queue (one key) are
//     stored in call order while publishes succeed; when one fails (a
//     leader election) and a later one already in flight succeeds, the
//     caller's retry of the failed one lands after it. A publish a
//     resize's fence refused is not a failure: the engine publishes it
//     again with the new count — and the later ones refused too, in call
//     order — before anything it publishes afterwards. Produces of
//     different engines (nodes) have no order between them.
//   - Epochs are exact: every message of a queue below an epoch's Begin was
//     routed with an older count, every one at or above it with that
//     epoch's (or a later one's), however many nodes produce with whatever
//     count they cached (resize.go says how, and names the one race of the
//     server that could store an old-count message late, logged if seen).
//   - Offsets are stream sequences: a message's queue offset is its stream
//     sequence − 1 and its ID carries the sequence. They increase within a
//     queue but are dense only for a one-queue topic: a topic's queues
//     share its stream's sequence, so every queue reports the stream's
//     range and Backlog counts one queue's messages. They are never
//     reused: a deleted topic leaves a fence, and its successor's stream
//     starts after the last sequence (FirstSeq).
//   - Retention is the stream's: messages older than Options.MaxAge (72 h)
//     go, and the oldest go first past Options.MaxBytes; a read below what
//     is left is clamped (core.ReadResult.Clamped).
//
// What differs from the embedded engine (core/store; docs/engines.md,
// "Guarantees compared"): durability comes from replicas and the server's
// sync_interval, not an fsync per group commit; ProduceBatch is not one
// unit (each message is stored on its own, and on error some may be);
// offsets are sparse across a topic's queues; a read right after an
// acknowledgement may be answered by a replica that has not got the message
// yet (long-pollers are woken twice, at once and 20 ms later);
// SendResult.StoredAt is this process's clock at the acknowledgement and
// store times never decrease per topic, not across topics; the key index is
// written after the acknowledgement, read-your-writes on this node only,
// and an entry lost in a crash is not rebuilt; a message is at most
// Options.MaxMessageBytes (core.DefaultMaxMessageBytes, as the embedded
// engine's) and never more than the server's max_payload, whose default
// (1 MB) the servers must raise (8MB) to carry a 4 MiB body; a deleted
// topic's stream is gone at once.
//
// # Crash
//
// The engine keeps nothing on local disk. When the process dies, what was
// acknowledged is in the streams; a produce in flight may or may not be
// stored (its caller got no answer); index entries of messages
// acknowledged just before are lost (those messages are still read,
// consumed and found by ID, not by key); arrival notices are not stored
// (consumers fall back on polling). What a crash of the servers loses is
// the sync_interval above. A resize is two stream updates: a node that
// dies between them leaves an intent (the old subjects already refused,
// the new epoch not yet recorded); producers of the topic wait, and once
// its resize lock expired (3 × Options.Timeout) the first of them to find
// it finishes it — no message is stored under either count meanwhile, and
// the history is the one a whole resize writes.
//
// # Record format
//
// A message is stored as the payload of one JetStream message, without
// NATS headers (the stream adds the sequence, subject and time). Integers
// are big-endian; these widths and the version are part of the format:
//
//	offset  width  field
//	0       1      format version: 1
//	1       8      born at: signed unix nanoseconds; 0 = unset
//	9       4      reconsume count: at most 2^20 (decoding refuses more)
//	13      4      message count: 1
//	17      …      the message as wire.AppendMessage writes it: topic,
//	               sharding key, tag, keys, properties, deliver-at, body
//
// From offset 13 on, a record is a core/wire produce request of one message
// (wire.EncodeProduce): one encoding, one fuzzed decoder.
//
// A record has no magic and no checksum of its own; what protects it:
//
//   - The stream's file store keeps a 64-bit HighwayHash per stored message
//     over its sequence, time, subject, headers and payload, written when
//     the server stores it. The server checks it the first time it reads a
//     message back from disk and when it rebuilds a block after a crash. A
//     message that fails it is not handed out: a direct get answers "not
//     found", or ends its batch before it, so Read returns the messages
//     before it and nothing from it, and Get reports it not found — ferrymq
//     sees a message missing, not a corrupt one; a rebuild drops it and the
//     rest of its block, logged as lost. That is nats-server's behaviour
//     (2.15, server/filestore.go and stream.go), not ours, and no ferrymq
//     test damages a stream's files. The engine creates only file-storage
//     streams; memory storage would have no hash.
//   - The subject names the format, so a magic number would repeat it: only
//     the engine publishes on fmq.>, and Read checks that the subject is a
//     queue of one of the topic's epochs and the decoded topic is the
//     stream's (core.ErrCorrupt). Epoch markers (fmqe.>) are empty and
//     never read as messages. decodeRecord checks the version first, then every
//     length before slicing, refuses trailing bytes and more or fewer than
//     one message, and never panics (FuzzDecodeRecord, seeds in
//     testdata/fuzz); a refused record is a *core.CorruptError wrapping
//     ErrBadRecord.
//
// Not covered: bytes damaged before a server hashed them — in this
// process, or on the way to the server or between servers (routes), where
// NATS's protocol has no checksum and only TCP's guards a link without TLS
// (set Options.TLS, and TLS on the routes, on a network you do not trust);
// and a change inside a body or property that leaves the structure valid,
// which decodes as another message.
//
// # Concurrency
//
// An Engine is safe for concurrent use. Open starts its goroutines (the
// checker of first answers, which publishes again what a resize's fence
// refused; the acknowledgement waiter; the index writer; the arrivals
// listener; the fence); Close takes no new produce, waits for those in
// flight to be answered, stops them and closes the connection if it
// dialled it. It is idempotent.
package jetstream
