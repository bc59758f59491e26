package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// Issue #21: a 4 MiB message body (core.MaxBodyBytes) through the HTTP API
// with the default limits, and clear errors past them.

// bigBody is n bytes of a pattern that is not valid UTF-8 (so it comes
// back as body_base64), seeded by seed.
func bigBody(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 0x80 + seed + byte(i%101)
	}
	return b
}

// TestFourMiBOverHTTP: with the default options a 4 MiB body is produced
// raw and as JSON body_base64 (5.3 MiB of request), and read back whole
// from a pop, from GET /api/v1/messages/{id} and from a query by key.
func TestFourMiBOverHTTP(t *testing.T) {
	e := newEnv(t, envConfig{})
	raw := bigBody(core.MaxBodyBytes, 1)
	resp, b := e.do(t, req{method: http.MethodPost, path: "/api/v1/topics/firmware/messages", contentType: "application/octet-stream",
		header: http.Header{"X-Ferrymq-Key": {"car-1"}, "X-Ferrymq-Keys": {"fw-1"}, "X-Ferrymq-Prop-Version": {"1.2.1"}},
		body:   bytes.NewReader(raw)})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "raw produce: %s", b)
	id1 := decode[sendResultJSON](t, b).ID

	viaJSON := bigBody(core.MaxBodyBytes, 2)
	obj, err := json.Marshal(map[string]any{"key": "car-2", "keys": []string{"fw-2"}, "properties": map[string]string{"version": "1.2.2"},
		"body_base64": base64.StdEncoding.EncodeToString(viaJSON)})
	require.NoError(t, err)
	require.Greater(t, len(obj), 5<<20, "a 4 MiB body in base64 is over 5 MiB of JSON")
	id2 := decode[sendResultJSON](t, e.postJSON(t, "/api/v1/topics/firmware/messages", string(obj), http.StatusCreated)).ID

	want := map[string][]byte{id1: raw, id2: viaJSON}
	for id, body := range want {
		m := decode[storedMessage](t, e.get(t, "/api/v1/messages/"+id, http.StatusOK))
		require.Nil(t, m.Body)
		got, err := base64.StdEncoding.DecodeString(m.BodyBase64)
		require.NoError(t, err)
		require.True(t, bytes.Equal(body, got), "GET %s: the body whole", id)
	}
	page := decode[messagePage](t, e.get(t, "/api/v1/messages?topic=firmware&key=fw-2", http.StatusOK))
	require.Len(t, page.Messages, 1)
	got, err := base64.StdEncoding.DecodeString(page.Messages[0].BodyBase64)
	require.NoError(t, err)
	require.True(t, bytes.Equal(viaJSON, got), "query by key: the body whole")

	popped := map[string]bool{}
	for range 2 {
		ms := e.popN(t, "firmware", "group=g&max=32", 1) // two 4 MiB messages exceed a pop's 4 MiB
		got, err := base64.StdEncoding.DecodeString(*ms[0].BodyBase64)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want[ms[0].ID], got), "pop: the body whole")
		require.Equal(t, "1.2."+strings.TrimPrefix(ms[0].Key, "car-"), ms[0].Properties["version"])
		popped[ms[0].ID] = true
		e.postJSON(t, "/api/v1/topics/firmware/ack", fmt.Sprintf(`{"handles":[%q]}`, ms[0].Handle), http.StatusOK)
	}
	require.Len(t, popped, 2)
}

// TestMessageOverTheStoreLimitOverHTTP: a raw body within the request
// limit whose message (a body of the store's limit, plus the record's
// header) is over store.max_message_bytes
// gets 413 message_too_large naming both sizes; the API serves the next
// request. (A request body over the limit: TestBodyTooLarge.)
func TestMessageOverTheStoreLimitOverHTTP(t *testing.T) {
	e := newEnv(t, envConfig{})
	resp, b := e.do(t, req{method: http.MethodPost, path: "/api/v1/topics/t/messages", contentType: "application/octet-stream",
		body: bytes.NewReader(make([]byte, core.DefaultMaxMessageBytes))})
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	ej := decode[errorJSON](t, b)
	require.Equal(t, CodeMessageTooLarge, ej.Code)
	require.Regexp(t, `^core: message too large: \d+ bytes stored, limit 4456448 \(store.max_message_bytes\)$`, ej.Error)
	e.postJSON(t, "/api/v1/topics/t/messages", `{"body":"after"}`, http.StatusCreated)
}
