package rpc

import "github.com/prometheus/client_golang/prometheus"

// Call outcomes, the label of ferrymq_rpc_calls_total.
const (
	outcomeAnswered     = "answered"
	outcomeTimeout      = "timeout"
	outcomeNotConnected = "not_connected"
	outcomeBad          = "bad_request"
	outcomeError        = "error"
)

type metrics struct {
	calls     *prometheus.CounterVec
	latency   prometheus.Histogram
	unmatched prometheus.Counter
	refused   prometheus.Counter
	served    *prometheus.CounterVec
	malformed prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_rpc_calls_total",
			Help: "Synchronous calls to devices made through this node, by outcome (answered, timeout, not_connected, bad_request, error).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ferrymq_rpc_call_seconds",
			Help:    "Time from a call reaching this node to the device's answer, answered calls only.",
			Buckets: prometheus.ExponentialBuckets(250e-6, 2, 18), // 250 µs … 33 s
		}),
		unmatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_rpc_answers_unmatched_total",
			Help: "Device answers to calls that had ended (timed out, abandoned) or were never made.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_rpc_publishes_refused_total",
			Help: "Device publishes under $rpc/ refused: not an answer to the device's own call.",
		}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_rpc_remote_calls_total",
			Help: "Calls another node asked this one about, by what this node said (here, absent).",
		}, []string{"state"}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_rpc_malformed_total",
			Help: "Messages between nodes about calls that did not decode (another version, a bad header), dropped.",
		}),
	}
	for _, o := range []string{outcomeAnswered, outcomeTimeout, outcomeNotConnected, outcomeBad, outcomeError} {
		m.calls.WithLabelValues(o)
	}
	return m
}

// Collectors returns the service's metrics, for the registry that serves
// /metrics.
func (s *Service) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.m.calls, s.m.latency, s.m.unmatched, s.m.refused, s.m.served, s.m.malformed}
}
