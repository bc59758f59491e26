package cluster

import "github.com/prometheus/client_golang/prometheus"

// Reasons a message is dropped (ferrymq_cluster_dropped_total).
const (
	dropForwardFull = "forward_queue_full" // too many publishes waiting to go to NATS
	dropPublish     = "publish_error"      // NATS refused it: closed connection, reconnect buffer full, max payload
	dropLong        = "subject_too_long"   // Options.MaxSubjectBytes
	dropClosed      = "closed"             // the router or the engine closed
	dropPending     = "pending_limit"      // NATS delivered faster than this node takes (slow consumer)
	dropInjectFull  = "inject_queue_full"  // too many messages waiting for local delivery
	dropBad         = "bad_message"        // headers this node cannot read
	dropInject      = "inject_error"       // the engine refused the publish
	dropLate        = "late_copy"          // a shared group's copy after its message was delivered to plain subscribers here
)

// metrics are the router's figures, registered by whoever serves
// /metrics (Router.Collectors).
type metrics struct {
	forwarded prometheus.Counter
	received  prometheus.Counter
	late      prometheus.Counter
	dropped   *prometheus.CounterVec // by reason; pending_limit is brought up to date at collection
}

func newMetrics() *metrics {
	m := &metrics{
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_cluster_forwarded_total",
			Help: "MQTT publishes of this node published on NATS for the other nodes' subscribers.",
		}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_cluster_received_total",
			Help: "MQTT publishes from other nodes delivered to this node's subscribers.",
		}),
		late: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_cluster_late_copies_total",
			Help: "Copies of a message from another node that came after it was delivered (delivered on their own).",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_cluster_dropped_total",
			Help: "Messages between nodes dropped, by reason; cross-node delivery is at most once.",
		}, []string{"reason"}),
	}
	for _, r := range []string{dropForwardFull, dropPublish, dropLong, dropClosed, dropPending, dropInjectFull, dropBad, dropInject, dropLate} {
		m.dropped.WithLabelValues(r)
	}
	return m
}

func (m *metrics) drop(reason string) { m.dropped.WithLabelValues(reason).Inc() }
