package alarm

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics export the active alarms and the Monitor's counters.
type metrics struct {
	m      *Monitor
	active *prometheus.Desc

	raised, cleared                              *prometheus.CounterVec
	webhookSent, webhookFailures, webhookDropped prometheus.Counter
}

func newMetrics(m *Monitor) *metrics {
	return &metrics{
		m:      m,
		active: prometheus.NewDesc("ferrymq_alarm_active", "1 for each alarm active now.", []string{"kind", "subject"}, nil),
		raised: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferrymq_alarms_raised_total",
			Help: "Alarms raised since start, by kind."}, []string{"kind"}),
		cleared: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferrymq_alarms_cleared_total",
			Help: "Alarms cleared since start, by kind."}, []string{"kind"}),
		webhookSent: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferrymq_alarm_webhook_sent_total",
			Help: "Alarm events a webhook accepted."}),
		webhookFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferrymq_alarm_webhook_failures_total",
			Help: "Failed attempts to post an alarm event to a webhook."}),
		webhookDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferrymq_alarm_webhook_dropped_total",
			Help: "Alarm events dropped from a full webhook queue."}),
	}
}

func (x *metrics) event(e Event) {
	if e.State == StateRaised {
		x.raised.WithLabelValues(string(e.Kind)).Inc()
	} else {
		x.cleared.WithLabelValues(string(e.Kind)).Inc()
	}
}

// Describe implements prometheus.Collector.
func (x *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- x.active
	x.raised.Describe(ch)
	x.cleared.Describe(ch)
	for _, c := range []prometheus.Counter{x.webhookSent, x.webhookFailures, x.webhookDropped} {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (x *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, e := range x.m.Active() {
		ch <- prometheus.MustNewConstMetric(x.active, prometheus.GaugeValue, 1, string(e.Kind), e.Subject)
	}
	x.raised.Collect(ch)
	x.cleared.Collect(ch)
	for _, c := range []prometheus.Counter{x.webhookSent, x.webhookFailures, x.webhookDropped} {
		c.Collect(ch)
	}
}

// Collector exports the Monitor on /metrics: ferrymq_alarm_active{kind,subject}
// (1 per active alarm), ferrymq_alarms_raised_total and …_cleared_total by
// kind, and the webhooks' sent, failed and dropped counters.
func (m *Monitor) Collector() prometheus.Collector { return m.metrics }
