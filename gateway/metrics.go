package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the engine's figures as Prometheus metrics, read from one
// engine.Stats per scrape.
type metrics struct {
	g     *Gateway
	descs map[string]*prometheus.Desc
	funcs []prometheus.Collector
}

// engineMetrics names the engine's counters (engine.Stats.Counters) in
// /metrics: counter name → metric name, help.
var engineMetrics = []struct{ counter, name, help string }{
	{"accepted", "ferrymq_mqtt_sockets_accepted_total", "Client sockets accepted by the MQTT listeners."},
	{"connects", "ferrymq_mqtt_connects_total", "MQTT sessions established (CONNACK success)."},
	{"disconnects", "ferrymq_mqtt_disconnects_total", "MQTT connections that ended after CONNACK."},
	{"refused", "ferrymq_mqtt_connects_refused_total", "CONNECTs answered with a refusing CONNACK."},
	{"auth_failures", "ferrymq_mqtt_auth_failures_total", "CONNECTs the authenticator refused."},
	{"takeovers", "ferrymq_mqtt_takeovers_total", "Sessions taken over by a new connection of the same client ID."},
	{"panics", "ferrymq_mqtt_panics_recovered_total", "Panics recovered in a connection's work (that connection was closed)."},
	{"packets_in", "ferrymq_mqtt_packets_received_total", "MQTT packets received."},
	{"bytes_in", "ferrymq_mqtt_bytes_received_total", "Bytes received from MQTT clients."},
	{"bytes_out", "ferrymq_mqtt_bytes_sent_total", "Bytes sent to MQTT clients."},
	{"published", "ferrymq_mqtt_publishes_total", "PUBLISH packets accepted from clients."},
	{"refused_publishes", "ferrymq_mqtt_publishes_refused_total", "PUBLISH packets refused (ACL, quotas, reserved topics)."},
	{"duplicates", "ferrymq_mqtt_qos2_duplicates_total", "QoS 2 resends of a publish already received (not delivered again)."},
	{"paced", "ferrymq_mqtt_publishes_paced_total", "Publishes over a client's rate."},
	{"sent", "ferrymq_mqtt_messages_sent_total", "PUBLISH packets sent to MQTT subscribers."},
	{"dropped_slow", "ferrymq_mqtt_messages_dropped_total", "QoS 0 messages dropped for a subscriber whose write queue was full."},
	{"dropped_offline", "ferrymq_mqtt_messages_dropped_offline_total", "QoS 0 messages for an offline session (not queued)."},
	{"dropped_queue_full", "ferrymq_mqtt_inflight_dropped_total", "QoS 1/2 messages not queued for a session whose queue was full."},
	{"dropped_too_large", "ferrymq_mqtt_messages_too_large_total", "Messages over a client's Maximum Packet Size (not sent)."},
	{"wills", "ferrymq_mqtt_wills_total", "Wills published."},
	{"sessions_expired", "ferrymq_mqtt_sessions_expired_total", "Offline sessions ended by their expiry."},
}

func newMetrics(g *Gateway) *metrics {
	m := &metrics{g: g, descs: map[string]*prometheus.Desc{}}
	for _, em := range engineMetrics {
		m.descs[em.counter] = prometheus.NewDesc(em.name, em.help, nil, nil)
	}
	gauge := func(name, help string, f func() float64) {
		m.funcs = append(m.funcs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	gauge("ferrymq_mqtt_connections", "MQTT clients connected now.", func() float64 { return float64(g.e.Stats().Connected) })
	gauge("ferrymq_mqtt_sessions", "MQTT sessions held (connected or persistent).", func() float64 { return float64(g.e.Stats().Sessions) })
	gauge("ferrymq_sessions_parked", "Persistent sessions offline (their queued messages in the session store).", func() float64 {
		st := g.e.Stats()
		return float64(int64(st.Sessions) - st.Connected)
	})
	gauge("ferrymq_mqtt_inflight", "QoS 1/2 messages sent to MQTT clients and not yet acknowledged.", func() float64 {
		inflight, _ := g.e.Held()
		return float64(inflight)
	})
	gauge("ferrymq_mqtt_queued", "QoS 1/2 messages waiting in MQTT sessions behind their inflight window (or offline).", func() float64 {
		_, queued := g.e.Held()
		return float64(queued)
	})
	gauge("ferrymq_mqtt_subscriptions", "MQTT subscriptions.", func() float64 { return float64(g.e.Stats().Subscriptions) })
	gauge("ferrymq_mqtt_retained_messages", "Retained MQTT messages.", func() float64 { return float64(g.e.Stats().Retained) })
	gauge("ferrymq_mqtt_workers", "Goroutines of the engine's work pool.", func() float64 { return float64(g.e.Stats().Goroutines) })
	if st := g.opts.Store; st != nil {
		m.funcs = append(m.funcs,
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_store_fsyncs_total", Help: "Commit-log fsyncs."},
				func() float64 { return float64(st.Stats().Fsyncs) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_store_write_cycles_total", Help: "Commit-log writer cycles (one write each; the flushes)."},
				func() float64 { return float64(st.Stats().WriteCycles) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_store_messages_total", Help: "Messages appended to the commit log."},
				func() float64 { return float64(st.Stats().Messages) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferrymq_store_disk_bytes", Help: "Bytes of commit-log segments on disk."},
				func() float64 { return float64(st.Stats().CommitLogBytes) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferrymq_store_tail_cache_bytes", Help: "Size of the tail cache: the newest commit-log bytes held in memory (0: off)."},
				func() float64 { return float64(st.Stats().TailCacheBytes) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_store_tail_cache_hits_total", Help: "Records read from the tail cache."},
				func() float64 { return float64(st.Stats().TailCacheHits) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_store_tail_cache_misses_total", Help: "Records read from behind the tail cache (cold reads, and mapped reads by ID, key or time)."},
				func() float64 { return float64(st.Stats().TailCacheMisses) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_store_cold_read_bytes_total", Help: "Bytes consumers read from behind the tail cache (pread, drop-behind, budgeted)."},
				func() float64 { return float64(st.Stats().ColdReadBytes) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_store_cold_read_direct_bytes_total", Help: "The part of the cold-read bytes read around the page cache (O_DIRECT)."},
				func() float64 { return float64(st.Stats().ColdReadDirectBytes) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_store_cold_reads_delayed_total", Help: "Reads that waited for their group's cold-read budget."},
				func() float64 { return float64(st.Stats().ColdReadDelays) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_store_cold_read_delay_seconds_total", Help: "Time reads waited for cold-read budgets."},
				func() float64 { return st.Stats().ColdReadDelay.Seconds() }),
		)
	}
	return m
}

// refusedReasons labels ferrymq_mqtt_connections_refused_total: sockets
// closed before or instead of a session.
var refusedReasons = []struct{ counter, reason string }{
	{"protocol_errors", "protocol"}, // malformed packets and protocol errors (after CONNACK too)
	{"connect_timeouts", "timeout"},
	{"admission_refused", "admission"},
	{"auth_failures", "auth"},
}

var refusedDesc = prometheus.NewDesc("ferrymq_mqtt_connections_refused_total",
	"Connections closed for bad input or refused before or instead of a session, by reason.", []string{"reason"}, nil)

// Describe implements prometheus.Collector for the engine's counters.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range m.descs {
		ch <- d
	}
	ch <- refusedDesc
}

// Collect implements prometheus.Collector: one Stats call per scrape.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	counters := m.g.e.Stats().Counters
	for _, em := range engineMetrics {
		ch <- prometheus.MustNewConstMetric(m.descs[em.counter], prometheus.CounterValue, float64(counters[em.counter]))
	}
	for _, r := range refusedReasons {
		ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(counters[r.counter]), r.reason)
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	cs := []prometheus.Collector{m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}
	return append(cs, m.funcs...)
}
