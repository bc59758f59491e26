// Package admin is ferrymq's admin HTTP API: JSON endpoints under /api/v1/
// for operators and dashboards, beside core/httpapi's produce and consume
// endpoints (no path of one is a path of the other).
//
//	GET    /api/v1/node                                 version, uptime, node, redacted config
//	GET    /api/v1/topics                               topics with their queue ranges (max, cursor, system)
//	POST   /api/v1/topics                               create a topic {name, queues}
//	GET    /api/v1/topics/{topic}                       one topic
//	DELETE /api/v1/topics/{topic}                       501 not_supported: the store cannot delete a topic
//	GET    /api/v1/groups                               groups with live members (max, cursor)
//	GET    /api/v1/groups/{group}                       members and lag per queue
//	POST   /api/v1/groups/{group}/reset                 move offsets {topic, to: earliest|latest|time}
//	GET    /api/v1/groups/{group}/dead-letters          the group's dead letters (max, cursor)
//	POST   /api/v1/groups/{group}/dead-letters/redrive  move dead letters back {max}
//	GET    /api/v1/clients                              connected MQTT clients (max, cursor)
//	GET    /api/v1/clients/{id}                         one client, or its stored session
//	DELETE /api/v1/clients/{id}                         disconnect a client
//	DELETE /api/v1/sessions/{id}                        a parked session and its queue; 409 session_held while connected
//	GET    /api/v1/retained                             retained MQTT messages (max, cursor, system)
//	GET    /api/v1/retained/{topic...}                  one retained message
//	DELETE /api/v1/retained/{topic...}                  clear a retained message
//	POST   /api/v1/devices/{id}/rpc                     a synchronous call to a device {payload | payload_base64, timeout_ms}
//	GET    /api/v1/devices/{id}/shadow                  a device shadow; 404 shadow_not_found
//	PATCH  /api/v1/devices/{id}/shadow                  merge {state: {desired}, version}; 409 version_conflict, 413 shadow_too_large
//	DELETE /api/v1/devices/{id}/shadow                  delete it (?version=N); 409 version_conflict
//
// docs/http-api.md ("Admin API") has examples, docs/openapi.yaml the
// shapes.
//
// # Authorization
//
// The caller mounts the handler (Patterns) behind the same token check as
// the rest of /api/, so reads need what every API call needs. Writes —
// every POST, PATCH and DELETE — additionally need Options.AllowWrites, or a
// request that Options.Authorize accepts (BearerAuthorizer checks the
// bearer token); otherwise they answer 401 unauthorized (Authorize set) or
// 403 writes_disabled (the API is read-only). The check runs before the
// body is read. Nothing the API answers or logs holds a secret: no tokens,
// no passwords, no will payloads; Options.Config must come redacted.
//
// # Errors and limits
//
// Every answer is JSON; every failure {"error": one line, "code": a stable
// snake_case name} (the Code* constants, shared with core/httpapi where
// they mean the same). Bodies are decoded strictly (unknown or repeated
// fields are 400 bad_json) and bounded by Options.MaxBodyBytes; unknown or
// repeated query parameters are 400 bad_request. Listings take max (cut to
// Options.MaxPage) and cursor (the previous page's "next"). A listing of
// clients or retained messages sorts the engine's whole table per request.
//
// # Concurrency and crashes
//
// The handler is safe for concurrent use and starts no goroutines; it keeps
// nothing of its own: clients, sessions and retained messages are the
// engine's. What a crash does is what it does to the store, the
// group coordinator, the retry service and the gateway.
package admin
