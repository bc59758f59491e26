package node

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/core/client"
)

// breakerCollector exports the circuit breakers of a gateway's uplink to
// several core nodes (CoreRemote with more than one address): each node's
// state, its state changes and its tries, read from the client.Cluster at
// each scrape; the changes are counted as the Cluster reports them.
type breakerCollector struct {
	cluster *client.Cluster // set before registration

	mu      sync.Mutex
	changes map[[2]string]int64 // node, new state → times

	state, changesDesc, tries *prometheus.Desc
}

func newBreakerCollector() *breakerCollector {
	return &breakerCollector{changes: map[[2]string]int64{},
		state: prometheus.NewDesc("ferrymq_core_remote_breaker_state",
			"The uplink's circuit breaker for each core node: 0 closed (takes traffic), 1 open (isolated), 2 half-open (one probe).", []string{"node"}, nil),
		changesDesc: prometheus.NewDesc("ferrymq_core_remote_breaker_changes_total",
			"Changes of the uplink's circuit breakers since start, by core node and the state changed to.", []string{"node", "to"}, nil),
		tries: prometheus.NewDesc("ferrymq_core_remote_sends_total",
			"Uplink send tries since start, by core node and outcome (sent, failed: counted against the node).", []string{"node", "outcome"}, nil),
	}
}

// changed is the Cluster's OnStateChange.
func (b *breakerCollector) changed(addr string, _, to client.BreakerState) {
	b.mu.Lock()
	b.changes[[2]string{addr, to.String()}]++
	b.mu.Unlock()
}

func (b *breakerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- b.state
	ch <- b.changesDesc
	ch <- b.tries
}

func (b *breakerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range b.cluster.Nodes() {
		ch <- prometheus.MustNewConstMetric(b.state, prometheus.GaugeValue, float64(n.State), n.Addr)
		ch <- prometheus.MustNewConstMetric(b.tries, prometheus.CounterValue, float64(n.Sent), n.Addr, "sent")
		ch <- prometheus.MustNewConstMetric(b.tries, prometheus.CounterValue, float64(n.Failed), n.Addr, "failed")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, v := range b.changes {
		ch <- prometheus.MustNewConstMetric(b.changesDesc, prometheus.CounterValue, float64(v), k[0], k[1])
	}
}
