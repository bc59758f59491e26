package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/core/client"
)

// breakerCollector exports the circuit breakers of a gateway's uplink to
// several core nodes (CoreRemote with more than one address): each node's
// state, its state changes and its tries, read from the client.Cluster at
// each scrape.
type breakerCollector struct {
	cluster *client.Cluster

	state, changes, tries *prometheus.Desc
}

func newBreakerCollector(cl *client.Cluster) *breakerCollector {
	return &breakerCollector{cluster: cl,
		state: prometheus.NewDesc("ferrymq_core_remote_breaker_state",
			"The uplink's circuit breaker for each core node: 0 closed (takes traffic), 1 open (isolated), 2 half-open (one probe).", []string{"node"}, nil),
		changes: prometheus.NewDesc("ferrymq_core_remote_breaker_changes_total",
			"Changes of the uplink's circuit breakers since start, by core node and the state changed to.", []string{"node", "to"}, nil),
		tries: prometheus.NewDesc("ferrymq_core_remote_sends_total",
			"Uplink send tries since start, by core node and outcome (sent, failed: counted against the node).", []string{"node", "outcome"}, nil),
	}
}

func (b *breakerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- b.state
	ch <- b.changes
	ch <- b.tries
}

func (b *breakerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range b.cluster.Nodes() {
		ch <- prometheus.MustNewConstMetric(b.state, prometheus.GaugeValue, float64(n.State), n.Addr)
		ch <- prometheus.MustNewConstMetric(b.tries, prometheus.CounterValue, float64(n.Sent), n.Addr, "sent")
		ch <- prometheus.MustNewConstMetric(b.tries, prometheus.CounterValue, float64(n.Failed), n.Addr, "failed")
		for st, v := range n.Changes {
			ch <- prometheus.MustNewConstMetric(b.changes, prometheus.CounterValue, float64(v), n.Addr, client.BreakerState(st).String())
		}
	}
}
