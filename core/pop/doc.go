// Package pop implements RocketMQ's POP consumption on top of any
// core.Broker: the broker, not the client, decides which messages a consumer
// gets, so there is no client-side rebalance and a consumer that hangs
// cannot strand a queue.
//
// Pop(group, topic, max, invisible) hands out up to max messages, walking
// the topic's queues from a rotating start and also the group's retry topic
// (retry.RetryTopic), so messages redelivered after a failure come back to
// poppers. Together they are at most Request.MaxBytes (4 MiB, as a core
// read) of stored size, except that the first comes whatever its size: an
// answer of several 4 MiB messages fits a wire frame, and a message that
// could not be answered is never handed out. Each message comes with a receipt handle and stays invisible to
// other poppers of the group for the invisible time (default 60 s, at least
// 10 s, at most 12 h). Ack(handle) marks it consumed; ChangeInvisibleTime
// moves its deadline and replaces the handle. A message not acknowledged in
// time counts as a failed attempt: it is sent back through retry.Service,
// reappears on the retry topic after the back-off with its attempt number
// one higher, and after the retry service's MaxAttempts it goes to the
// group's dead-letter topic.
//
// With Request.Orderly a queue with a message in flight is locked for the
// group: Pop skips it, and a message whose invisible time ran out is handed
// out again in place (same queue position, Attempt one higher) until it is
// acknowledged or, after MaxAttempts redeliveries, dead-lettered, after
// which the queue moves on. Orderly pops do not read the retry topic. Mixing
// orderly and other pops of one group on one topic is supported only in the
// sense that neither hands out a queue the other holds.
//
// # Progress and memory
//
// Per (group, topic, queue) the Service keeps, in memory, a cursor (the next
// offset to hand out) and the messages in flight (offset, deadline, attempt,
// handle generation; no payloads). The group's committed offset
// (core.Broker.CommitOffset) is the watermark: every offset below it is
// done. Acks may come in any order; the watermark advances over the acked
// prefix. A queue's in-flight span — from the watermark to the cursor — is
// bounded by Options.MaxInflight (default 2048); a queue at the bound hands
// out nothing until its oldest message is acknowledged or expires, so
// memory stays bounded whatever consumers do. Messages filtered out by
// Request.Tags count as done for the group.
//
// # Guarantees
//
// Delivery is at-least-once. Within one Service a message is handed out to
// one popper at a time: again only after its handle expired (via the retry
// topic, or in place when orderly). Duplicates appear when a consumer acks
// too late (its work is done but the message comes back), and after a
// restart or crash: in-flight state lives only in memory, so a new Service
// starts each queue at the committed watermark and hands out again every
// message at or above it, acknowledged or not; the broker may also lose its
// last second of commits. Receipt handles carry an HMAC-SHA256 tag keyed by
// a secret each Service draws at random, so handles cannot be forged, and
// those from before a restart are refused (ErrInvalidHandle). Without
// Orderly there is no ordering between messages; with it, messages of one
// queue are handed out in queue order, each only after every earlier one is
// done.
//
// Groups need no registration: a group Pop has not seen starts at the
// oldest message of each queue. The retry topic belongs to the group, not to
// a topic, so a group that pops several topics gets the retries of all of
// them from each (as in RocketMQ, where a group has one subscription): give
// each topic its own group to keep them apart. Run one Service per broker:
// two would hand out the same messages.
//
// # Tracing
//
// With Options.Trace, a traced message (trace.TopicOf: its original topic)
// gets a "delivered" hop (mode "pop") each time Pop hands it out and an
// "acked" hop when it is acknowledged, under the ID of its first original
// (trace.IDOf). The ID is kept in the message's in-flight entry (16 bytes,
// bounded like the entries by MaxInflight). An expired message's "retry" or
// "dead-letter" hop is the retry service's.
//
// # Concurrency
//
// A Service is safe for concurrent use. Start starts the reviver, the one
// goroutine that handles expired messages, sleeping on a timer set to the
// earliest deadline (without Start nothing ever expires); Close stops it and
// returns once it has ended. The reviver sends expired messages back one at
// a time, so a mass expiry drains at the broker's produce rate. Long polls
// wait on core.Broker.Arrivals, never by polling.
package pop
