// Package cluster routes MQTT publishes between the gateway nodes of a
// NATS cluster (`ferrymq serve --engine nats`), as one mochi hook: a device
// on one node subscribes, a device on another publishes, and the message
// arrives, as within one broker. NATS interest is the route table: each
// node subscribes, on its own NATS connection, to the subjects of its
// sessions' filters, and publishes every local MQTT publish on its topic's
// subject; NATS hands it to the nodes that want it and to no other.
//
// # Subjects
//
// A topic name maps to prefix (default "fmqmqtt") plus one token per
// level. A level of [A-Za-z0-9_-]+ is its own token; any other level —
// empty, with '.', '*', '>', spaces, '$', '~', any UTF-8 — is '~' and the
// level's bytes in unpadded base64url. The mapping is injective, every
// subject is a valid literal NATS subject, and Topic maps it back
// (FuzzSubject, FuzzTopic). A filter maps to the same tokens with '+' as
// '*' and a last '#' as '>'; "a/#" also matches "a", so it is two
// subscriptions, prefix.a and prefix.a.> (FilterSubjects; FuzzFilter
// checks a filter matches exactly what its subjects match, with the NATS
// server's own matcher). Topics starting with '$' ($SYS, $ferrymq/,
// $delayed/) are never routed.
//
//	"cars/c1/cmd"     → fmqmqtt.cars.c1.cmd
//	"a.b/ /x"         → fmqmqtt.~YS5i.~IA.x
//	"a//b"            → fmqmqtt.a.~.b
//	"cars/+/cmd"      → fmqmqtt.cars.*.cmd
//	"jobs/#"          → fmqmqtt.jobs, fmqmqtt.jobs.>
//
// # Messages between nodes
//
// One NATS message per MQTT publish: the subject above, the MQTT payload
// as its data, and these headers (their names and encodings are the format
// between nodes; a node drops, and counts, a message whose Fmq-V it does
// not know). Strings are URL query-escaped.
//
//	Fmq-V                 "1"
//	Fmq-Origin            node name of the publishing node
//	Fmq-Id                decimal, unique among its origin's messages
//	Fmq-Client            client ID of the publisher (no-local, parked sessions)
//	Fmq-Qos               "0", "1" or "2"
//	Fmq-Retain            "1" when the publish was retained
//	Fmq-Expiry            message expiry interval left, seconds
//	Fmq-Payload-Format    "0" or "1", when the publish had one
//	Fmq-Content-Type      MQTT 5 content type
//	Fmq-Response-Topic    MQTT 5 response topic
//	Fmq-Correlation-Data  standard base64
//	Fmq-User              one value per user property, key=value (in order)
//	Fmq-Served            queue groups of shared subscriptions served at the origin
//
// # What is forwarded
//
// Everything a local client publishes, after mochi delivered it locally
// (OnPublished): QoS 0 at once, QoS 1/2 once the bridge has stored it in
// the core (it republishes it through its inline client). Wills: mochi's
// (OnWillSent) and the gateway's own (OnPublished). Retained publishes
// carry Fmq-Retain. Not forwarded: '$' topics, the bridge's downlink
// deliveries (every node reads every command and delivers it itself), and
// what came from another node.
//
// # Delivery on the receiving node
//
// A message from another node is injected into the local mochi server by
// the hook's inline client "$ferrymq-cluster", with its QoS: mochi grants
// each subscriber min(QoS, subscription QoS) and runs its normal QoS 1/2
// flows, retries and queues; the session store queues it for parked
// sessions. Inline publishes skip the bridge, so the message is stored in
// the core once, by its origin; the hook does not forward what its inline
// client published, so nothing loops. Its packet origin is the publisher's
// client ID. The origin node ignores its own messages when NATS echoes
// them. Copies are collated (receive.go): each subscriber gets a message
// once, however many of its node's filters match.
//
// Retained messages: with the session store on a bucket (session.OpenKV,
// the nats engine's) every node already gets every retained message from
// the bucket, so the receiving node delivers a retained publish to its
// current subscribers with RETAIN 0 and does not retain it again
// (Options.LocalRetain retains it, for nodes that do not share them).
//
// # Shared subscriptions
//
// "$share/{group}/{filter}" is a NATS queue subscription in a queue group
// of that group and filter, the same on every node: NATS hands each
// message to one node of the group, which delivers it to one member of
// its own the mochi way. A node that has members of a group delivers the
// messages published on it to one of them (mochi's local choice) and names
// the group in Fmq-Served, so no other node does; members of other nodes
// get only what is published elsewhere (EMQX's "local" strategy). Groups
// are served by connected members only, on every node.
//
// # Sessions
//
// Routes are the local sessions' filters, counted by client ID (routes.go):
// subscribed with the first session holding a filter, unsubscribed with
// the last. An offline persistent session keeps its plain routes — while
// mochi holds it and while the session store has it parked — so its node
// queues what other nodes publish for it. A session that resumes on
// another node is routed there as it connects; the sweep
// (Options.SweepInterval) drops routes of sessions gone from a node.
//
// # Guarantees and limits
//
// Cross-node delivery is at most once: core NATS, no acknowledgement
// between nodes. A message in flight when a node or its NATS connection
// dies is lost for the other nodes' subscribers (the publisher's PUBACK
// says its node took it, and the core has it). Messages published while a
// node's NATS connection is down are buffered by the NATS client up to its
// reconnect buffer, then dropped. Nothing waits: the hook never blocks
// mochi's goroutines; it queues, bounded by Options.MaxPendingMessages and
// MaxPendingBytes, and drops and counts past them
// (ferrymq_cluster_dropped_total by reason; ferrymq_cluster_forwarded_total,
// ferrymq_cluster_received_total). A subscription is routed a moment after
// its SUBACK (NATS interest propagates asynchronously). Order: what a node
// forwards reaches each other node in the order forwarded (a client's
// bridged QoS 1/2 publishes are forwarded once stored, its others at
// once, as mochi delivers them locally). Node names must be unique among
// live nodes.
//
// Known gaps: sessions a node parks at start (taken back from the bucket
// after a restart) are not routed until their client connects again — the
// session store does not expose a parked session's filters; a retained
// publish reaches other nodes' live MQTT 5 subscribers with RETAIN 0 even
// with retain-as-published (see above); a copy of a message that comes
// after the message was delivered (CollateWait) may queue it twice for a
// parked session.
//
// The Hook is safe for concurrent use by mochi's goroutines. It starts its
// goroutines when the server starts (OnStarted) and Close, which mochi's
// OnStopped calls, stops them; it does not close the NATS connection.
package cluster
