// Package server serves the core wire protocol (core/wire) over TCP: it
// is how backend services produce, consume and administer the core queue.
//
// Each connection has a fixed goroutine budget that does not grow with the
// requests in flight: a reader, a writer and a small pool of handlers.
// Produces are appended from the reader itself, in arrival order (so
// pipelined sends keep per-key order), and answered when the engine calls
// back; long polls (pull, group pull, pop with a wait) are parked by topic,
// and one goroutine per topic being waited on retries them when messages of
// that topic arrive, so they hold no goroutine of their own. Requests in flight per connection are bounded: when a client
// has MaxInflight unanswered requests, the server stops reading from it, so
// a client that floods is slowed, and one that never reads its responses is
// disconnected after WriteTimeout — memory per connection stays bounded.
// Responses are batched into few write calls.
//
// A client must open with OpHello within HandshakeTimeout; a connection
// silent for three keepalive intervals is closed. Malformed frames, unknown
// ops, oversized frames and bad tokens get an error frame (and, where the
// stream cannot be trusted any more, a closed connection); nothing a client
// sends can panic the server or affect other connections.
//
// With Options.Trace, a produce of a traced topic records, once stored, the
// "produce" hop (the client ID of the connection's OpHello, its remote
// address) and the "stored" or "delayed" hop of each traced message; the
// consuming hops are recorded by the group, retry and POP services.
//
// Shutdown stops accepting, answers requests still arriving with
// CodeShuttingDown and parked long polls with their empty result, waits for
// in-flight requests (bounded by its context) and closes every connection;
// it returns after every goroutine has ended.
package server
