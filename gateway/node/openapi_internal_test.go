package node

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/httpapi"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/gateway/admin"
	"github.com/ferrymq/ferrymq/session"
)

// TestOpenAPIMatchesRoutes: docs/openapi.yaml documents exactly the
// endpoints a node's HTTP server serves under /api/, method by method.
//
// The served ones are read off the real mux of an embedded node (the mode
// that serves the most): what it hands to core/httpapi ("/api/") and to
// gateway/admin (admin.Patterns) is expanded by those packages' Routes,
// from the tables their handlers are built from; a pattern the node
// registers itself under /api/ counts as it is, and must name its method.
// Routes outside /api/ — /healthz, /readyz, /metrics, /stats, the
// dashboard's page and assets — are not part of the HTTP API the file
// describes (docs/gateway.md does) and are left out.
// Path parameters are compared by position, not name ({topic...} and
// {topic} are one parameter).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	served := servedAPIRoutes(t, startEmbeddedForRoutes(t))
	documented := documentedRoutes(t, filepath.Join("..", "..", "docs", "openapi.yaml"))
	// The collection works: both sides hold a route of each package.
	require.Contains(t, served, "POST /api/v1/topics/{}/messages", "core/httpapi")
	require.Contains(t, served, "DELETE /api/v1/retained/{}", "gateway/admin")

	var undocumented, unserved []string
	for _, r := range served {
		if !slices.Contains(documented, r) {
			undocumented = append(undocumented, r)
		}
	}
	for _, r := range documented {
		if !slices.Contains(served, r) {
			unserved = append(unserved, r)
		}
	}
	require.Empty(t, undocumented, "served, but docs/openapi.yaml does not document them")
	require.Empty(t, unserved, "docs/openapi.yaml documents them, but the node does not serve them")
}

// startEmbeddedForRoutes starts an embedded node with every part that adds
// HTTP routes, on loopback ports the kernel picks.
func startEmbeddedForRoutes(t *testing.T) *Node {
	t.Helper()
	n, err := New(t.Context(), Options{
		DataDir:  t.TempDir(),
		Store:    store.Options{FlushPolicy: store.FlushSync},
		Core:     &CoreOptions{Addr: "127.0.0.1:0"},
		Delay:    &delay.Options{},
		Trace:    &trace.Options{},
		Sessions: &session.Options{},
		Alarms:   &AlarmOptions{}, // GET /api/v1/alarms
		HTTPAddr: "127.0.0.1:0",
		MQTTAddr: "127.0.0.1:0",
	}, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, n.Shutdown(ctx))
	})
	require.NotNil(t, n.httpMux)
	return n
}

// servedAPIRoutes lists the node's endpoints under /api/ as normalized
// "METHOD /path" patterns, sorted, each once.
func servedAPIRoutes(t *testing.T, n *Node) []string {
	t.Helper()
	var routes []string
	for _, p := range n.httpMux.patterns {
		method, path, ok := strings.Cut(p, " ")
		if !ok {
			method, path = "", p
		}
		if !strings.HasPrefix(path, "/api/") {
			continue // not the HTTP API (see TestOpenAPIMatchesRoutes)
		}
		switch {
		case method != "":
			routes = append(routes, p)
		case path == "/api/":
			routes = append(routes, httpapi.Routes()...)
		case slices.Contains(admin.Patterns(), path):
			for _, r := range admin.Routes() {
				if _, rp, _ := strings.Cut(r, " "); rp == path {
					routes = append(routes, r)
				}
			}
		default:
			t.Errorf("%s is registered without a method and is no core/httpapi or gateway/admin path: register it with its method", p)
		}
	}
	return normalizeRoutes(routes)
}

// documentedRoutes lists the operations of an OpenAPI file's paths as
// normalized "METHOD /path" patterns, sorted, each once.
func documentedRoutes(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]yaml.Node `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(b, &doc))
	require.NotEmpty(t, doc.Paths, "%s has paths", file)
	methods := []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete,
		http.MethodOptions, http.MethodHead, http.MethodPatch, http.MethodTrace}
	var routes []string
	for path, item := range doc.Paths {
		for key := range item {
			if m := strings.ToUpper(key); slices.Contains(methods, m) {
				routes = append(routes, m+" "+path)
			}
		}
	}
	return normalizeRoutes(routes)
}

// pathParam is a path parameter of a ServeMux pattern ({id}, {topic...})
// or an OpenAPI path ({id}).
var pathParam = regexp.MustCompile(`\{[^}]*\}`)

func normalizeRoutes(routes []string) []string {
	out := make([]string, 0, len(routes))
	for _, r := range routes {
		out = append(out, pathParam.ReplaceAllString(r, "{}"))
	}
	slices.Sort(out)
	return slices.Compact(out)
}
