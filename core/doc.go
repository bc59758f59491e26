// Package core holds the public vocabulary of ferrymq's durable queue: the
// Message a producer sends, the StoredMessage a consumer receives, the
// MessageID that names a stored message, and the Broker interface that every
// engine implements (the embedded commit-log engine in core/store today, a NATS
// JetStream engine later).
//
// Everything outside core depends on these types and on Broker, never on an
// engine directly. Package core imports nothing else of ferrymq's.
//
// The model is RocketMQ's: a topic is split into queues; a message with a
// sharding key goes to queue QueueFor(key, n), so one device's messages stay
// in order; a message without one is spread round-robin. Within a queue every
// message has a queue offset, dense and increasing from 0.
//
// All types here are plain values and safe to share once built; a Broker is
// safe for concurrent use.
package core
