// Package cluster routes MQTT publishes between the gateway nodes of a
// NATS cluster (`ferrymq serve --engine nats`), as the engine's Router
// (engine.Router, engine.RouterPresence): a device on one node subscribes,
// a device on another publishes, and the message arrives, as within one
// broker. NATS interest is the route table: each node subscribes, on its
// own NATS connection, to the subjects of its sessions' filters, and
// publishes every message its engine routes on its topic's subject; NATS
// hands it to the nodes that want it and to no other.
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
// $delayed/) are never routed, nor filters starting with '$'.
//
//	"cars/c1/cmd"     → fmqmqtt.cars.c1.cmd
//	"a.b/ /x"         → fmqmqtt.~YS5i.~IA.x
//	"a//b"            → fmqmqtt.a.~.b
//	"cars/+/cmd"      → fmqmqtt.cars.*.cmd
//	"jobs/#"          → fmqmqtt.jobs, fmqmqtt.jobs.>
//
// Every subscription is in a queue group, so that NATS hands each message
// to one subscription of the group:
//
//	plain filters of node N     prefix.node.{Token(N)}
//	"$share/{g}/{filter}"       prefix.share.{Token(g)}.{hex of the first 8 bytes of
//	                            SHA-256("$share/{g}/{filter}")}
//
// The share key is hashed with its prefix written "$share/" whatever case
// the client used (the engine matches the prefix in any case); the group
// is in the name for people reading the server's monitoring. Node names
// must be unique among live nodes.
//
// # Messages between nodes
//
// One NATS message per MQTT publish: the subject above, the MQTT payload
// as its data, and these headers. Their names and encodings, and the
// queue-group names above, are the format between nodes; a node drops,
// and counts, a message whose Fmq-V it does not know. Strings are URL
// query-escaped, so no value carries a CR or LF.
//
//	Fmq-V                 "1"
//	Fmq-Origin            node name of the publishing node
//	Fmq-Id                decimal, unique among its origin's messages
//	Fmq-Client            client ID of the publisher (no-local subscriptions)
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
// Version 1 is unchanged from the mochi-based router's, save that it
// hashed a share key as the client wrote it.
//
// # What is forwarded
//
// Everything the engine routes (Router.Routed), after it delivered it
// locally: what clients publish, QoS 0 and QoS 1/2 alike (with an uplink
// hook that defers, once the core took it), wills, and the server's own
// publishes. Retained publishes carry Fmq-Retain. Not forwarded: '$'
// topics; messages with a Ref — the bridge's downlink deliveries, which
// every node reads from the core and delivers itself; and what came from
// another node (the engine does not route what the router injected).
//
// # Delivery on the receiving node
//
// A message from another node is handed to the engine with
// Engine.PublishRouted: it delivers it with its own QoS handling (each
// subscriber gets min(QoS, subscription QoS), with its own subscription
// identifiers, retries and queues) and queues it for offline sessions. It
// skips the uplink hook, so the message is stored in the core once, by its
// origin. Its Origin is the publisher's client ID, for no-local
// subscriptions. The origin node ignores its own messages when NATS echoes
// them. Copies are collated (receive.go): the engine gets each message
// once per node, however many of the node's subscriptions match it.
//
// Retained messages: with the session store on a bucket (session.OpenKV,
// the nats engine's) every node already gets every retained message from
// the bucket, so the receiving node delivers a retained publish to its
// current subscribers and does not retain it again (Options.LocalRetain
// retains it, for nodes that do not share them). Either way a subscriber
// sees RETAIN as MQTT says: 1 for a retain-as-published subscription, 0
// for the others [MQTT-3.3.1-12].
//
// # Shared subscriptions
//
// "$share/{group}/{filter}" is a NATS queue subscription in the group's
// queue group, the same on every node: NATS hands each message to one
// node of the group, which delivers it to one member of its own (the
// engine's choice). A node that has members of a group delivers the
// messages published on it to one of them and names the group in
// Fmq-Served, so no other node does; members of other nodes get only what
// is published elsewhere (EMQX's "local" strategy). A receiving node tells
// the engine to skip every group of its own whose copy it did not get. A
// group is served by connected members only [MQTT-4.8.2-2]: a node holds a
// group's NATS subscription only while a member is connected there
// (RouterPresence), so NATS never hands a message to a node whose members
// are all offline.
//
// # Sessions
//
// Routes are counted per session and filter (routes.go): subscribed on
// NATS with the first session holding a filter, unsubscribed with the
// last. The engine reports every session's filters — online and offline,
// restored at start, adopted from another node — so an offline persistent
// session keeps its plain routes and its node queues what other nodes
// publish for it. A session that moves to another node (the store's
// claim: Engine.Forget) or ends is unsubscribed by the engine's calls. The
// engine calls the router under its session lock: the router only notes
// what is wanted there, and one goroutine of its own (the reconciler)
// subscribes and unsubscribes on NATS, trying again every RetryInterval
// what NATS refused.
//
// # Guarantees and limits
//
// Cross-node delivery is at most once: core NATS, no acknowledgement
// between nodes. A message in flight when a node or its NATS connection
// dies is lost for the other nodes' subscribers (the publisher's PUBACK
// says its node took it, and the core has it). Messages published while a
// node's NATS connection is down are buffered by the NATS client up to its
// reconnect buffer, then dropped. Nothing waits: the router never blocks
// the engine; it queues, bounded by Options.MaxPendingMessages and
// MaxPendingBytes, and drops and counts past them. Metrics:
// ferrymq_cluster_forwarded_total, ferrymq_cluster_received_total,
// ferrymq_cluster_dropped_total{reason} (forward_queue_full,
// publish_error, subject_too_long, closed, pending_limit,
// inject_queue_full, bad_message, inject_error, late_copy),
// ferrymq_cluster_late_copies_total and the gauge ferrymq_cluster_routes.
// A subscription is routed a moment after its SUBACK (NATS interest
// propagates asynchronously). Order: what a node forwards reaches each
// other node in the order forwarded, which is the order its engine
// delivered it locally.
//
// Known gaps: a copy of a message that comes after the message was
// delivered (CollateWait passed, rare: the copies of one message travel
// together) is delivered only to its shared group, and dropped (counted:
// late_copy) when a plain subscription on the node matches, which would
// get the message twice; a shared group whose members are all offline, on
// every node, loses what is published to it while they are (as within one
// node).
//
// # Concurrency and crashes
//
// A Router is safe for concurrent use. New starts nothing; Start starts
// its four goroutines (reconciler, forwarder, receiver, injector); Close
// stops them and returns once they have ended, after unsubscribing and
// flushing what was queued for NATS. It does not close the NATS
// connection. Nothing is persisted: after a crash NATS drops the node's
// interest with its connection, and the restarted engine reports its
// restored sessions again.
package cluster
