// Package group coordinates consumer groups on the broker side, the way
// RocketMQ users expect: members register and heartbeat; in clustering mode
// each topic's queues are spread over the live members that subscribe to it
// (a deterministic average allocation) and every queue is consumed by one
// member at a time, guarded by a lease; in broadcast mode every member
// consumes every queue with its own progress.
//
// The Coordinator is driven by plain method calls (Heartbeat, Pull, Commit,
// Release, Leave, ResetOffsets, Lag), so an in-process consumer and a remote
// one over the wire protocol use it alike. It keeps membership and leases in
// memory; committed offsets live in the engine (core.Broker) and survive
// restarts. After a restart members simply heartbeat again.
//
// # Guarantees
//
//   - A queue lease moves to a new member only after the old holder released
//     it or its lease expired (it missed heartbeats for HeartbeatTimeout), so
//     no queue is consumed by two members of a clustering group at once.
//     Commits from a member that does not hold the lease are refused, so a
//     stalled member that wakes up cannot move offsets.
//   - Delivery is at-least-once: a member that dies before committing leaves
//     its queue's committed offset behind, and the next holder starts there.
//     Those messages are delivered again: that, and a crash of the engine
//     before it persisted a commit (at most its checkpoint interval), are the
//     places duplicates come from.
//   - Order: within a queue, Pull returns messages in offset order.
//
// # Tracing
//
// With Options.Trace, Pull records a "delivered" hop for each traced
// message it returns and remembers it (offset and traced ID, in memory, at
// most 4,096 per queue and offset group, the oldest forgotten first) until
// a Commit passes it, which records its "committed" hop. ResetOffsets, a
// broadcast member leaving and a group expiring drop what is remembered;
// those messages get no committed hop. Recording never blocks a pull or a
// commit.
//
// A Coordinator is safe for concurrent use. Start runs one goroutine that
// expires silent members; Close stops it and waits.
package group
