package session

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// BenchmarkSaveMessage: the write-through of one outbound message, as the
// engine makes it under a session's lock (a log append, no fsync).
func BenchmarkSaveMessage(b *testing.B) {
	for _, size := range []int{64, 1 << 10, 16 << 10} {
		b.Run(fmt.Sprintf("size=%s", sizeName(size)), func(b *testing.B) {
			s := openStore(b, b.TempDir(), Options{CompactBytes: 1 << 40})
			s.SaveClient(engine.ClientRecord{ID: "car-7", Protocol: 4, Expiry: 60})
			m := &engine.Message{Topic: "cmd/car-7", QoS: 1, Payload: make([]byte, size), Ref: "012499e7000000000000013500000093"}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			pid := uint16(0)
			for b.Loop() {
				pid = pid%1000 + 1
				s.SaveMessage("car-7", pid, m, nil)
			}
		})
	}
}

// BenchmarkInboundQoS2: the write-throughs of one inbound QoS 2 flow, as
// the engine makes them. flow=before: what it wrote before QoS2IDs
// (answered, released); flow=bridged: taken (with its QoS2ID, before the
// append), released; flow=mqtt-only: taken, answered, released.
func BenchmarkInboundQoS2(b *testing.B) {
	for _, flow := range []string{"before", "bridged", "mqtt-only"} {
		b.Run("flow="+flow, func(b *testing.B) {
			s := openStore(b, b.TempDir(), Options{CompactBytes: 1 << 40})
			s.SaveClient(engine.ClientRecord{ID: "car-7", Protocol: 5, Expiry: 60})
			b.ReportAllocs()
			pid, id := uint16(0), uint64(1_800_000_000_000_000_000)
			for b.Loop() {
				pid, id = pid%1000+1, id+1
				if flow != "before" {
					s.SaveInbound("car-7", pid, id, true)
				}
				if flow != "bridged" {
					s.SaveInbound("car-7", pid, 0, true)
				}
				s.SaveInbound("car-7", pid, 0, false)
			}
		})
	}
}

// BenchmarkLoadMessages: an offline session's 100 queued messages read
// back by their offsets when it resumes.
func BenchmarkLoadMessages(b *testing.B) {
	s := openStore(b, b.TempDir(), Options{CompactBytes: 1 << 40})
	for i := range 1000 {
		id := fmt.Sprintf("car-%d", i)
		s.SaveClient(engine.ClientRecord{ID: id, Protocol: 4, Expiry: 60})
		for pid := uint16(1); pid <= 100; pid++ {
			s.SaveMessage(id, pid, &engine.Message{Topic: "cmd/" + id, QoS: 1, Payload: make([]byte, 256)}, nil)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		msgs, err := s.LoadMessages(fmt.Sprintf("car-%d", i%1000))
		if err != nil || len(msgs) != 100 {
			b.Fatal(err, len(msgs))
		}
		i++
	}
}

func sizeName(n int) string {
	if n >= 1<<10 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// The collectors register under their names and report the store's
// figures.
func TestCollectors(t *testing.T) {
	s := openStore(t, t.TempDir())
	fill(s, "a")
	s.SaveSubscription("nobody", "x", topictree.Options{QoS: 1})
	reg := prometheus.NewRegistry()
	for _, c := range s.Collectors() {
		require.NoError(t, reg.Register(c))
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetValue() + "}"
			}
			if m.Gauge != nil {
				got[name] = m.Gauge.GetValue()
			} else {
				got[name] = m.Counter.GetValue()
			}
		}
	}
	require.Equal(t, 1.0, got["ferrymq_sessions_stored"])
	require.Equal(t, 3.0, got["ferrymq_sessions_stored_messages"])
	require.Equal(t, 1.0, got["ferrymq_sessions_write_errors_total{unknown_session}"])
	require.Equal(t, 0.0, got["ferrymq_sessions_log_failed"])
	require.Positive(t, got["ferrymq_sessions_log_bytes"])
}
