// Package bridge maps MQTT traffic onto the core, as the MQTT engine's
// Uplink, Presence and Delivery hooks (gateway/engine).
//
// Uplink: every MQTT PUBLISH is matched against the uplink rules (first
// match wins; with no configuration, every non-'$' topic's first level
// names the core topic and the client ID is the sharding key) and becomes
// a core message with the MQTT metadata as mqtt.* properties. QoS 0 is
// appended without waiting. QoS 1 and 2 are deferred (engine.Defer): the
// engine writes the PUBACK/PUBREC only when the core reports the message durable
// under its flush policy, in the order the client sent the publishes, and
// only then is the message delivered to MQTT subscribers. Many publishes of
// one client are in flight at once (up to Options.MaxInflight) so they
// share the core's group commit. A publish the core refuses is answered
// with an MQTT 5 reason code, or, for MQTT 3, by closing the connection
// without an ack — never acknowledged and dropped. A QoS 2 publish carries
// the engine's QoS2ID as mqtt.qos2_id; the resend of one an earlier process
// took and did not answer is looked for in the core by it and stored only
// if absent: exactly once across crashes (qos2.go, docs/commands.md).
//
// Presence: connect, disconnect and session takeover become JSON events on
// the events topic (default "device-events"), keyed by client ID, with a
// sequence number that grows across restarts.
//
// Tracing: with Options.Trace, messages whose core topic the Recorder
// traces record their MQTT hops — a device's publish (under the ID the core
// gave it): mqtt.publish, stored (or delayed) and, for QoS 1/2, mqtt.ack
// once the PUBACK/PUBREC is written; a command (under trace.IDOf):
// mqtt.deliver when written to a device or queued for it, mqtt.device-ack
// and receipt. A traced command carries its trace in its engine Ref
// (trace.go), so the trace survives an offline session and a restart.
// Recording never blocks; an untraced topic costs one atomic load.
//
// The Hook is safe for concurrent use by the engine's goroutines.
// Drain waits for everything handed to the core; call it after the
// listeners closed and before closing the core. docs/gateway.md has the
// full contract, the event format and the metrics.
package bridge
