// Package delay gives any core.Broker delayed (scheduled) delivery: a
// message produced with a DeliverAt up to 40 days ahead is stored durably at
// once and appears in its topic at that time, not before. A pending message
// can be cancelled by the ID its producer got.
//
// # Model: levels of doubling holds
//
// Service.Broker wraps the broker. A message with a future DeliverAt for a
// user topic is not stored in its topic but, as a copy, in the system topic
// DelayTopic, in the queue of one level. Level l ≥ 1 holds a copy for
// Tick·2^(l−1) (1 s, 2 s, 4 s … up to MaxHold, 2^16 s by default); level 0
// holds one for the last fraction of a tick. A copy goes to the largest
// level whose hold fits in the time left, so the hold of every copy in a
// level is the same and copies leave a level in the order they entered: a
// level is a FIFO queue whose head is always the next to come out, and one
// goroutine per level waits for its head. When a copy comes out, the time
// left is less than the hold it served: the message is copied into the next
// smaller fitting level, or, once due, stored in its topic. A delay of d
// ticks is thus copied about popcount(d) times (at most log2 d), plus once
// per MaxHold for delays beyond it — the write amplification that buys
// timers that cost no memory: nothing is kept in RAM per pending message
// (only each level's read batch), so a million pending timers cost what the
// store's files cost on disk. RocketMQ's timer store re-puts long delays in
// the same way ("rolling"); here every hop is.
//
// A copy keeps the body, tag, keys, born time and properties, and carries
// PropTopic, PropDue, PropShardingKey and (after the first) PropID — the ID
// the producer got — which later copies are also indexed by, so Lookup and
// Cancel find the newest copy after the first aged out. The delivered
// message has its own sharding key (so it lands in the queue a direct
// produce would pick), DeliverAt set to its due time and PropID.
//
// # Guarantees
//
//   - Never early: a message is stored in its topic at or after its due time
//     by the service's Clock. It may be late by up to a tick (head-of-line in
//     level 0) plus the time a batch takes to store.
//   - Durable: the first copy is stored under the broker's flush policy
//     before the produce returns; every later copy is stored before the
//     level commits past the one it replaces (as DelayGroup). A crash
//     between the two replays that hop: the message may then be delivered
//     twice (at-least-once; consumers dedupe by PropID). Messages that came
//     due while no Service ran are delivered as soon as one starts.
//   - Order: messages of one queue are delivered in due order when their due
//     times are more than a tick (plus storing time) apart; within that,
//     order is not kept (levels run independently).
//   - Retention: a copy must outlive its hold, so keep MaxHold well below
//     the store's retention (72 h by default vs 18 h). A copy removed by
//     retention before it moved on is reported and lost.
//   - Cancel: Cancel fsyncs the ID to a small cancel log before it returns;
//     every later copy of a cancelled message is dropped. A message being
//     delivered, or already due, cannot be cancelled (ErrAlreadyDue).
//     Cancellations are kept in memory until CancelKeep after their due
//     time.
//
// Run one Service per broker: two would both move every copy.
//
// # Concurrency
//
// A Service and its Broker are safe for concurrent use. Start starts one
// goroutine per level; Close cancels them and returns once they have ended.
package delay
