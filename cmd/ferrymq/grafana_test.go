package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every metric the shipped Grafana dashboard queries is one the code
// declares (so a renamed metric breaks this test, not an operator's board).
func TestGrafanaDashboardMetricsExist(t *testing.T) {
	board, err := os.ReadFile("../../docs/grafana-dashboard.json")
	require.NoError(t, err)
	name := regexp.MustCompile(`ferrymq_[a-z_]+`)
	declared := map[string]bool{}
	require.NoError(t, filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range regexp.MustCompile(`"(ferrymq_[a-z_]+)"`).FindAllSubmatch(b, -1) {
			declared[string(m[1])] = true
		}
		return nil
	}))
	used := name.FindAllString(string(board), -1)
	require.NotEmpty(t, used)
	for _, m := range used {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
		require.True(t, declared[base], "docs/grafana-dashboard.json uses %s, which no code declares", m)
	}
}
