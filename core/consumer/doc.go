// Package consumer is the consuming side of a consumer group: a
// PushConsumer pulls the queues the group coordinator assigns to it, hands
// each message to a listener, retries what fails, and commits progress.
// It talks to the coordinator through the Coordinator interface, which
// *group.Coordinator implements in-process and the wire-protocol client
// implements remotely, so the same runtime serves both.
//
// # Semantics
//
//   - At-least-once. An offset is committed only after every message below it
//     was handled (succeeded, or handed to the retry path). A consumer that
//     dies before committing, or an engine that crashes before persisting a
//     commit, causes redelivery of the uncommitted messages: those are the
//     duplicates to expect; listeners should be idempotent (messages carry
//     unique IDs).
//   - Concurrent listeners (clustering): a failed or timed-out message is sent
//     back to the group's retry path and redelivered after the backoff of its
//     attempt; after the last attempt it lands in the group's dead-letter
//     topic. The reconsume count travels with the message.
//   - Orderly listeners: per queue one message at a time, in offset order; a
//     failed message is retried in place after SuspendTime before anything
//     later in its queue is delivered; after MaxReconsume attempts it is
//     dead-lettered and the queue moves on.
//   - Broadcast: every member receives every message with its own committed
//     progress; a failed message is retried in place up to MaxReconsume times,
//     then dropped with an error log (as RocketMQ's broadcast mode does not
//     retry through the broker).
//
// A PushConsumer is safe for concurrent use. Start runs a heartbeat goroutine
// and one goroutine per assigned queue plus at most ConsumeGoroutines listener
// goroutines; Close stops pulling, waits for running listeners (bounded by its
// context), commits and leaves the group, and returns after every goroutine
// has ended.
package consumer
