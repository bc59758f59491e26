package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/core/pop"
)

// Query parameters of a pop.
const (
	paramGroup     = "group"
	paramMax       = "max"
	paramWait      = "wait"
	paramInvisible = "invisible"
	paramOrderly   = "orderly"
	paramTags      = "tags"
)

// poppedMessage is one message a pop hands out.
type poppedMessage struct {
	ID          core.MessageID    `json:"id"`
	Handle      string            `json:"handle"`
	Attempt     int               `json:"attempt"`
	VisibleAt   time.Time         `json:"visible_at"`
	Topic       string            `json:"topic"`
	Queue       int               `json:"queue"`
	QueueOffset int64             `json:"queue_offset"`
	Key         string            `json:"key,omitempty"`
	Tag         string            `json:"tag,omitempty"`
	Keys        []string          `json:"keys,omitempty"`
	Properties  map[string]string `json:"properties,omitempty"`
	Body        *string           `json:"body,omitempty"` // set, maybe to "", when the body is valid UTF-8
	BodyBase64  string            `json:"body_base64,omitempty"`
	DeliverAt   time.Time         `json:"deliver_at,omitzero"`
	BornAt      time.Time         `json:"born_at,omitzero"`
	StoredAt    time.Time         `json:"stored_at"`
	Reconsume   int               `json:"reconsume"`
}

func toPopped(p pop.Popped) poppedMessage {
	m := p.Message
	out := poppedMessage{
		ID:          m.ID,
		Handle:      p.Handle,
		Attempt:     p.Attempt,
		VisibleAt:   p.VisibleAt.UTC(),
		Topic:       m.Topic,
		Queue:       m.Queue,
		QueueOffset: m.QueueOffset,
		Key:         m.ShardingKey,
		Tag:         m.Tag,
		Keys:        m.Keys,
		Properties:  m.Properties,
		DeliverAt:   m.DeliverAt.UTC(), // a zero time stays zero (omitted)
		BornAt:      m.BornAt.UTC(),
		StoredAt:    m.StoredAt.UTC(),
		Reconsume:   m.ReconsumeCount,
	}
	out.Body, out.BodyBase64 = bodyJSON(m.Body)
	return out
}

// bodyJSON is a body as the API shows it: text when it is valid UTF-8
// (maybe ""), else base64.
func bodyJSON(b []byte) (text *string, b64 string) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, ""
	}
	return nil, base64.StdEncoding.EncodeToString(b)
}

var errConsumeDisabled = httperr.New(http.StatusNotImplemented, CodeConsumeDisabled, "consuming is not enabled on this server")

// popMessages serves GET /api/v1/topics/{topic}/messages: a POP.
func (a *api) popMessages(w http.ResponseWriter, r *http.Request) error {
	if r.Method == http.MethodHead {
		// The GET pattern also matches HEAD, which would hand out
		// messages nobody receives.
		return errMethod(w, r, "GET, POST")
	}
	topic := r.PathValue("topic")
	if err := core.ValidateTopic(topic); err != nil {
		return err
	}
	req, err := a.popRequest(topic, r.URL.RawQuery)
	if err != nil {
		return err
	}
	if err := a.elsewhere(w, req.Group); err != nil {
		return err
	}
	if a.pop == nil {
		return errConsumeDisabled
	}
	got, err := a.pop.Pop(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	a.writeMessages(w, r, got)
	return nil
}

// popRequest parses the query of a pop. Every parameter may appear at most
// once; unknown ones are refused.
func (a *api) popRequest(topic, rawQuery string) (pop.Request, error) {
	req := pop.Request{Topic: topic}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return req, httperr.BadRequest("query: %v", err)
	}
	for _, name := range slices.Sorted(maps.Keys(q)) { // sorted: the same request, the same error
		vals := q[name]
		switch name {
		case paramGroup, paramMax, paramWait, paramInvisible, paramOrderly, paramTags:
		default:
			return req, httperr.BadRequest("unknown query parameter %q", name)
		}
		if len(vals) != 1 {
			return req, httperr.BadRequest("query parameter %s given %d times, want once", name, len(vals))
		}
	}
	req.Group = q.Get(paramGroup) // validated by Pop
	if v := q.Get(paramMax); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > pop.MaxPopLimit {
			return req, httperr.BadRequest("max %q: want an integer from 1 to %d", v, pop.MaxPopLimit)
		}
		req.Max = n
	}
	if v := q.Get(paramWait); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return req, httperr.BadRequest("wait %q: want a duration such as 5s", v)
		}
		req.Wait = min(d, a.opts.MaxWait)
	}
	if v := q.Get(paramInvisible); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return req, httperr.BadRequest("invisible %q: want a duration such as 60s", v)
		}
		if d <= 0 {
			return req, httperr.New(http.StatusBadRequest, CodeInvisibleTime, "invisible %v: must be positive", d)
		}
		req.Invisible = d // bounds checked by Pop
	}
	if v := q.Get(paramOrderly); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return req, httperr.BadRequest("orderly %q: want true or false", v)
		}
		req.Orderly = b
	}
	if v := q.Get(paramTags); v != "" {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				req.Tags = append(req.Tags, t)
			}
		}
	}
	return req, nil
}

// writeMessages answers {"messages":[…]} one message at a time, so a large
// answer is never held twice in memory. The messages were handed out: if
// the client is gone they come back after their invisible time.
func (a *api) writeMessages(w http.ResponseWriter, r *http.Request, got []pop.Popped) {
	setJSONHeaders(w)
	w.WriteHeader(http.StatusOK)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	buf.WriteString(`{"messages":[`)
	for i, p := range got {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := enc.Encode(toPopped(p)); err != nil {
			// Cannot happen for these types; the status is already sent.
			a.log.Error().Err(err).Str(fieldRoute, r.Pattern).Msg("encode message")
			return
		}
		buf.Truncate(buf.Len() - 1) // Encode's newline
		if _, err := w.Write(buf.Bytes()); err != nil {
			a.writeFailed(r, err)
			return
		}
		buf.Reset()
	}
	buf.WriteString("]}\n")
	if _, err := w.Write(buf.Bytes()); err != nil {
		a.writeFailed(r, err)
	}
}

// ackRequest is the body of an ack: one handle or a list.
type ackRequest struct {
	Handle  *string  `json:"handle"`
	Handles []string `json:"handles"`
}

var ackFields = httperr.Fields[ackRequest]()

// ackResult is the outcome of one handle.
type ackResult struct {
	Handle string `json:"handle"`
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
	Code   string `json:"code,omitempty"`
}

// ack serves POST /api/v1/topics/{topic}/ack. The topic in the path must be
// a valid name but is not compared with the handles: a handle names its own
// message, which after a redelivery lives in the group's retry topic.
func (a *api) ack(w http.ResponseWriter, r *http.Request) error {
	var req ackRequest
	if err := a.handleBody(w, r, &req, ackFields); err != nil {
		return err
	}
	handles := req.Handles
	switch {
	case req.Handle != nil && req.Handles != nil:
		return httperr.BadRequest("give handle or handles, not both")
	case req.Handle != nil:
		handles = []string{*req.Handle}
	case len(handles) == 0:
		return httperr.BadRequest("no handles: want {\"handles\":[…]} or {\"handle\":…}")
	case len(handles) > a.opts.MaxBatch:
		return httperr.New(http.StatusRequestEntityTooLarge, CodeBatchTooLarge, "more than %d handles", a.opts.MaxBatch)
	}
	if err := a.handlesHere(w, handles...); err != nil {
		return err
	}
	out := struct {
		Results []ackResult `json:"results"`
	}{Results: make([]ackResult, len(handles))}
	failed := 0
	for i, h := range handles {
		out.Results[i] = ackResult{Handle: h, OK: true}
		if err := a.pop.Ack(r.Context(), h); err != nil {
			e := classify(r.Context(), err)
			out.Results[i] = ackResult{Handle: h, Error: e.Msg, Code: e.Code}
			failed++
		}
	}
	if failed > 0 {
		a.log.Debug().Str(fieldMethod, r.Method).Str(fieldRoute, r.Pattern).Str(fieldRemote, r.RemoteAddr).
			Int(fieldCount, len(handles)).Int(fieldFailed, failed).Msg("acks failed")
	}
	a.writeJSON(w, r, http.StatusOK, out)
	return nil
}

// invisibleRequest is the body of a change of invisible time.
type invisibleRequest struct {
	Handle    string `json:"handle"`
	Invisible string `json:"invisible"`
}

var invisibleFields = httperr.Fields[invisibleRequest]()

// changeInvisible serves POST /api/v1/topics/{topic}/invisible. As for ack,
// the path's topic is not compared with the handle.
func (a *api) changeInvisible(w http.ResponseWriter, r *http.Request) error {
	var req invisibleRequest
	if err := a.handleBody(w, r, &req, invisibleFields); err != nil {
		return err
	}
	if req.Invisible == "" {
		return httperr.BadRequest("invisible missing: want a duration such as 30s")
	}
	d, err := time.ParseDuration(req.Invisible)
	if err != nil {
		return httperr.BadRequest("invisible %q: want a duration such as 30s", req.Invisible)
	}
	if err := a.handlesHere(w, req.Handle); err != nil {
		return err
	}
	h, err := a.pop.ChangeInvisibleTime(r.Context(), req.Handle, d)
	if err != nil {
		return err
	}
	a.writeJSON(w, r, http.StatusOK, struct {
		Handle string `json:"handle"`
	}{h})
	return nil
}

// handlesHere checks, with Options.Elsewhere, that the groups of handles
// are served here (a handle that does not decode is answered by Pop);
// then that consumption is enabled.
func (a *api) handlesHere(w http.ResponseWriter, handles ...string) error {
	seen := map[string]bool{}
	for _, h := range handles {
		g, err := pop.GroupOf(h)
		if err != nil || seen[g] {
			continue
		}
		seen[g] = true
		if err := a.elsewhere(w, g); err != nil {
			return err
		}
	}
	if a.pop == nil {
		return errConsumeDisabled
	}
	return nil
}

// handleBody is the common start of the handle endpoints (ack, invisible):
// consumption enabled, a valid topic in the path, a JSON object body
// decoded strictly into v.
func (a *api) handleBody(w http.ResponseWriter, r *http.Request, v any, fields []string) error {
	if a.pop == nil && a.opts.Elsewhere == nil {
		return errConsumeDisabled
	}
	if err := core.ValidateTopic(r.PathValue("topic")); err != nil {
		return err
	}
	body, err := a.readBody(w, r)
	if err != nil {
		return err
	}
	return decodeObject(body, v, fields)
}
