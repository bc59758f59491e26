// Package txn gives producers RocketMQ's two-phase transactional messages on
// top of any core.Broker.
//
// A producer first sends a half message (SendHalf): a copy of its message,
// stored in the system topic HalfTopic and invisible to consumers of its
// real topic. It then runs its local transaction and ends the half with its
// outcome (End): Commit delivers the message to its real topic, Rollback
// discards it. A producer that crashed or lost its connection before ending
// is asked: a half still unresolved FirstCheck (default 6 s) after it was
// stored is checked back — handed to a Checker registered for its producer
// group, which pushes it to one of the group's producers (round-robin), who
// answers with End (fromCheck set): Commit, Rollback, or Unknown to be asked
// again. Checks repeat every CheckInterval (default 30 s); when the check
// after the MaxChecks-th (default 15) falls due without an answer the half
// is discarded — never delivered — and an error line is logged. While no
// producer of the group is registered a due half waits without its check
// being counted, however long that takes, and is checked as soon as one
// registers.
//
// # Stored records
//
// HalfTopic has one queue. It holds the half messages and op records,
// empty messages whose PropOp says what happened to the half named by
// PropHalfID: OpCommit, OpRollback, OpDiscard (resolutions, which also carry
// the half's ID as an index key, so FindByKey finds a half's outcome), and
// OpCheck, written after each check-back with the count so far in
// PropChecks. A half message keeps the producer's sharding key, tag, keys,
// body, properties, born and deliver-at times, and adds PropGroup,
// PropTopic and PropShardingKey. Property names starting with "txn." are
// reserved. A committed message is the half restored — real topic and
// sharding key, "txn." properties dropped — plus PropHalfID. A message with
// a deliver-at time keeps it: the broker delays it from the commit on.
//
// # Guarantees
//
// A committed transaction's message is delivered at least once; a rolled
// back or discarded one never. Commit produces the real message and the
// commit record in one ProduceBatch, the message first, and only then
// answers. If the broker keeps the message but loses the commit record (a
// crash inside the batch, or the loss of its last unflushed records), or a
// commit reports an error after storing the message, the half is still
// pending after a restart and is checked back: a producer that answers
// Commit again delivers the message twice. This window is deliberate: the
// other order could lose the message. The duplicate carries the same
// PropHalfID, by which consumers can drop it. An End that fails leaves the
// half pending; a SendHalf that fails may still have stored the half (check
// it back with Rollback).
//
// # Restarts
//
// Nothing is lost at a restart: pending halves, their check counts and all
// outcomes are in HalfTopic. The Service keeps in memory a small record per
// pending half (no body) and the outcomes of the last 10,000 resolved ones.
// TxnGroup's committed offset on HalfTopic is kept at the oldest pending
// half, so Start reads only from there to the end of the queue: a half
// message makes a pending half due FirstCheck after its store time; a check
// record restores its count and makes it due CheckInterval after the check;
// a resolution forgets it. A half that waited through the restart is
// checked at once. Because one half unresolved for long holds the offset
// back, recovery reads at most everything since the oldest pending half.
// Run one Service per broker: two would both check every half, and each
// would move TxnGroup's offset past the other's halves.
//
// # Concurrency
//
// A Service is safe for concurrent use. Start runs recovery and then starts
// one checker goroutine, which sleeps until the next check is due (at most
// PollInterval) and wakes early for a new half or a new Checker; Close stops
// it and returns once it has ended. SendHalf and End work between Start and
// Close. Concurrent Ends of one half, and an End racing the checker's
// discard, resolve it once: while one writes its outcome the others get
// ErrResolved (should the writer then fail, the half stays pending). Checker calls are
// made from the checker goroutine without any lock held, so a Checker may
// call End.
package txn
