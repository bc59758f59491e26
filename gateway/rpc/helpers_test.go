package rpc_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/rpc"
)

// metric returns the value of the service's counter name (with label
// value outcome for a counter vector, "" otherwise).
func metric(t *testing.T, s *rpc.Service, name, label string) float64 {
	t.Helper()
	for _, c := range s.Collectors() {
		ch := make(chan prometheus.Metric, 16)
		c.Collect(ch)
		close(ch)
		for m := range ch {
			if !strings.Contains(m.Desc().String(), `fqName: "`+name+`"`) {
				continue
			}
			var d dto.Metric
			require.NoError(t, m.Write(&d))
			if label != "" && (len(d.Label) == 0 || d.Label[0].GetValue() != label) {
				continue
			}
			return d.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s %s", name, label)
	return 0
}

// calls returns the calls made with one outcome.
func calls(t *testing.T, s *rpc.Service, outcome string) float64 {
	t.Helper()
	return metric(t, s, "ferrymq_rpc_calls_total", outcome)
}
