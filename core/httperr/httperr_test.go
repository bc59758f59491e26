package httperr

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var errSecret = errors.New("open /var/lib/ferrymq/segment: input/output error")

func TestClassify(t *testing.T) {
	errNotFound := errors.New("topic not found")
	errBroken := errors.New("store broken")
	sentinels := []Sentinel{
		{Err: errNotFound, Status: http.StatusNotFound, Code: "topic_not_found"},
		{Err: errBroken, Status: http.StatusServiceUnavailable, Code: "store_failed", Msg: "store failed"},
	}
	ctx := context.Background()
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		err    error
		status int
		code   string
		msg    string
	}{
		{"as it is", ctx, New(http.StatusConflict, "x", "line one\nline two"), http.StatusConflict, "x", "line one; line two"},
		{"4xx sentinel keeps the text", ctx, errors.Join(errNotFound, errors.New("t1")), http.StatusNotFound, "topic_not_found", "topic not found; t1"},
		{"5xx sentinel hides the text", ctx, errors.Join(errBroken, errSecret), http.StatusServiceUnavailable, "store_failed", "store failed"},
		{"oversized body", ctx, &http.MaxBytesError{Limit: 10}, http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "request body larger than 10 bytes"},
		{"canceled request", canceled, context.Canceled, http.StatusServiceUnavailable, CodeCanceled, "request canceled"},
		{"a cancel not of this request", ctx, context.Canceled, http.StatusInternalServerError, CodeInternal, "internal error"},
		{"anything else", ctx, errSecret, http.StatusInternalServerError, CodeInternal, "internal error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := Classify(tc.ctx, tc.err, sentinels)
			require.Equal(t, tc.status, e.Status)
			require.Equal(t, tc.code, e.Code)
			require.Equal(t, tc.msg, e.Msg)
			if e.Status >= 500 {
				require.NotContains(t, e.Msg, "/var/lib")
				require.Error(t, e.LogErr())
			}
		})
	}
}

type body struct {
	Key  string   `json:"key"`
	Keys []string `json:"keys,omitempty"`
	N    int      `json:"n"`
}

func TestDecodeObject(t *testing.T) {
	fields := Fields[body]()
	require.Equal(t, []string{"key", "keys", "n"}, fields)
	var b body
	require.NoError(t, DecodeObject([]byte(` {"key":"k","keys":["a"],"n":3} `), "", &b, fields))
	require.Equal(t, body{Key: "k", Keys: []string{"a"}, N: 3}, b)
	for _, tc := range []struct{ in, msg, log string }{
		{`[1]`, "bad JSON: want an object", ""},
		{``, "bad JSON: want an object", ""},
		{`{"key":"k","KEY":"x"}`, `bad JSON: unknown field "KEY"`, "bad JSON: unknown field"},
		{`{"key":"k","key":"x"}`, `bad JSON: field "key" given twice`, "bad JSON: field given twice"},
		{`{"key":1}`, "bad JSON: key: want a string, got JSON number", "bad JSON: wrong JSON type for a field"},
		{`{"n":"3"}`, "bad JSON: n: want a number, got JSON string", "bad JSON: wrong JSON type for a field"},
		{`{"keys":{}}`, "bad JSON: keys: want an array, got JSON object", "bad JSON: wrong JSON type for a field"},
		{`{"key":"k"} {}`, "bad JSON: data after the top-level value", ""},
		{`{"key":"k"`, "bad JSON: unexpected end of JSON", "bad JSON: unexpected end of JSON"},
		{`{"key":"k",}`, "bad JSON: invalid character '}' looking for beginning of object key string (at byte 11)", "bad JSON: syntax error at byte 11"},
	} {
		err := DecodeObject([]byte(tc.in), "", &body{}, fields)
		var e *Error
		require.ErrorAs(t, err, &e, tc.in)
		require.Equal(t, http.StatusBadRequest, e.Status, tc.in)
		require.Equal(t, CodeBadJSON, e.Code, tc.in)
		require.Equal(t, tc.msg, e.Msg, tc.in)
		if tc.log != "" {
			require.Equal(t, tc.log, e.LogErr().Error(), tc.in)
		}
	}
	err := DecodeObject([]byte(`{"secret-name":1}`), "messages[2]: ", &body{}, fields)
	require.EqualError(t, err, `bad JSON: messages[2]: unknown field "secret-name"`)
	require.NotContains(t, err.(*Error).LogErr().Error(), "secret", "the log never quotes the body")
}

// DecodeObject never panics, and what it accepts is an object with only
// known fields, each once.
func FuzzDecodeObject(f *testing.F) {
	for _, s := range []string{`{"key":"k","n":1}`, `{"key":"k","key":"k"}`, `{"Key":"k"}`, `[]`, `{"keys":["a",1]}`, `{"n":1e400}`, "{\"key\":\"\\ud800\"}", `{} x`} {
		f.Add([]byte(s))
	}
	fields := Fields[body]()
	f.Fuzz(func(t *testing.T, in []byte) {
		var b body
		err := DecodeObject(in, "at: ", &b, fields)
		if err == nil {
			return
		}
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeBadJSON || !strings.HasPrefix(e.Msg, "bad JSON: at: ") {
			t.Fatalf("%q: %v", in, err)
		}
		if strings.ContainsAny(e.Msg, "\r\n") {
			t.Fatalf("%q: message of more than one line: %q", in, e.Msg)
		}
	})
}
