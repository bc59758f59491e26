package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/store"
)

// FuzzProduceJSON feeds arbitrary bytes as a JSON produce body. The handler
// must never panic, and must answer 201 with results or 400, 404 or 413
// with an error object. Limits are small so that every 413 is reachable.
func FuzzProduceJSON(f *testing.F) {
	for _, seed := range []string{
		`{"key":"k","tag":"t","keys":["a","b"],"properties":{"p":"v"},"body":"hello","deliver_at":"2030-01-02T03:04:05Z"}`,
		`[{"body":"one"},{"body_base64":"dHdv"},{}]`,
		`{"body_base64":"not base64!"}`,
		`{"body":"a","body_base64":"YQ=="}`,
		`{"properties":{"":"empty name"}}`,
		`{"unknown":1}`,
		`[{},null]`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
		`{"body":"\ud800 lone surrogate"}`,
		`{"key":1e999}`,
		` {} `,
		`{}x`,
		``,
		// One per 413: body, batch, properties, message.
		`{"body":"` + strings.Repeat("b", 5<<10) + `"}`,
		`[` + strings.Repeat(`{},`, 8) + `{}]`,
		`{"properties":{"p":"` + strings.Repeat("v", 300) + `"}}`,
		`{"body":"` + strings.Repeat("b", 2<<10) + `"}`,
	} {
		f.Add([]byte(seed))
	}
	st, err := store.Open(f.TempDir(), store.Options{
		MaxMessageBytes: 1 << 10, SegmentBytes: 1 << 20,
		MaxPropertiesBytes: 256, ConsumeQueueFileEntries: 4096, IndexSlots: 1024, IndexEntries: 4096,
		MaxDiskBytes: 16 << 20, RetentionInterval: time.Second, // long runs stay small
	})
	require.NoError(f, err)
	f.Cleanup(func() { _ = st.Close() })
	h, err := New(Options{Broker: st, MaxBodyBytes: 4 << 10, MaxBatch: 8})
	require.NoError(f, err)

	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/api/v1/topics/fuzz/messages", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)

		out := w.Body.Bytes()
		require.True(t, json.Valid(out), "answer not JSON: %q", out)
		switch w.Code {
		case http.StatusCreated:
			if bytes.HasPrefix(out, []byte("[")) {
				var res []sendResultJSON
				require.NoError(t, json.Unmarshal(out, &res))
				require.NotEmpty(t, res)
			} else {
				var res sendResultJSON
				require.NoError(t, json.Unmarshal(out, &res))
				require.Len(t, res.ID, 32)
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge:
			var e errorJSON
			require.NoError(t, json.Unmarshal(out, &e))
			require.NotEmpty(t, e.Code)
			require.NotEmpty(t, e.Error)
		default:
			t.Fatalf("status %d: %s", w.Code, out)
		}
	})
}
