package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/core/pop"
)

// Routes. The {topic} wildcard is one path segment, unescaped.
const (
	prefix        = "/api/v1/"
	pathMessages  = "/api/v1/topics/{topic}/messages"
	pathAck       = "/api/v1/topics/{topic}/ack"
	pathQuery     = "/api/v1/messages"
	pathMessage   = "/api/v1/messages/{id}"
	pathTrace     = "/api/v1/messages/{id}/trace"
	pathDelayed   = "/api/v1/delayed"
	pathDelayedID = "/api/v1/delayed/{id}"
	pathInvisible = "/api/v1/topics/{topic}/invisible"
)

// Log field names.
const (
	fieldMethod = "method"
	fieldRoute  = "route"
	fieldTopic  = "topic"
	fieldStatus = "status"
	fieldCode   = "code"
	fieldRemote = "remote"
	fieldFailed = "failed"
	fieldCount  = "count"
)

// api serves the endpoints. It holds no state of its own besides its
// configuration.
type api struct {
	b    core.Broker
	pop  *pop.Service // nil: consuming disabled
	log  zerolog.Logger
	opts Options
}

// New checks opts and returns the handler of the HTTP API: every path under
// /api/v1/. It starts no goroutines; it is safe for concurrent use.
func New(opts Options) (http.Handler, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	a := &api{
		b:    opts.Broker,
		pop:  opts.Pop,
		log:  opts.Logger.With().Str("component", "httpapi").Logger(),
		opts: opts,
	}
	mux := http.NewServeMux()
	// A pattern with a method is more specific than the same path without
	// one, so the method-less patterns catch only the wrong methods, and
	// the last catches every other path: every answer is JSON.
	var paths []string
	allow := map[string][]string{}
	for _, e := range a.endpoints() {
		if allow[e.path] == nil {
			paths = append(paths, e.path)
		}
		allow[e.path] = append(allow[e.path], e.method)
		mux.Handle(e.method+" "+e.path, a.serve(e.h))
	}
	for _, p := range paths {
		mux.Handle(p, a.notAllowed(strings.Join(allow[p], ", ")))
	}
	mux.Handle(prefix, a.serve(func(_ http.ResponseWriter, r *http.Request) error {
		return httperr.New(http.StatusNotFound, CodeNotFound, "no endpoint at %q", r.URL.Path)
	}))
	return mux, nil
}

// endpoint is one method on one path.
type endpoint struct {
	method, path string
	h            func(http.ResponseWriter, *http.Request) error
}

// endpoints are what New serves, a path's methods together and in the
// order of its Allow header.
func (a *api) endpoints() []endpoint {
	return []endpoint{
		{http.MethodGet, pathMessages, a.popMessages},
		{http.MethodPost, pathMessages, a.produce},
		{http.MethodPost, pathAck, a.ack},
		{http.MethodPost, pathInvisible, a.changeInvisible},
		{http.MethodGet, pathQuery, a.queryMessages},
		{http.MethodGet, pathMessage, a.getMessage},
		{http.MethodGet, pathTrace, a.traceMessage},
		{http.MethodGet, pathDelayed, a.listDelayed},
		{http.MethodGet, pathDelayedID, a.getDelayed},
		{http.MethodDelete, pathDelayedID, a.cancelDelayed},
	}
}

// Routes returns the endpoints the handler New returns serves, as patterns
// of Go's ServeMux with a method ("POST /api/v1/topics/{topic}/messages"),
// in registration order. docs/openapi.yaml documents each of them.
func Routes() []string {
	var out []string
	for _, e := range (&api{}).endpoints() {
		out = append(out, e.method+" "+e.path)
	}
	return out
}

// serve adapts a handler that returns its failure.
func (a *api) serve(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			a.fail(w, r, err)
		}
	})
}

// notAllowed answers 405 for a known path and a wrong method.
func (a *api) notAllowed(allow string) http.Handler {
	return a.serve(func(w http.ResponseWriter, r *http.Request) error {
		return errMethod(w, r, allow)
	})
}

func errMethod(w http.ResponseWriter, r *http.Request, allow string) error {
	w.Header().Set("Allow", allow)
	return httperr.New(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "method %s not allowed here; use %s", r.Method, allow)
}

// errorBody is every error response.
type errorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// fail answers err and logs one line: debug for the client's mistakes,
// error for the server's. The line never carries a message body, a header
// value or a handle.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := classify(r.Context(), err)
	ev := a.log.Debug()
	if e.Status >= 500 && e.Code != CodeCanceled {
		ev = a.log.Error()
	}
	ev.Str(fieldMethod, r.Method).Str(fieldRoute, r.Pattern).Str(fieldTopic, r.PathValue("topic")).
		Str(fieldRemote, r.RemoteAddr).Int(fieldStatus, e.Status).Str(fieldCode, e.Code).
		Err(e.LogErr()).Msg("request failed")
	if e.Code == CodeShuttingDown {
		w.Header().Set("Retry-After", retryAfter)
	}
	a.writeJSON(w, r, e.Status, errorBody{Error: e.Msg, Code: e.Code})
}

// writeJSON answers v. A failed write means the client went away: there is
// no one left to tell, so it is only logged.
func (a *api) writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only our own types are encoded; this is a bug.
		a.log.Error().Err(err).Str(fieldRoute, r.Pattern).Msg("encode response")
		status = http.StatusInternalServerError
		buf.Reset()
		fmt.Fprintf(&buf, `{"error":"internal error","code":%q}`+"\n", CodeInternal)
	}
	setJSONHeaders(w)
	w.WriteHeader(status)
	if _, err := w.Write(buf.Bytes()); err != nil {
		a.writeFailed(r, err)
	}
}

func setJSONHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
}

func (a *api) writeFailed(r *http.Request, err error) {
	a.log.Debug().Err(err).Str(fieldMethod, r.Method).Str(fieldRoute, r.Pattern).
		Str(fieldRemote, r.RemoteAddr).Msg("write response")
}

// readBody reads the whole request body, at most Options.MaxBodyBytes. A
// body announced as larger is refused unread, and the connection closed
// after the answer.
func (a *api) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	limit := a.opts.MaxBodyBytes
	if r.ContentLength > limit {
		w.Header().Set("Connection", "close")
		return nil, &http.MaxBytesError{Limit: limit}
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	// MaxBytesReader also has the server close the connection when the
	// limit is hit, so the rest of an oversized body is never read.
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit)); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, err
		}
		return nil, httperr.BadRequest("read request body: %v", err)
	}
	return buf.Bytes(), nil
}

// firstByte returns the first byte of b that is not JSON white space, or 0.
func firstByte(b []byte) byte {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
		default:
			return c
		}
	}
	return 0
}

// decodeObject decodes body, which must hold exactly one JSON object, into
// v; fields are the names v accepts.
func decodeObject(body []byte, v any, fields []string) error {
	dec := httperr.NewDecoder(body)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return httperr.JSON("", err)
	}
	if err := httperr.ExpectEnd(dec); err != nil {
		return err
	}
	return httperr.DecodeObject(raw, "", v, fields)
}
