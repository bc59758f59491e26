package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/core/query"
	"github.com/ferrymq/ferrymq/core/trace"
)

// storedMessage is a message as the query endpoints show it.
type storedMessage struct {
	ID          core.MessageID    `json:"id"`
	Topic       string            `json:"topic"`
	Queue       int               `json:"queue"`
	QueueOffset int64             `json:"queue_offset"`
	Key         string            `json:"key,omitempty"`
	Tag         string            `json:"tag,omitempty"`
	Keys        []string          `json:"keys,omitempty"`
	Properties  map[string]string `json:"properties,omitempty"`
	Body        *string           `json:"body,omitempty"` // set, maybe to "", when the body is valid UTF-8
	BodyBase64  string            `json:"body_base64,omitempty"`
	Size        int               `json:"size"`
	DeliverAt   time.Time         `json:"deliver_at,omitzero"`
	BornAt      time.Time         `json:"born_at,omitzero"`
	StoredAt    time.Time         `json:"stored_at"`
	Reconsume   int               `json:"reconsume"`
}

func toStored(m *core.StoredMessage) storedMessage {
	out := storedMessage{ID: m.ID, Topic: m.Topic, Queue: m.Queue, QueueOffset: m.QueueOffset, Key: m.ShardingKey, Tag: m.Tag,
		Keys: m.Keys, Properties: m.Properties, Size: m.Size, DeliverAt: m.DeliverAt.UTC(), BornAt: m.BornAt.UTC(),
		StoredAt: m.StoredAt.UTC(), Reconsume: m.ReconsumeCount}
	out.Body, out.BodyBase64 = bodyJSON(m.Body)
	return out
}

// messagePage is one page of GET /api/v1/messages.
type messagePage struct {
	Messages []storedMessage `json:"messages"`
	// Next is the cursor of the next page; empty when there is none.
	Next string `json:"next,omitempty"`
}

// queryMessages serves GET /api/v1/messages?topic=&key=&client=&begin=&end=&max=&cursor=.
func (a *api) queryMessages(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	for name := range q {
		switch name {
		case "topic", "key", "client", "begin", "end", "max", "cursor":
			if len(q[name]) != 1 {
				return httperr.BadRequest("query parameter %s given %d times, want once", name, len(q[name]))
			}
		default:
			return httperr.BadRequest("unknown query parameter %q", name)
		}
	}
	req := query.Request{Topic: q.Get("topic"), Key: q.Get("key"), ClientID: q.Get("client"), Cursor: q.Get("cursor")}
	for _, p := range []struct {
		name string
		to   *time.Time
	}{{"begin", &req.Begin}, {"end", &req.End}} {
		if v := q.Get(p.name); v != "" {
			t, err := parseTime(v)
			if err != nil {
				return httperr.BadRequest("%s: %v", p.name, err)
			}
			*p.to = t
		}
	}
	if v := q.Get("max"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > query.MaxMax {
			return httperr.BadRequest("max: want 1 to %d", query.MaxMax)
		}
		req.Max = n
	}
	res, err := query.Run(r.Context(), a.b, req)
	if err != nil {
		return err
	}
	page := messagePage{Messages: make([]storedMessage, 0, len(res.Messages)), Next: res.Next}
	for _, m := range res.Messages {
		page.Messages = append(page.Messages, toStored(m))
	}
	a.writeJSON(w, r, http.StatusOK, page)
	return nil
}

// getMessage serves GET /api/v1/messages/{id}.
func (a *api) getMessage(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	m, err := a.b.Get(r.Context(), id)
	if err != nil {
		return err
	}
	a.writeJSON(w, r, http.StatusOK, toStored(m))
	return nil
}

// messageTrace is GET /api/v1/messages/{id}/trace.
type messageTrace struct {
	ID core.MessageID `json:"id"`
	// Message is the stored message, when it still is.
	Message *storedMessage `json:"message,omitempty"`
	Hops    []trace.Event  `json:"hops"`
}

// traceMessage serves GET /api/v1/messages/{id}/trace.
func (a *api) traceMessage(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	hops, err := trace.Lookup(r.Context(), a.b, id, 0)
	if err != nil {
		return err
	}
	out := messageTrace{ID: id, Hops: hops}
	if out.Hops == nil {
		out.Hops = []trace.Event{}
	}
	if m, err := a.b.Get(r.Context(), id); err == nil {
		s := toStored(m)
		out.Message = &s
	} else if len(hops) == 0 {
		return err // unknown and never traced: 404
	}
	a.writeJSON(w, r, http.StatusOK, out)
	return nil
}
