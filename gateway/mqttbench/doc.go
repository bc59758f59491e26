// Package mqttbench is the MQTT load generator behind `ferrymq bench mqtt`:
// it measures any MQTT broker (ferrymq's gateway, Mosquitto, nats-server,
// mochi) over loopback, the same way for each, so that one run can compare
// them side by side.
//
// Run does one of three things (Options.Mode):
//
//   - pubsub: P publishers send timestamped messages at QoS 0, 1 or 2 with
//     MQTT 3.1.1 (eclipse/paho.mqtt.golang) or 5 (eclipse/paho.golang),
//     as fast as Inflight allows or at a paced Rate; S subscribers to one
//     filter, and optionally a consumer of a ferrymq core topic the gateway
//     bridges to, receive them. It counts sent, acknowledged, received
//     (distinct per receiver), duplicates, foreign payloads and loss, and
//     measures publish → acknowledgement and publish → receipt latency.
//   - connect: a storm of lean MQTT 3.1.1 connections (a hand-encoded
//     CONNECT, a 4-byte CONNACK; no client library, no goroutine per
//     connection) over TCP, TLS or WebSocket, with a username and password
//     if given, measuring CONNECT → CONNACK latency and connections per
//     second; then they are closed, or held for Hold. With Subscribe each
//     connection subscribes once and waits for its SUBACK.
//   - idle: the same connections held open (with a PINGREQ every
//     KeepAlive/2 written by one goroutine) until Hold passes or ctx ends,
//     printing HoldingLine once all are up so that a script can measure
//     the broker's memory meanwhile.
//
// # Payload
//
// Every payload starts with a 16-byte header, big-endian, then filler up
// to the payload size:
//
//	offset  width  field
//	0       1      magic 0xB7 (also the version: 1)
//	1       3      publisher index, uint24
//	4       4      sequence number within the publisher, uint32, from 0
//	8       8      send time, unix nanoseconds, int64 (> 0)
//	16      …      filler, ignored
//
// A receiver counts a payload as foreign, never as received, when it does
// not decode (too short, wrong magic, time ≤ 0) or does not belong to the
// run: a publisher index beyond the run's publishers, a sequence number
// that publisher has not used yet, or a send time before the run started
// or more than a second after its receipt. Senders and receivers share
// one process, hence one clock. These constants are part of the format.
//
// # Counting
//
// Expected per receiver is Acked at QoS 1 and 2 (a message the broker
// acknowledged must arrive) and Sent at QoS 0; Lost is what of that did
// not arrive within Drain of the last acknowledgement, or before 3 s went
// by without any message arriving (a drain cut short while messages still
// arrive is reported among the errors). Each receiver keeps
// a bitset per publisher, so duplicates are exact whatever the order of
// arrival. Latency from publish to receipt is measured from the moment the
// message is handed to the client library, not from a paced schedule.
//
// Run is safe to call concurrently (runs share nothing). It owns every
// goroutine and connection it starts and returns only after all have
// ended. It keeps no state on disk; a crash leaves only the broker's
// sessions (none with clean sessions, the default).
package mqttbench
