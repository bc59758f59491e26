package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// `serve` mounts the admin API beside the HTTP API, behind the token; the
// node endpoint shows the configuration without secrets.
func TestServeAdminAPIBehindToken(t *testing.T) {
	addrs := serveAddrs(t, "core: {token: s3cret-token}\ntrace: {topics: [tel]}\n")
	call := func(method, path, token string) (int, []byte) {
		req, err := http.NewRequestWithContext(t.Context(), method, "http://"+addrs["http"]+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, b
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/node"}, {http.MethodGet, "/api/v1/topics"}, {http.MethodDelete, "/api/v1/clients/car-1"},
		{http.MethodPost, "/api/v1/groups/g/reset"}, {http.MethodGet, "/api/v1/messages?client=car-1"},
	} {
		code, _ := call(c.method, c.path, "")
		require.Equal(t, http.StatusUnauthorized, code, "%s %s without the token", c.method, c.path)
		code, _ = call(c.method, c.path, "wrong")
		require.Equal(t, http.StatusUnauthorized, code, "%s %s with a wrong token", c.method, c.path)
	}
	code, body := call(http.MethodGet, "/api/v1/node", "s3cret-token")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, string(body), "s3cret", "no secret in the node info")
	var node struct {
		Engine string         `json:"engine"`
		Config map[string]any `json:"config"`
	}
	require.NoError(t, json.Unmarshal(body, &node))
	require.Equal(t, "embedded", node.Engine)
	require.Equal(t, true, node.Config["token_set"])
	require.Equal(t, []any{"tel"}, node.Config["traced_topics"])
	code, body = call(http.MethodGet, "/api/v1/clients/nobody", "s3cret-token")
	require.Equal(t, http.StatusNotFound, code, "%s", body)
	// The dashboard and /stats stay open, like /metrics, and show no secret.
	code, body = call(http.MethodGet, "/", "")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.Contains(string(body), "<html"))
	code, body = call(http.MethodGet, "/stats", "")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, string(body), "s3cret")
}
