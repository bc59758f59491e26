package gateway

import (
	"errors"
	"net"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

type metrics struct {
	accepted    prometheus.Counter
	connects    prometheus.Counter
	disconnects prometheus.Counter
	panics      prometheus.Counter
	refused     *prometheus.CounterVec
	funcs       []prometheus.Collector
}

func newMetrics(g *Gateway) *metrics {
	m := &metrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_mqtt_sockets_accepted_total", Help: "Client sockets accepted by the MQTT listeners.",
		}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_mqtt_connects_total", Help: "MQTT sessions established (CONNACK success).",
		}),
		disconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_mqtt_disconnects_total", Help: "MQTT connections that ended after CONNACK.",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_mqtt_panics_recovered_total", Help: "Panics recovered in a connection's read path (that connection was closed).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_mqtt_connections_refused_total",
			Help: "Connections closed for bad input before or instead of a session, by reason.",
		}, []string{"reason"}),
	}
	info := g.server.Info
	gauge := func(name, help string, f func() float64) {
		m.funcs = append(m.funcs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	counter := func(name, help string, p *int64) {
		m.funcs = append(m.funcs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(atomic.LoadInt64(p)) }))
	}
	gauge("ferrymq_mqtt_connections", "MQTT clients connected now.",
		func() float64 { return float64(atomic.LoadInt64(&info.ClientsConnected)) })
	gauge("ferrymq_mqtt_sessions", "MQTT sessions held (connected or persistent).",
		func() float64 { return float64(g.server.Clients.Len()) })
	gauge("ferrymq_mqtt_subscriptions", "MQTT subscriptions.",
		func() float64 { return float64(atomic.LoadInt64(&info.Subscriptions)) })
	gauge("ferrymq_mqtt_retained_messages", "Retained MQTT messages.",
		func() float64 { return float64(atomic.LoadInt64(&info.Retained)) })
	gauge("ferrymq_mqtt_inflight", "QoS 1/2 messages in flight between the gateway and clients (mochi's view).",
		func() float64 { return float64(atomic.LoadInt64(&info.Inflight)) })
	counter("ferrymq_mqtt_bytes_received_total", "Bytes received from MQTT clients.", &info.BytesReceived)
	counter("ferrymq_mqtt_bytes_sent_total", "Bytes sent to MQTT clients.", &info.BytesSent)
	counter("ferrymq_mqtt_packets_received_total", "MQTT packets received.", &info.PacketsReceived)
	counter("ferrymq_mqtt_packets_sent_total", "MQTT packets sent.", &info.PacketsSent)
	counter("ferrymq_mqtt_messages_sent_total", "PUBLISH packets sent to MQTT subscribers.", &info.MessagesSent)
	counter("ferrymq_mqtt_messages_dropped_total", "Messages dropped for MQTT subscribers (full outbound queue, expiry).", &info.MessagesDropped)
	counter("ferrymq_mqtt_inflight_dropped_total", "QoS 1/2 messages not sent to a subscriber whose inflight window was full.", &info.InflightDropped)
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
		)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	cs := []prometheus.Collector{m.accepted, m.connects, m.disconnects, m.panics, m.refused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}
	return append(cs, m.funcs...)
}

// closedWithError counts why a connection ended with an error from mochi's
// establish (bad first packet, oversize, timeouts…).
func (m *metrics) closedWithError(err error) {
	var ne net.Error
	reason := "other"
	switch {
	case errors.Is(err, ErrNotConnect):
		reason = "not_connect"
	case errors.Is(err, ErrPacketTooLarge):
		reason = "too_large"
	case errors.Is(err, ErrMalformedLength), errors.Is(err, ErrReservedType):
		reason = "malformed"
	case errors.As(err, &ne) && ne.Timeout():
		reason = "timeout"
	default:
		return // ordinary disconnects are counted by the hooks
	}
	m.refused.WithLabelValues(reason).Inc()
}
