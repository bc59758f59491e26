package node

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/core/store"
)

// maxGroupLagSeries bounds ferrymq_group_lag: the rows with the most lag.
const maxGroupLagSeries = 1000

// healthCollector exports what the alarms watch, for operators who alert
// from Prometheus (docs/prometheus-alerts.yaml): one reading per scrape
// through the same health methods the alarms use.
type healthCollector struct {
	h *health

	writable, fsync, fsSize, fsAvail, groupLag, deadLetters            *prometheus.Desc
	retryBacklog, delayOverdue, certExpiry, keyExpiry, nats, anonymous *prometheus.Desc
}

func newHealthCollector(h *health) *healthCollector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &healthCollector{h: h,
		writable: desc("ferrymq_store_writable", "1 while the embedded store takes writes, 0 once it refuses them (a write or fsync failed: restart)."),
		fsync:    desc("ferrymq_store_fsync_seconds", "Time of the commit log's fsyncs."),
		fsSize:   desc("ferrymq_filesystem_size_bytes", "Size of the data folder's filesystem (what users may have: used + available).", "path"),
		fsAvail:  desc("ferrymq_filesystem_avail_bytes", "Bytes of the data folder's filesystem still available to the node.", "path"),
		groupLag: desc("ferrymq_group_lag", "Messages not yet committed by a consumer group, per topic (broadcast: per member); the 1000 rows with the most lag.",
			"group", "topic", "member"),
		deadLetters:  desc("ferrymq_dead_letter_messages_total", "Messages ever stored in a group's dead-letter topic %DLQ%<group>.", "group"),
		retryBacklog: desc("ferrymq_retry_backlog", "Messages waiting in the retry schedule for their redelivery."),
		delayOverdue: desc("ferrymq_delay_overdue_seconds", "How late the most overdue delayed message is (0: none past its time)."),
		certExpiry:   desc("ferrymq_certificate_expiry_timestamp_seconds", "When a TLS certificate the node serves or presents expires (Unix time).", "subject"),
		keyExpiry:    desc("ferrymq_key_expiry_timestamp_seconds", "When an authentication key expires or is due for rotation (Unix time).", "subject"),
		nats:         desc("ferrymq_nats_reachable", "1 while NATS and JetStream answer (engine nats), else 0."),
		anonymous:    desc("ferrymq_mqtt_anonymous_listeners", "MQTT listeners bound beyond loopback on which clients with no credentials may connect (auth.anonymous: true)."),
	}
}

func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.writable, c.fsync, c.fsSize, c.fsAvail, c.groupLag, c.deadLetters,
		c.retryBacklog, c.delayOverdue, c.certExpiry, c.keyExpiry, c.nats, c.anonymous} {
		ch <- d
	}
}

func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	h := c.h
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if h.store != nil {
		gauge(c.writable, boolGauge(h.storeFailure() == nil))
		st := h.store.Stats()
		buckets := make(map[float64]uint64, len(store.FsyncBuckets))
		var cum uint64
		for i, b := range store.FsyncBuckets {
			cum += uint64(st.FsyncCounts[i])
			buckets[b] = cum
		}
		cum += uint64(st.FsyncCounts[len(store.FsyncBuckets)])
		ch <- prometheus.MustNewConstHistogram(c.fsync, cum, st.FsyncTime.Seconds(), buckets)
	}
	if size, avail, err := h.filesystem(); err == nil {
		gauge(c.fsSize, float64(size), h.dataDir)
		gauge(c.fsAvail, float64(avail), h.dataDir)
	}
	if rows, err := h.groupLags(ctx); err == nil {
		for _, r := range topLag(rows, maxGroupLagSeries) {
			gauge(c.groupLag, float64(r.Lag), r.Group, r.Topic, r.Member)
		}
	}
	if vs, err := h.deadLetters(ctx); err == nil {
		for g, v := range vs {
			ch <- prometheus.MustNewConstMetric(c.deadLetters, prometheus.CounterValue, v, g)
		}
	}
	if vs, err := h.retryBacklog(ctx); err == nil {
		for _, v := range vs {
			gauge(c.retryBacklog, v)
		}
	}
	if vs, err := h.delayOverdue(ctx); err == nil {
		for _, v := range vs {
			gauge(c.delayOverdue, v)
		}
	}
	for s, t := range h.certs {
		gauge(c.certExpiry, float64(t.Unix()), s)
	}
	for s, t := range h.keys {
		gauge(c.keyExpiry, float64(t.Unix()), s)
	}
	if h.n.engine != nil {
		gauge(c.nats, boolGauge(h.natsReachable(ctx) == nil))
	}
	gauge(c.anonymous, float64(len(h.n.anonymous)))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
