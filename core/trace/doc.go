// Package trace records the path of a message through ferrymq — the device's
// MQTT publish, where it was stored, each consumer group's delivery, retries,
// acknowledgements, dead-lettering, and for a command the delivery to the
// device and its receipt — as hops in the system topic Topic, and reads them
// back as one ordered timeline.
//
// # Recording
//
// A Recorder is enabled for all topics or a list of them. Instrumented code
// asks Enabled(topic) — one atomic load when tracing is off — and hands an
// Event to Record, which never blocks: events go to a bounded queue that one
// goroutine writes to Topic in batches (ProduceAsync, no durability wait).
// When the queue is full the event is dropped and counted; tracing never
// slows or fails the data path. Methods on a nil *Recorder do nothing, so
// packages hold one unconditionally.
//
// # Storage
//
// Each hop is one message of Topic (4 queues), its sharding key and index
// key the traced message's ID, its body the JSON of the Event. Trace records
// are kept as long as the store keeps anything (its retention). A retried
// message is traced under the ID of its first original (retry.origin_id),
// a delayed one under the ID its producer got (delay.id), so one lookup
// finds the whole path.
//
// # Concurrency
//
// A Recorder is safe for concurrent use; Close flushes what is queued and
// returns once its goroutine has ended.
package trace
