// Package node assembles a ferrymq node: one place builds the queue engine
// (the embedded commit-log store, a NATS JetStream cluster, or a remote
// core server), the core services over it (delayed delivery, transactions,
// consumer groups, retry, POP and the core TCP port), device shadows
// (core/shadow, gateway/shadowmqtt), the trace recorder, the MQTT gateway with its bridge, auth, session store and router between
// nodes, and the HTTP server (HTTP API, admin API, dashboard, /metrics,
// /stats, /healthz, /readyz). `ferrymq serve`, package gatewaytest and the
// binary's tests all run nodes built here.
//
// New builds and starts a node from Options, a plain struct of what the
// caller chose (serve turns its flags and config file into one); when New
// returns, every listener is bound and reports its address (Addr,
// CoreAddr, HTTPAddr), so ":0" is fine. A failed New stops what it had
// started.
//
// Shutdown stops the parts in an order that loses nothing: the MQTT
// gateway first (wills and in-flight publishes still reach the core), the
// router between nodes, a remote core's client (after the trace recorder
// that writes over it), the HTTP server, the
// NATS leases (the core services stop with the core lease), the session
// store (after the gateway and the core: both write to it), the core
// services, device shadows (after every surface that changes them), the
// trace recorder (after everything that records), the
// engine and last the auth providers. It returns once every goroutine the
// node started has ended.
//
// A Node's accessors may be called from any goroutine while it runs, not
// once Shutdown has begun; Shutdown is called from one goroutine. What a crash
// does is up to the engine (core/store/doc.go), the session store
// (package session) and device shadows (core/shadow/doc.go): the node keeps no state of its own besides a
// generated token in DataDir/TokenFile.
package node
