package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core/httperr"
)

// Routes: path patterns of Go's ServeMux. A {wildcard} is one path segment,
// unescaped (percent-encode a '/' inside it as %2F); {topic...} is the rest
// of the path.
const (
	pathNode        = "/api/v1/node"
	pathTopics      = "/api/v1/topics"
	pathTopic       = "/api/v1/topics/{topic}"
	pathGroups      = "/api/v1/groups"
	pathGroup       = "/api/v1/groups/{group}"
	pathReset       = "/api/v1/groups/{group}/reset"
	pathDeadLetters = "/api/v1/groups/{group}/dead-letters"
	pathRedrive     = "/api/v1/groups/{group}/dead-letters/redrive"
	pathClients     = "/api/v1/clients"
	pathClient      = "/api/v1/clients/{id}"
	pathSession     = "/api/v1/sessions/{id}"
	pathRetained    = "/api/v1/retained"
	pathRetainedOne = "/api/v1/retained/{topic...}"
	pathDeviceRPC   = "/api/v1/devices/{id}/rpc"
)

// Patterns returns the path patterns (without a method) the handler New
// returns serves, for the caller's mux: register each of them with that
// handler, behind the same authentication as the rest of /api/. None of
// them matches a path of core/httpapi, and each is more specific than
// "/api/", so both can share one mux:
//
//	for _, p := range admin.Patterns() {
//		mux.Handle(p, requireToken(token, adminHandler))
//	}
//	mux.Handle("/api/", requireToken(token, httpapiHandler))
func Patterns() []string {
	var out []string
	for _, e := range (&api{}).endpoints() {
		if !slices.Contains(out, e.path) {
			out = append(out, e.path)
		}
	}
	return out
}

// Routes returns the endpoints the handler New returns serves, as patterns
// of Go's ServeMux with a method ("DELETE /api/v1/clients/{id}"), in
// registration order. docs/openapi.yaml documents each of them.
func Routes() []string {
	var out []string
	for _, e := range (&api{}).endpoints() {
		out = append(out, e.method+" "+e.path)
	}
	return out
}

// Log field names.
const (
	fieldMethod = "method"
	fieldRoute  = "route"
	fieldStatus = "status"
	fieldCode   = "code"
	fieldRemote = "remote"
	fieldTopic  = "topic"
	fieldGroup  = "group"
	fieldClient = "client"
	fieldCount  = "count"
)

// api serves the endpoints.
type api struct {
	opts   Options
	log    zerolog.Logger
	config json.RawMessage // Options.Config, marshalled
	engine *engine.Engine  // nil without a gateway
}

type handlerFunc func(http.ResponseWriter, *http.Request) error

// New checks opts and returns the handler of the admin API: the paths of
// Patterns, and a JSON 404 for any other. It starts no goroutines and is
// safe for concurrent use.
func New(opts Options) (http.Handler, error) {
	opts = opts.withDefaults()
	cfg, err := opts.validate()
	if err != nil {
		return nil, err
	}
	a := &api{opts: opts, log: opts.Logger.With().Str("component", "admin").Logger(), config: cfg}
	if opts.Gateway != nil {
		a.engine = opts.Gateway.Engine()
	}
	mux := http.NewServeMux()
	// A pattern with a method is more specific than the same path without
	// one, so the method-less pattern catches only the wrong methods.
	var paths []string
	allow := map[string][]string{}
	for _, e := range a.endpoints() {
		if allow[e.path] == nil {
			paths = append(paths, e.path)
		}
		allow[e.path] = append(allow[e.path], e.method)
		h := e.h
		if e.method != http.MethodGet {
			h = a.write(h)
		}
		mux.Handle(e.method+" "+e.path, a.serve(h))
	}
	for _, p := range paths {
		mux.Handle(p, a.notAllowed(strings.Join(allow[p], ", ")))
	}
	mux.Handle("/", a.serve(func(_ http.ResponseWriter, r *http.Request) error {
		return httperr.New(http.StatusNotFound, CodeNotFound, "no endpoint at %q", r.URL.Path)
	}))
	return mux, nil
}

// endpoint is one method on one path.
type endpoint struct {
	method, path string
	h            handlerFunc
}

// endpoints are what New serves, a path's methods together and in the
// order of its Allow header; every method but GET goes through write.
func (a *api) endpoints() []endpoint {
	return []endpoint{
		{http.MethodGet, pathNode, a.node},
		{http.MethodGet, pathTopics, a.listTopics},
		{http.MethodPost, pathTopics, a.createTopic},
		{http.MethodGet, pathTopic, a.getTopic},
		{http.MethodDelete, pathTopic, a.deleteTopic},
		{http.MethodPatch, pathTopic, a.resizeTopic},
		{http.MethodGet, pathGroups, a.listGroups},
		{http.MethodGet, pathGroup, a.getGroup},
		{http.MethodPost, pathReset, a.resetGroup},
		{http.MethodGet, pathDeadLetters, a.listDeadLetters},
		{http.MethodPost, pathRedrive, a.redrive},
		{http.MethodGet, pathClients, a.listClients},
		{http.MethodGet, pathClient, a.getClient},
		{http.MethodDelete, pathClient, a.kickClient},
		{http.MethodDelete, pathSession, a.deleteSession},
		{http.MethodGet, pathRetained, a.listRetained},
		{http.MethodGet, pathRetainedOne, a.getRetained},
		{http.MethodDelete, pathRetainedOne, a.clearRetained},
		{http.MethodPost, pathDeviceRPC, a.callDevice},
		{http.MethodGet, pathShadow, a.getShadow},
		{http.MethodPatch, pathShadow, a.updateShadow},
		{http.MethodDelete, pathShadow, a.deleteShadow},
	}
}

// serve adapts a handler that returns its failure.
func (a *api) serve(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			a.fail(w, r, err)
		}
	})
}

// notAllowed answers 405 for a known path and a wrong method.
func (a *api) notAllowed(allow string) http.Handler {
	return a.serve(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Allow", allow)
		return httperr.New(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "method %s not allowed here; use %s", r.Method, allow)
	})
}

// write guards a handler that changes something: it runs only with
// Options.AllowWrites or when Options.Authorize accepts the request.
func (a *api) write(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		switch {
		case a.opts.AllowWrites:
		case a.opts.Authorize == nil:
			return httperr.New(http.StatusForbidden, CodeWritesDisabled, "the admin API is read-only on this server")
		case !a.opts.Authorize(r):
			w.Header().Set("WWW-Authenticate", `Bearer realm="ferrymq"`)
			return httperr.New(http.StatusUnauthorized, CodeUnauthorized, "changes need a token: Authorization: Bearer <token>")
		}
		return h(w, r)
	}
}

// errorBody is every error response.
type errorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// fail answers err and logs one line: debug for the client's mistakes,
// error for the server's.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := classify(r.Context(), err)
	ev := a.log.Debug()
	if e.Status >= 500 && e.Status != http.StatusNotImplemented && e.Code != CodeCanceled {
		ev = a.log.Error()
	}
	ev.Str(fieldMethod, r.Method).Str(fieldRoute, r.Pattern).Str(fieldRemote, r.RemoteAddr).
		Int(fieldStatus, e.Status).Str(fieldCode, e.Code).Err(e.LogErr()).Msg("admin request failed")
	a.writeJSON(w, r, e.Status, errorBody{Error: e.Msg, Code: e.Code})
}

// audit logs a change that was made.
func (a *api) audit(r *http.Request) *zerolog.Event {
	return a.log.Info().Str(fieldMethod, r.Method).Str(fieldRoute, r.Pattern).Str(fieldRemote, r.RemoteAddr)
}

// writeJSON answers v. A failed write means the client went away; it is
// only logged.
func (a *api) writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		a.log.Error().Err(err).Str(fieldRoute, r.Pattern).Msg("encode response")
		status = http.StatusInternalServerError
		buf.Reset()
		fmt.Fprintf(&buf, `{"error":"internal error","code":%q}`+"\n", CodeInternal)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if _, err := w.Write(buf.Bytes()); err != nil {
		a.log.Debug().Err(err).Str(fieldMethod, r.Method).Str(fieldRoute, r.Pattern).
			Str(fieldRemote, r.RemoteAddr).Msg("write response")
	}
}

// queryParams parses the query, refusing unknown and repeated parameters.
func queryParams(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, httperr.BadRequest("query: %v", err)
	}
	names := make([]string, 0, len(q))
	for name := range q {
		names = append(names, name)
	}
	sort.Strings(names) // the same request, the same error
	for _, name := range names {
		if !slices.Contains(allowed, name) {
			return nil, httperr.BadRequest("unknown query parameter %q", name)
		}
		if len(q[name]) != 1 {
			return nil, httperr.BadRequest("query parameter %s given %d times, want once", name, len(q[name]))
		}
	}
	return q, nil
}

// pageParams reads max (default DefaultPage, cut to Options.MaxPage) and
// cursor.
func (a *api) pageParams(q url.Values) (int, string, error) {
	n := min(DefaultPage, a.opts.MaxPage)
	if v := q.Get("max"); v != "" {
		m, err := strconv.ParseInt(v, 10, 64)
		if (err != nil && !errors.Is(err, strconv.ErrRange)) || m < 1 {
			return 0, "", httperr.BadRequest("max %q: want a positive integer", v)
		}
		n = int(min(m, int64(a.opts.MaxPage))) // out of range: +Inf, cut
	}
	return n, q.Get("cursor"), nil
}

// pageOf returns the items whose key sorts after cursor, at most max of
// them, and the cursor of the next page ("" when this is the last). items
// are sorted by key, and keys are unique.
func pageOf[T any](items []T, key func(T) string, max int, cursor string) ([]T, string) {
	i := 0
	if cursor != "" {
		i = sort.Search(len(items), func(i int) bool { return key(items[i]) > cursor })
	}
	items = items[i:]
	if len(items) <= max {
		return items, ""
	}
	return items[:max], key(items[max-1])
}

// parseBool reads an optional boolean query parameter.
func parseBool(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, httperr.BadRequest("%s %q: want true or false", name, v)
	}
	return b, nil
}

// decodeBody decodes the request body, one JSON object, strictly into v: a
// field must be one of v's JSON names, spelled exactly, at most once. An
// empty body leaves v as it is when emptyOK.
func (a *api) decodeBody(w http.ResponseWriter, r *http.Request, v any, emptyOK bool) error {
	limit := a.opts.MaxBodyBytes
	if r.ContentLength > limit {
		w.Header().Set("Connection", "close")
		return &http.MaxBytesError{Limit: limit}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return err
		}
		return httperr.BadRequest("read request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if emptyOK {
			return nil
		}
		return httperr.BadJSON("empty body, want an object")
	}
	return httperr.DecodeObject(body, "", v, jsonNames(v))
}

// jsonNames lists the JSON names of the fields of the struct v points to.
func jsonNames(v any) []string {
	t := reflect.TypeOf(v).Elem()
	out := make([]string, t.NumField())
	for i := range out {
		out[i], _, _ = strings.Cut(t.Field(i).Tag.Get("json"), ",")
	}
	return out
}
