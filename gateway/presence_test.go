package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

func events(t *testing.T, env *gatewaytest.Env, client string) []bridge.Event {
	t.Helper()
	var out []bridge.Event
	for _, m := range readAll(t, env.Store, bridge.DefaultEventsTopic) {
		if m.ShardingKey != client {
			continue
		}
		var e bridge.Event
		require.NoError(t, json.Unmarshal(m.Body, &e))
		require.Equal(t, e.Event, m.Tag)
		out = append(out, e)
	}
	return out
}

func eventNames(es []bridge.Event) []string {
	var s []string
	for _, e := range es {
		s = append(s, e.Event+":"+e.Reason)
	}
	return s
}

// Connect, disconnect, reconnect, takeover and a lost connection arrive as
// ordered events under the client's key with growing sequence numbers.
func TestPresenceEventsInOrder(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	a := dialV3(t, env.TCP, "car-7")
	a.Disconnect(100)
	require.Eventually(t, func() bool { return len(events(t, env, "car-7")) == 2 }, 5*time.Second, 10*time.Millisecond)

	dialV3(t, env.TCP, "car-7")      // second session …
	c := dialV3(t, env.TCP, "car-7") // … taken over by a third
	require.True(t, c.IsConnectionOpen())
	raw := rawConn(t, env.TCP, connectV4("car-7")) // taken over again, then the socket dies
	require.NoError(t, raw.Close())

	want := []string{"connected:", "disconnected:normal", "connected:", "takeover:", "connected:", "takeover:", "connected:", "disconnected:connection_lost"}
	require.Eventually(t, func() bool { return len(events(t, env, "car-7")) >= len(want) }, 5*time.Second, 10*time.Millisecond)
	es := events(t, env, "car-7")
	require.Equal(t, want, eventNames(es))
	for i := 1; i < len(es); i++ {
		require.Greater(t, es[i].Seq, es[i-1].Seq)
	}
	require.Equal(t, byte(4), es[0].Proto)
	require.NotEmpty(t, es[3].OldRemote)
}

// /metrics is valid Prometheus text with the gateway's figures; /stats has
// the same as JSON; /readyz is ready.
func TestMetricsScraped(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	c := dialV3(t, env.TCP, "m1")
	for range 5 {
		tok := c.Publish("telemetry/m1", 1, false, "x")
		require.True(t, tok.WaitTimeout(5*time.Second))
	}
	tok := c.Publish("bad topic/m1", 1, false, "x")
	require.True(t, tok.WaitTimeout(5*time.Second))

	srv := httptest.NewServer(env.Gateway.StatsHandler())
	defer srv.Close()
	get := func(path string) (int, string) {
		res, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	code, body := get("/metrics")
	require.Equal(t, 200, code)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)
	value := func(name string, labels ...string) float64 {
		f, ok := fams[name]
		require.True(t, ok, "metric %s missing", name)
	next:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
		t.Fatalf("metric %s%v not found", name, labels)
		return 0
	}
	require.Equal(t, 1.0, value("ferrymq_mqtt_connections"))
	require.GreaterOrEqual(t, value("ferrymq_mqtt_connects_total"), 1.0)
	require.Equal(t, 6.0, value("ferrymq_mqtt_publishes_received_total", "qos", "1"))
	require.Equal(t, 5.0, value("ferrymq_bridge_uplink_messages_total"))
	require.Equal(t, 1.0, value("ferrymq_bridge_unbridged_total", "reason", "invalid_core_topic"))
	require.GreaterOrEqual(t, value("ferrymq_bridge_core_append_seconds"), 5.0)
	require.Greater(t, value("ferrymq_store_disk_bytes"), 0.0)
	require.Greater(t, value("ferrymq_mqtt_bytes_received_total"), 0.0)
	require.Contains(t, fams, "ferrymq_store_fsyncs_total")
	require.Equal(t, float64(store.DefaultTailCacheBytes), value("ferrymq_store_tail_cache_bytes"))
	for _, name := range []string{"ferrymq_store_tail_cache_hits_total", "ferrymq_store_tail_cache_misses_total",
		"ferrymq_store_cold_read_bytes_total", "ferrymq_store_cold_read_direct_bytes_total", "ferrymq_store_cold_reads_delayed_total", "ferrymq_store_cold_read_delay_seconds_total"} {
		require.Contains(t, fams, name)
	}
	require.Contains(t, fams, "process_resident_memory_bytes")

	code, body = get("/stats")
	require.Equal(t, 200, code)
	var doc struct {
		Ready   bool           `json:"ready"`
		Metrics map[string]any `json:"metrics"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	require.True(t, doc.Ready)
	require.Equal(t, 1.0, doc.Metrics["ferrymq_mqtt_connections"])
	require.Equal(t, 5.0, doc.Metrics["ferrymq_bridge_uplink_messages_total"])

	code, _ = get("/readyz")
	require.Equal(t, 200, code)
	code, _ = get("/healthz")
	require.Equal(t, 200, code)
}
