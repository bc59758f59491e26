// Package client is the Go client of ferrymq's core for backend services:
// a Client is one pipelined, self-reconnecting connection to a core server
// (core/server) speaking the wire protocol (core/wire); on it sit a
// Producer (sync, async with callback, one-way, batch; retries on retryable
// errors), push consumers (clustering or broadcast, concurrent or orderly
// listeners — the same runtime as in-process consumers, core/consumer), a
// SimpleConsumer (POP: receive, ack, change invisible time) and the admin
// calls (topics, groups, lag, reset, get by ID, find by key).
//
// Errors from the server are *wire.Error values that unwrap to the core's
// sentinel errors, so errors.Is(err, core.ErrTopicNotFound) works as it does
// in process. A request whose connection broke fails with ErrConnLost: it
// may or may not have taken effect (at-least-once).
//
// A Client and everything built on it are safe for concurrent use. Dial
// starts a connection manager and two goroutines per connection; Close
// ends them all and returns after they have ended.
package client
