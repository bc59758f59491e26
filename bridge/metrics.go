package bridge

import "github.com/prometheus/client_golang/prometheus"

// metrics are the bridge's counters, registered by whoever serves /metrics
// (Hook.Collectors).
type metrics struct {
	received        *prometheus.CounterVec // by qos
	bridged         prometheus.Counter
	failures        *prometheus.CounterVec // by reason
	unbridged       *prometheus.CounterVec // by reason
	duplicates      prometheus.Counter
	qos2Resends     *prometheus.CounterVec // by outcome
	appendSeconds   prometheus.Histogram
	inflight        prometheus.Gauge
	acks            prometheus.Counter
	events          prometheus.Counter
	eventFailures   prometheus.Counter
	receipts        prometheus.Counter
	receiptFailures prometheus.Counter
	downlink        *prometheus.CounterVec // by outcome
}

func newMetrics() *metrics {
	return &metrics{
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_mqtt_publishes_received_total",
			Help: "MQTT PUBLISH packets received from clients, by QoS.",
		}, []string{"qos"}),
		bridged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_bridge_uplink_messages_total",
			Help: "MQTT publishes the core accepted (durable under the flush policy).",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_bridge_uplink_failures_total",
			Help: "MQTT publishes the core refused, by reason; QoS 1/2 ones were not acknowledged.",
		}, []string{"reason"}),
		unbridged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_bridge_unbridged_total",
			Help: "MQTT publishes that stayed MQTT-only, by reason (no_rule, invalid_core_topic).",
		}, []string{"reason"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_bridge_qos2_duplicates_total",
			Help: "QoS 2 PUBLISH resends dropped because the first copy was still on its way to the core.",
		}),
		qos2Resends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_bridge_qos2_unsure_resends_total",
			Help: "QoS 2 resends of publishes taken before a restart and not answered then, by what the look in the core found: stored (answered, not stored again), not_stored (stored now), error.",
		}, []string{"outcome"}),
		appendSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ferrymq_bridge_core_append_seconds",
			Help:    "Time from handing a publish to the core until it is durable under the flush policy.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16), // 50 µs … 1.6 s
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ferrymq_bridge_uplink_inflight",
			Help: "QoS 1/2 publishes handed to the core and not yet acknowledged to the device.",
		}),
		acks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_bridge_acks_total",
			Help: "PUBACK/PUBREC packets sent after the core accepted the publish.",
		}),
		events: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_presence_events_total",
			Help: "Device presence events (connected, disconnected, takeover) stored in the core.",
		}),
		eventFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_presence_event_failures_total",
			Help: "Device presence events the core refused.",
		}),
		receipts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_downlink_receipts_total",
			Help: "Delivery receipts stored in the core.",
		}),
		receiptFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_downlink_receipt_failures_total",
			Help: "Delivery receipts the core refused.",
		}),
		downlink: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_downlink_messages_total",
			Help: "Downlink messages by what happened: consumed, published, queued (for a parked session), held (P2P client unknown here), not_here (P2P client unknown here, holding off), delivered, expired, dropped, invalid_topic.",
		}, []string{"outcome"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.received, m.bridged, m.failures, m.unbridged, m.duplicates, m.qos2Resends,
		m.appendSeconds, m.inflight, m.acks, m.events, m.eventFailures, m.receipts, m.receiptFailures, m.downlink}
}
