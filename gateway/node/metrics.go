package node

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/txn"
)

// coreCollector exports delayed delivery and transactions on /metrics,
// reading each service's counters once per scrape.
type coreCollector struct {
	delay *delay.Service
	txn   *txn.Service

	delayScheduled, delayDelivered, delayMoved, delayDropped, delayFailed, delayWaiting, delayCancels *prometheus.Desc
	txnPending, txnResolved, txnChecks                                                                *prometheus.Desc
	traceWritten, traceDropped                                                                        *prometheus.Desc
	trace                                                                                             *trace.Recorder
}

func newCoreCollector(d *delay.Service, t *txn.Service, r *trace.Recorder) *coreCollector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &coreCollector{
		delay: d, txn: t, trace: r,
		traceWritten:   desc("ferrymq_trace_hops_written_total", "Trace hops written to %TRACE% since start."),
		traceDropped:   desc("ferrymq_trace_hops_dropped_total", "Trace hops dropped (queue full or write failed) since start."),
		delayScheduled: desc("ferrymq_delay_scheduled_total", "Delayed messages accepted since start."),
		delayDelivered: desc("ferrymq_delay_delivered_total", "Delayed messages stored in their topic when due, since start."),
		delayMoved:     desc("ferrymq_delay_moved_total", "Copies of delayed messages moved from one level to the next, since start."),
		delayDropped:   desc("ferrymq_delay_dropped_total", "Copies of cancelled delayed messages dropped, since start."),
		delayFailed:    desc("ferrymq_delay_failed_total", "Due messages that could not be stored in their topic (topic gone, too large), since start."),
		delayWaiting:   desc("ferrymq_delay_waiting", "Stored copies of delayed messages not yet moved on, by level: about the pending delayed messages.", "level"),
		delayCancels:   desc("ferrymq_delay_cancellations", "Cancellations remembered."),
		txnPending:     desc("ferrymq_txn_pending", "Unresolved half messages."),
		txnResolved:    desc("ferrymq_txn_resolved_total", "Transactions resolved since start, by outcome.", "outcome"),
		txnChecks:      desc("ferrymq_txn_checks_total", "Check-backs sent to producers since start."),
	}
}

func (c *coreCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.delayScheduled, c.delayDelivered, c.delayMoved, c.delayDropped, c.delayFailed,
		c.delayWaiting, c.delayCancels, c.txnPending, c.txnResolved, c.txnChecks, c.traceWritten, c.traceDropped} {
		ch <- d
	}
}

func (c *coreCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	if c.delay != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := c.delay.Stats(ctx)
		cancel()
		counter(c.delayScheduled, st.Scheduled)
		counter(c.delayDelivered, st.Delivered)
		counter(c.delayMoved, st.Moved)
		counter(c.delayDropped, st.Dropped)
		counter(c.delayFailed, st.Failed)
		gauge(c.delayCancels, int64(st.Cancelled))
		if err == nil {
			for level, n := range st.Waiting {
				gauge(c.delayWaiting, n, levelLabel(level))
			}
		}
	}
	if c.trace != nil {
		written, dropped := c.trace.Stats()
		counter(c.traceWritten, written)
		counter(c.traceDropped, dropped)
	}
	if c.txn != nil {
		st := c.txn.Stats()
		gauge(c.txnPending, int64(st.Pending))
		counter(c.txnResolved, st.Committed, "committed")
		counter(c.txnResolved, st.RolledBack, "rolled_back")
		counter(c.txnResolved, st.Discarded, "discarded")
		counter(c.txnChecks, st.Checks)
	}
}

func levelLabel(l int) string { return strconv.Itoa(l) }
