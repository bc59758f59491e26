package session

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the store's metrics for a Prometheus registry:
//
//	ferrymq_sessions_stored                  gauge    persistent sessions stored (on a bucket: held by this node)
//	ferrymq_sessions_stored_messages         gauge    their outbound QoS 1/2 messages (in flight or queued)
//	ferrymq_sessions_retained                gauge    retained messages stored
//	ferrymq_sessions_log_bytes               gauge    size of the session log (log store)
//	ferrymq_sessions_log_live_bytes          gauge    bytes of its live records (log store)
//	ferrymq_sessions_log_failed              gauge    1 once a write or fsync of the log failed (log store)
//	ferrymq_sessions_write_errors_total      counter  changes not stored, by reason (log store)
//	ferrymq_sessions_kv_write_errors_total   counter  changes not stored, by reason (bucket store)
//	ferrymq_sessions_kv_backlog              gauge    writes queued for the bucket, not yet acknowledged
//	ferrymq_sessions_taken_over_total        counter  sessions another node took over from this one
func (s *Store) Collectors() []prometheus.Collector {
	gauge := func(name, help string, f func(Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(s.Stats()) })
	}
	cs := []prometheus.Collector{
		gauge("ferrymq_sessions_stored", "Persistent MQTT sessions stored (on a bucket: held by this node).",
			func(st Stats) float64 { return float64(st.Sessions) }),
		gauge("ferrymq_sessions_stored_messages", "Outbound QoS 1/2 messages stored with the sessions (in flight or queued).",
			func(st Stats) float64 { return float64(st.Messages) }),
		gauge("ferrymq_sessions_retained", "Retained messages stored.",
			func(st Stats) float64 { return float64(st.Retained) }),
	}
	reasons := []string{reasonIO, reasonTooLarge, reasonBadValue, reasonUnknownSession, reasonClosed}
	errName := "ferrymq_sessions_write_errors_total"
	if s.kv != nil {
		reasons = []string{reasonUnavailable, reasonTooLarge, reasonBadValue, reasonFenced, reasonNotOwner, reasonBacklog, reasonClosed}
		errName = "ferrymq_sessions_kv_write_errors_total"
		cs = append(cs,
			gauge("ferrymq_sessions_kv_backlog", "Session writes queued for the key-value bucket and not yet acknowledged.",
				func(st Stats) float64 { return float64(st.Backlog) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferrymq_sessions_taken_over_total",
				Help: "Sessions another gateway node took over from this one."},
				func() float64 { return float64(s.kv.takenOver.Load()) }))
	} else {
		cs = append(cs,
			gauge("ferrymq_sessions_log_bytes", "Size of the session log.",
				func(st Stats) float64 { return float64(st.LogBytes) }),
			gauge("ferrymq_sessions_log_live_bytes", "Bytes of the session log's live records.",
				func(st Stats) float64 { return float64(st.LiveBytes) }),
			gauge("ferrymq_sessions_log_failed", "1 once a write or fsync of the session log failed: nothing is stored since.",
				func(st Stats) float64 {
					if st.Failed != nil {
						return 1
					}
					return 0
				}))
	}
	for _, reason := range reasons {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: errName,
			Help:        "Session changes that were not stored, by reason.",
			ConstLabels: prometheus.Labels{"reason": reason}},
			func() float64 {
				s.errMu.Lock()
				defer s.errMu.Unlock()
				return float64(s.writeErrs[reason])
			}))
	}
	return cs
}
