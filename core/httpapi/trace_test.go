package httpapi

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
)

func TestTraceProduce(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	rec, err := trace.New(st, trace.Options{Topics: []string{"orders"}})
	require.NoError(t, err)
	rec.Start()
	t.Cleanup(func() { _ = rec.Close() })
	svc, err := delay.New(st, filepath.Join(dir, "delay"), delay.Options{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	svc.Start()
	t.Cleanup(func() { require.NoError(t, svc.Close()) })
	h, err := New(Options{Broker: svc.Broker(), Delay: svc, Trace: rec})
	require.NoError(t, err)
	e := &env{st: st, srv: httptest.NewServer(h)}
	t.Cleanup(e.srv.Close)

	resp, b := e.do(t, req{method: http.MethodPost, path: "/api/v1/topics/orders/messages", contentType: "text/plain",
		header: http.Header{"X-Ferrymq-Key": {"k"}}, body: strings.NewReader("raw")})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", b)
	raw := decode[sendResultJSON](t, b)
	batch := decode[[]sendResultJSON](t, e.postJSON(t, "/api/v1/topics/orders/messages",
		`[{"body": "now"}, {"body": "later", "delay": "1h"}]`, http.StatusCreated))
	plain := decode[sendResultJSON](t, e.postJSON(t, "/api/v1/topics/other/messages", `{"body": "p"}`, http.StatusCreated))
	e.srv.Close()
	require.NoError(t, rec.Close()) // writes everything

	lookup := func(id string) []trace.Event {
		mid, err := core.ParseMessageID(id)
		require.NoError(t, err)
		evs, err := trace.Lookup(t.Context(), st, mid, 0)
		require.NoError(t, err)
		return evs
	}
	for _, r := range []sendResultJSON{raw, batch[0]} {
		evs := lookup(r.ID)
		require.Len(t, evs, 2, r.ID)
		require.Equal(t, trace.HopProduce, evs[0].Hop)
		require.Equal(t, "http", evs[0].Actor)
		require.True(t, strings.HasPrefix(evs[0].Attrs["remote"], "127.0.0.1:"), evs[0].Attrs["remote"])
		s := evs[1]
		require.Equal(t, trace.HopStored, s.Hop)
		require.True(t, s.At.Equal(r.StoredAt))
		require.Equal(t, map[string]string{"topic": "orders", "queue": strconv.Itoa(r.Queue), "offset": strconv.FormatInt(r.QueueOffset, 10),
			"stored_at": r.StoredAt.UTC().Format(time.RFC3339Nano)}, s.Attrs)
	}
	evs := lookup(batch[1].ID)
	require.Len(t, evs, 2)
	require.Equal(t, trace.HopProduce, evs[0].Hop)
	require.Equal(t, trace.HopDelayed, evs[1].Hop)
	require.Equal(t, "orders", evs[1].Attrs["topic"])
	due, err := time.Parse(time.RFC3339Nano, evs[1].Attrs["due"])
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(time.Hour), due, time.Minute)

	require.Empty(t, lookup(plain.ID), "an untraced topic records nothing")
}
