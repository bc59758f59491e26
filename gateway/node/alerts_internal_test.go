package node

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestPrometheusAlertsUseExportedMetrics: every ferrymq_ metric the rules
// in docs/prometheus-alerts.yaml read is one a node exports (promtool
// checks the rules' syntax and behaviour in .ci/run, not that the names
// exist). Exported are the metrics an embedded node's registry gathers
// plus those its collectors describe (some have samples only when their
// subject exists: a TLS listener, a dead-letter topic, engine nats).
func TestPrometheusAlertsUseExportedMetrics(t *testing.T) {
	n := startEmbeddedForRoutes(t)
	exported := map[string]bool{}
	mfs, err := n.gateway.Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}
	descs := make(chan *prometheus.Desc, 64)
	go func() {
		newHealthCollector(n.health).Describe(descs)
		n.alarms.Collector().Describe(descs)
		close(descs)
	}()
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range descs {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			exported[m[1]] = true
		}
	}
	require.True(t, exported["ferrymq_mqtt_connections"] && exported["ferrymq_store_writable"], "the collection works")

	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "prometheus-alerts.yaml"))
	require.NoError(t, err)
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	name := regexp.MustCompile(`\bferrymq_[a-z_]+`)
	var missing []string
	rules := 0
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			rules++
			for _, m := range name.FindAllString(r.Expr, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if s, ok := strings.CutSuffix(m, suffix); ok && exported[s] {
						base = s
					}
				}
				if !exported[base] && !slices.Contains(missing, r.Alert+": "+m) {
					missing = append(missing, r.Alert+": "+m)
				}
			}
		}
	}
	require.Greater(t, rules, 10, "the rules were read")
	require.Empty(t, missing, "metrics the rules read that no node exports")
}
