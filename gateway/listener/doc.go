// Package listener holds the network listeners the MQTT gateway hands to its
// mochi-mqtt server: TCP (plain or TLS) and websockets (plain or TLS). Each
// implements mochi's listeners.Listener; LoadTLS builds the TLS config,
// mutual TLS included, from PEM files.
//
// # Goroutines and memory
//
// An idle MQTT connection should cost little more than its socket and
// buffers, so each connection runs on one goroutine with a small stack:
//
//   - Plain TCP: the accept loop starts one goroutine per connection, which
//     calls mochi's establish and lives as long as the client.
//   - TLS: the accept loop starts a short-lived goroutine that runs the
//     handshake under Config.HandshakeTimeout. Only once it succeeds does
//     that goroutine start a fresh one to call establish, and then return.
//     The handshake's crypto grows a goroutine's stack, and Go shrinks a
//     stack only at garbage collection, by halves, and only while three
//     quarters of it are unused, so a connection served on the handshake
//     goroutine keeps most of that growth for its whole life. The fresh
//     goroutine starts small. (Measured with the ECDSA P-256 test
//     certificates and a connection blocked in Read: about 4 KiB of stack
//     per idle TLS connection, against 7 KiB on the handshake goroutine,
//     unchanged after several collections.) A failed or timed-out
//     handshake closes the connection, counts in Stats.HandshakeFailures
//     and is logged at debug.
//   - Websockets: net/http's goroutine for the connection reads the upgrade
//     request (after the TLS handshake, for wss) and then calls establish
//     itself, so a websocket connection keeps the stack the HTTP request and
//     handshake grew. The write buffer is pooled and held only while a
//     message is written.
//
// Mochi runs Serve on a goroutine of its own; Serve returns when the
// listener is closed.
//
// # Close
//
// Close stops accepting, calls mochi's closeClients once (which sends
// DISCONNECT to clients that completed CONNECT; after 5 s the listener stops
// waiting for it), then closes every connection still open: those that never
// sent CONNECT, those mid-handshake, those mid-upgrade. It returns only when
// every goroutine the listener tracks has returned: the Serve loop, every
// connection's goroutine, every HTTP handler. Close is idempotent, safe
// before Init or Serve, and a Serve called after it returns at once.
//
// All methods are safe for concurrent use.
package listener
