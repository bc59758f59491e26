// Package retry gives consumer groups RocketMQ's redelivery with back-off
// and dead-lettering on top of any core.Broker.
//
// A message a group failed to consume is handed to SendBack. Its attempt
// number is its reconsume count plus one. Up to MaxAttempts (default 16) it
// is stored in the system topic %SCHEDULE%, in the queue of its schedule
// level (attempt-1, the last level repeating), with a deliver-at time of
// now (by Options.Clock, the wall clock by default) plus that level's delay
// (default 10s 30s 1m 2m … 10m 20m 30m 1h 2h). One scheduler goroutine per
// level waits for the head of its queue to fall due and produces it to the
// group's retry topic %RETRY%<group>, with the reconsume count set to the
// attempt. Past MaxAttempts the message goes to the group's dead-letter
// topic %DLQ%<group> instead, where it can be read like any topic; Redrive
// sends dead letters back to their original topic with the reconsume count
// reset to 0.
//
// Every stored copy keeps the body, tag, keys, sharding key, born time and
// properties, and carries retry.origin_topic and retry.origin_id naming the
// first original (kept across repeated retries and redrives) and
// retry.reason. The retry and dead-letter topics are created with one queue,
// as in RocketMQ; one that already exists with more queues is used as it is.
// %SCHEDULE% has exactly one queue per schedule level; New refuses a broker
// where it exists with another count (the schedule's length changed).
//
// # Guarantees
//
// Delivery is at-least-once. A message is never redelivered before its
// deliver-at time; it may be late by the time a scheduler needs to produce
// it, and a message whose time passed while no Service ran (a restart) is
// delivered as soon as its level's scheduler starts. Within a level messages
// are delivered in the order they were sent back; across levels there is no
// order. Each scheduler commits its progress (as the internal group
// %SCHEDULER%) after producing, so a crash between the produce and the
// commit, or the loss of the broker's last uncheckpointed commits, delivers
// those messages a second time. Redrive likewise commits after producing
// (as %REDRIVE%), so a crash there redrives a message twice. A SendBack that
// returns an error may still have stored the message.
//
// Scheduled messages live in the broker, so they survive restarts; nothing
// is kept in memory. Run one Service per broker: two would both deliver
// every scheduled message.
//
// # Tracing
//
// With Options.Trace, a traced message (trace.TopicOf: its original topic)
// gets, under the ID of its first original (trace.IDOf), a "retry" hop when
// SendBack schedules it — attrs group, attempt (the delivery that failed,
// its reconsume count plus one), reason (at most MaxReasonLen bytes),
// next_at and outcome — and a "dead-letter" hop when it is dead-lettered,
// by SendBack or DeadLetter — attrs group, attempt, reason and dlq. Both are
// recorded only once the copy is stored, and never block.
//
// # Concurrency
//
// A Service is safe for concurrent use. Start starts the schedulers; Close
// cancels them and returns once they have ended.
package retry
