package gateway

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// StatsHandler serves the operator endpoints:
//
//	/healthz  200 while the process serves HTTP
//	/readyz   200 once the listeners serve and every check passes, else 503
//	/metrics  Prometheus text format
//	/stats    the same figures as JSON, for people
//
// checks are extra readiness conditions (e.g. the core is open).
func (g *Gateway) StatsHandler(checks ...func() error) http.Handler {
	return g.StatsHandlerWith(StatsOptions{Checks: checks})
}

// StatsOptions add to what StatsHandlerWith serves. A zero field adds
// nothing.
type StatsOptions struct {
	// Checks are extra readiness conditions for /readyz.
	Checks []func() error
	// Extra returns sections /stats adds beside "time", "ready" and
	// "metrics" (which it cannot replace), e.g. "topics" and "groups" from
	// the store. It is called once per request, with the request's context
	// bounded by StatsExtraTimeout, and must be safe for concurrent use.
	// What it returns is shown to anyone who can reach the port: no
	// secrets.
	Extra func(ctx context.Context) map[string]any
}

// StatsExtraTimeout bounds one call of StatsOptions.Extra.
const StatsExtraTimeout = 2 * time.Second

// StatsHandlerWith is StatsHandler with StatsOptions.
func (g *Gateway) StatsHandlerWith(o StatsOptions) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !g.Ready() {
			http.Error(w, "mqtt listeners not serving", http.StatusServiceUnavailable)
			return
		}
		for _, c := range o.Checks {
			if err := c(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) { g.serveStats(w, r, o.Extra) })
	return mux
}

// The /stats body: every metric by name under "metrics"; labelled ones as
// a map from "label=value,…" to value; histograms as count, sum and
// estimated quantiles. StatsOptions.Extra adds sections at the top level.
const (
	statsTime    = "time"
	statsReady   = "ready"
	statsMetrics = "metrics"
)

func (g *Gateway) serveStats(w http.ResponseWriter, r *http.Request, extra func(context.Context) map[string]any) {
	mfs, err := g.reg.Gather()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	metrics := map[string]any{}
	for _, mf := range mfs {
		name := mf.GetName()
		if strings.HasPrefix(name, "go_") && name != "go_goroutines" {
			continue
		}
		ms := mf.GetMetric()
		if len(ms) == 1 && len(ms[0].GetLabel()) == 0 {
			metrics[name] = metricValue(ms[0])
			continue
		}
		byLabel := map[string]any{}
		for _, m := range ms {
			byLabel[labelKey(m.GetLabel())] = metricValue(m)
		}
		metrics[name] = byLabel
	}
	doc := map[string]any{statsTime: time.Now().UTC(), statsReady: g.Ready(), statsMetrics: metrics}
	if extra != nil {
		ctx, cancel := context.WithTimeout(r.Context(), StatsExtraTimeout)
		sections := extra(ctx)
		cancel()
		for k, v := range sections {
			if _, taken := doc[k]; !taken {
				doc[k] = v
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(doc)
}

func labelKey(ls []*dto.LabelPair) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = l.GetName() + "=" + l.GetValue()
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func metricValue(m *dto.Metric) any {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		h := m.Histogram
		return map[string]float64{
			"count": float64(h.GetSampleCount()), "sum": h.GetSampleSum(),
			"p50": quantile(h, 0.5), "p99": quantile(h, 0.99), "p999": quantile(h, 0.999),
		}
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return nil
}

// quantile estimates q from cumulative buckets: the upper bound of the
// first bucket holding it (0 if empty; the last bound if beyond it — JSON
// has no infinity).
func quantile(h *dto.Histogram, q float64) float64 {
	n := h.GetSampleCount()
	if n == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(n)))
	last := 0.0
	for _, b := range h.GetBucket() {
		last = b.GetUpperBound()
		if b.GetCumulativeCount() >= want {
			return last
		}
	}
	return last
}
