package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// StatsOptions.Extra adds top-level sections to /stats, called per request
// with a bounded context; it cannot replace the metrics. Checks gate
// /readyz as StatsHandler's do.
func TestStatsExtraSections(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	deadlines := make(chan time.Time, 10) // one per call; zero if unbounded
	notReady := errors.New("core closed")
	var checkErr atomic.Pointer[error]
	srv := httptest.NewServer(env.Gateway.StatsHandlerWith(gateway.StatsOptions{
		Checks: []func() error{func() error {
			if p := checkErr.Load(); p != nil {
				return *p
			}
			return nil
		}},
		Extra: func(ctx context.Context) map[string]any {
			deadline, _ := ctx.Deadline()
			deadlines <- deadline
			return map[string]any{
				"topics":  []map[string]any{{"name": "telemetry", "queues": 8, "messages": 42}},
				"metrics": "must not replace the metrics",
			}
		},
	}))
	defer srv.Close()
	get := func(path string) (int, []byte) {
		res, err := srv.Client().Get(srv.URL + path)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, b
	}

	code, body := get("/stats")
	require.Equal(t, http.StatusOK, code)
	var doc struct {
		Time    time.Time      `json:"time"`
		Ready   bool           `json:"ready"`
		Metrics map[string]any `json:"metrics"`
		Topics  []struct {
			Name     string `json:"name"`
			Queues   int    `json:"queues"`
			Messages int64  `json:"messages"`
		} `json:"topics"`
	}
	require.NoError(t, json.Unmarshal(body, &doc), "%s", body)
	require.Len(t, deadlines, 1, "Extra is called once per request")
	require.WithinDuration(t, time.Now().Add(gateway.StatsExtraTimeout), <-deadlines, time.Second, "with a bounded context")
	require.True(t, doc.Ready)
	require.False(t, doc.Time.IsZero())
	require.Contains(t, doc.Metrics, "ferrymq_mqtt_connections")
	require.Len(t, doc.Topics, 1)
	require.Equal(t, "telemetry", doc.Topics[0].Name)
	require.Equal(t, int64(42), doc.Topics[0].Messages)

	code, _ = get("/readyz")
	require.Equal(t, http.StatusOK, code)
	checkErr.Store(&notReady)
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, string(body), notReady.Error())
	srv.Client().CloseIdleConnections()
}

// Without Extra, /stats is only time, ready and metrics.
func TestStatsWithoutExtra(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	srv := httptest.NewServer(env.Gateway.StatsHandler())
	defer srv.Close()
	res, err := srv.Client().Get(srv.URL + "/stats")
	require.NoError(t, err)
	defer res.Body.Close()
	var doc map[string]json.RawMessage
	require.NoError(t, json.NewDecoder(res.Body).Decode(&doc))
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	require.ElementsMatch(t, []string{"time", "ready", "metrics"}, keys)
	require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
}
