package httpapi

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// stored reads back a message by the ID an answer gave.
func (e *env) stored(t testing.TB, id string) *core.StoredMessage {
	t.Helper()
	mid, err := core.ParseMessageID(id)
	require.NoError(t, err)
	m, err := e.st.Get(t.Context(), mid)
	require.NoError(t, err)
	return m
}

func TestProduceJSON(t *testing.T) {
	e := newEnv(t, envConfig{})
	before := time.Now()
	b := e.postJSON(t, "/api/v1/topics/orders/messages", `{
		"key": "dev-1", "tag": "created", "keys": ["order-7", "cust-3"],
		"properties": {"content-type": "text/plain", "trace": "abc"},
		"body": "héllo <&>", "deliver_at": "2030-01-02T03:04:05Z"
	}`, http.StatusCreated)
	res := decode[sendResultJSON](t, b)
	require.Equal(t, "orders", res.Topic)
	require.Equal(t, core.QueueFor("dev-1", 8), res.Queue, "the key picks the queue")
	require.Equal(t, int64(0), res.QueueOffset)
	require.False(t, res.StoredAt.Before(before.Add(-time.Second)))

	m := e.stored(t, res.ID)
	require.Equal(t, "orders", m.Topic)
	require.Equal(t, "dev-1", m.ShardingKey)
	require.Equal(t, "created", m.Tag)
	require.Equal(t, []string{"order-7", "cust-3"}, m.Keys)
	require.Equal(t, map[string]string{"content-type": "text/plain", "trace": "abc"}, m.Properties)
	require.Equal(t, "héllo <&>", string(m.Body))
	require.True(t, m.DeliverAt.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)))

	t.Run("body_base64", func(t *testing.T) {
		b := e.postJSON(t, "/api/v1/topics/orders/messages", `{"body_base64": "AP8Q"}`, http.StatusCreated)
		require.Equal(t, []byte{0x00, 0xff, 0x10}, e.stored(t, decode[sendResultJSON](t, b).ID).Body)
	})
	t.Run("no body", func(t *testing.T) {
		b := e.postJSON(t, "/api/v1/topics/orders/messages", `{"tag":"ping"}`, http.StatusCreated)
		require.Empty(t, e.stored(t, decode[sendResultJSON](t, b).ID).Body)
	})
	t.Run("charset parameter", func(t *testing.T) {
		resp, b := e.do(t, req{method: http.MethodPost, path: "/api/v1/topics/orders/messages",
			contentType: "application/json; charset=utf-8", body: strings.NewReader(`{"body":"x"}`)})
		require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", b)
		require.Equal(t, "x", string(e.stored(t, decode[sendResultJSON](t, b).ID).Body))
	})
}

func TestProduceRaw(t *testing.T) {
	e := newEnv(t, envConfig{})
	body := []byte{0xde, 0xad, 0xbe, 0xef, 0x00, 0xff}
	resp, b := e.do(t, req{
		method: http.MethodPost, path: "/api/v1/topics/telemetry/messages",
		contentType: "application/octet-stream",
		header: http.Header{
			"X-Ferrymq-Key":          {"dev-9"},
			"X-Ferrymq-Tag":          {"temp"},
			"X-Ferrymq-Keys":         {"a, b", "c"},
			"X-Ferrymq-Deliver-At":   {"2030-01-02T03:04:05.5+01:00"},
			"X-Ferrymq-Prop-Unit":    {"celsius"},
			"X-Ferrymq-Prop-Site-Id": {"plant 4"},
		},
		body: bytes.NewReader(body),
	})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", b)
	res := decode[sendResultJSON](t, b)
	require.Equal(t, core.QueueFor("dev-9", 8), res.Queue)

	m := e.stored(t, res.ID)
	require.Equal(t, body, m.Body)
	require.Equal(t, "dev-9", m.ShardingKey)
	require.Equal(t, "temp", m.Tag)
	require.Equal(t, []string{"a", "b", "c"}, m.Keys)
	require.Equal(t, map[string]string{"unit": "celsius", "site-id": "plant 4"}, m.Properties, "names lower-cased")
	require.True(t, m.DeliverAt.Equal(time.Date(2030, 1, 2, 2, 4, 5, 5e8, time.UTC)))

	t.Run("no content type", func(t *testing.T) {
		resp, b := e.do(t, req{method: http.MethodPost, path: "/api/v1/topics/telemetry/messages", body: strings.NewReader(`{"body":"x"}`)})
		require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", b)
		require.Equal(t, `{"body":"x"}`, string(e.stored(t, decode[sendResultJSON](t, b).ID).Body), "not JSON: stored as it is")
	})
}

func TestProduceBatch(t *testing.T) {
	e := newEnv(t, envConfig{})
	b := e.postJSON(t, "/api/v1/topics/batch/messages", `[
		{"key": "k", "body": "one"},
		{"key": "k", "body": "two"},
		{"key": "k", "body_base64": "dGhyZWU="}
	]`, http.StatusCreated)
	res := decode[[]sendResultJSON](t, b)
	require.Len(t, res, 3)
	for i, r := range res {
		require.Equal(t, core.QueueFor("k", 8), r.Queue)
		require.Equal(t, int64(i), r.QueueOffset, "stored in order")
		require.Equal(t, []string{"one", "two", "three"}[i], string(e.stored(t, r.ID).Body))
	}

	t.Run("one bad message stores none", func(t *testing.T) {
		b := e.postJSON(t, "/api/v1/topics/batch/messages", `[{"body":"ok"},{"properties":{"":"x"}}]`, http.StatusBadRequest)
		got := decode[errorJSON](t, b)
		require.Equal(t, CodeInvalidMessage, got.Code)
		require.Contains(t, got.Error, "message 1")
		info, err := e.st.Topic(t.Context(), "batch")
		require.NoError(t, err)
		var n int64
		for _, r := range info.Ranges {
			n += r.Max
		}
		require.Equal(t, int64(3), n)
	})
}

// TestBodyTooLarge: a request body one byte over the default limit, raw or
// JSON, announced or chunked, gets 413 body_too_large naming the limit;
// the server goes on.
func TestBodyTooLarge(t *testing.T) {
	e := newEnv(t, envConfig{})
	big := bytes.Repeat([]byte{'x'}, DefaultMaxBodyBytes+1)
	for _, tc := range []struct {
		name string
		body func() io.Reader
	}{
		{"content length", func() io.Reader { return bytes.NewReader(big) }},
		// An io.Reader of unknown length is sent chunked: the limit is
		// hit while reading.
		{"chunked", func() io.Reader { return struct{ io.Reader }{bytes.NewReader(big)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, ct := range []string{"application/octet-stream", "application/json"} {
				resp, b := e.do(t, req{method: http.MethodPost, path: "/api/v1/topics/big/messages", contentType: ct, body: tc.body()})
				require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
				require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
				require.Equal(t, errorJSON{Code: CodeBodyTooLarge, Error: "request body larger than 8388608 bytes"}, decode[errorJSON](t, b))

				// The server is unharmed.
				b = e.postJSON(t, "/api/v1/topics/big/messages", `{"body":"small"}`, http.StatusCreated)
				require.Equal(t, "small", string(e.stored(t, decode[sendResultJSON](t, b).ID).Body))
			}
		})
	}
}
