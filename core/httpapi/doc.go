// Package httpapi is ferrymq's HTTP produce and consume API, for backends
// that do not speak the wire protocol (core/wire): anything with an HTTP
// client can store messages in a topic and consume them POP-style.
//
//	POST /api/v1/topics/{topic}/messages    produce one message or a batch
//	GET  /api/v1/topics/{topic}/messages    pop: ?group=&max=&wait=&invisible=&orderly=&tags=
//	POST /api/v1/topics/{topic}/ack         acknowledge receipt handles
//	POST /api/v1/topics/{topic}/invisible   change a handle's invisible time
//
// New returns an http.Handler for everything under /api/v1/; the caller
// listens (ferrymq serve --http). docs/http-api.md is the reference for
// clients, with examples and the error table.
//
// # Produce
//
// A body with Content-Type application/json is one message object or an
// array of them (one Broker.ProduceBatch: all stored or, on error, none
// acknowledged); any other body is itself the message body, described by
// X-Ferrymq-Key, X-Ferrymq-Tag, X-Ferrymq-Keys, X-Ferrymq-Deliver-At and
// X-Ferrymq-Prop-<name> headers. A 201 means what a returned Produce means:
// the message is durable under the engine's flush policy. Any other answer,
// or none, means it may or may not be stored (at-least-once: retry, and let
// consumers deduplicate on the message ID). Only user topics are accepted
// (core.ValidateTopic); system topics ('%…') belong to the engine. With
// Options.Trace, a stored message of a traced topic gets a "produce" hop
// (actor "http", the remote address) and a "stored" — or, delayed,
// "delayed" — hop under its ID.
//
// # Consume
//
// A GET is pop.Service.Pop for one group: the messages come with receipt
// handles and stay hidden from the group's other poppers for the invisible
// time; ack them before it passes, or they come back (attempt + 1) through
// the group's retry topic. The delivery guarantees are pop's
// (at-least-once; handles die with a restart). A GET with ?wait= long-polls
// up to Options.MaxWait and ends early when the client goes away. HEAD is
// refused: it would hand out messages nobody receives.
//
// # Errors
//
// Every failure is a JSON object {"error": one line, "code": a stable
// snake_case name} (the Code* constants) with a matching status; errors of
// core, pop and retry are mapped by errors.Is. Bad input never panics and
// never costs more than Options.MaxBodyBytes of reading and Options.MaxBatch
// messages of decoding. Each failed request is logged as one line (debug for
// the client's mistakes, error for the server's) that never carries a
// message body, a header value or a handle.
//
// # Concurrency and crashes
//
// The handler is safe for concurrent use, starts no goroutines and keeps no
// state: what a crash does is what it does to the broker and the POP service.
package httpapi
