package admin

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/httperr"
)

// topicInfo describes a topic.
type topicInfo struct {
	Name      string       `json:"name"`
	System    bool         `json:"system"`
	Queues    int          `json:"queues"`
	CreatedAt time.Time    `json:"created_at,omitzero"`
	Messages  int64        `json:"messages"`
	Ranges    []queueRange `json:"ranges"`
	Epochs    []epoch      `json:"epochs,omitempty"`
}

// epoch is one queue count in a topic's history (core.Epoch).
type epoch struct {
	Queues  int       `json:"queues"`
	Begin   []int64   `json:"begin,omitempty"`
	Started time.Time `json:"started,omitzero"`
}

// queueRange is the span of one queue: messages at offsets min ≤ o < max
// are readable.
type queueRange struct {
	Queue    int   `json:"queue"`
	Min      int64 `json:"min"`
	Max      int64 `json:"max"`
	Messages int64 `json:"messages"`
}

// toTopic describes t; the message counts come from Broker.Backlog (queue
// offsets need not be dense), falling back to the span on error.
func toTopic(ctx context.Context, b core.Broker, t core.TopicInfo) topicInfo {
	out := topicInfo{Name: t.Name, System: isSystem(t.Name), Queues: t.Queues, Ranges: make([]queueRange, len(t.Ranges))}
	if !t.CreatedAt.IsZero() {
		out.CreatedAt = t.CreatedAt.UTC()
	}
	for q, r := range t.Ranges {
		n, err := b.Backlog(ctx, t.Name, q, r.Min)
		if err != nil {
			n = max(r.Max-r.Min, 0)
		}
		out.Ranges[q] = queueRange{Queue: q, Min: r.Min, Max: r.Max, Messages: n}
		out.Messages += n
	}
	for _, e := range t.Epochs {
		out.Epochs = append(out.Epochs, epoch{Queues: e.Queues, Begin: e.Begin, Started: e.Started.UTC()})
	}
	return out
}

// isSystem reports whether a topic belongs to the engine ('%RETRY%…',
// '%DLQ%…', …).
func isSystem(name string) bool { return len(name) > 0 && name[0] == '%' }

func (a *api) broker() (core.Broker, error) {
	if a.opts.Broker == nil {
		return nil, disabled(CodeStoreDisabled, "a local store")
	}
	return a.opts.Broker, nil
}

// pathTopicName returns the {topic} of the path: a user topic, or a system
// topic (percent-encode its '%' as %25).
func pathTopicName(r *http.Request) (string, error) {
	name := r.PathValue("topic")
	if isSystem(name) {
		return name, core.ValidateSystemTopic(name)
	}
	return name, core.ValidateTopic(name)
}

// topicPage is one page of GET /api/v1/topics.
type topicPage struct {
	Topics []topicInfo `json:"topics"`
	Next   string      `json:"next,omitempty"`
}

// listTopics serves GET /api/v1/topics?max=&cursor=&system=.
func (a *api) listTopics(w http.ResponseWriter, r *http.Request) error {
	b, err := a.broker()
	if err != nil {
		return err
	}
	q, err := queryParams(r, "max", "cursor", "system")
	if err != nil {
		return err
	}
	n, cursor, err := a.pageParams(q)
	if err != nil {
		return err
	}
	system, err := parseBool(q, "system")
	if err != nil {
		return err
	}
	all, err := b.Topics(r.Context()) // sorted by name
	if err != nil {
		return err
	}
	if !system {
		kept := all[:0]
		for _, t := range all {
			if !isSystem(t.Name) {
				kept = append(kept, t)
			}
		}
		all = kept
	}
	got, next := pageOf(all, func(t core.TopicInfo) string { return t.Name }, n, cursor)
	page := topicPage{Topics: make([]topicInfo, 0, len(got)), Next: next}
	for _, t := range got {
		page.Topics = append(page.Topics, toTopic(r.Context(), b, t))
	}
	a.writeJSON(w, r, http.StatusOK, page)
	return nil
}

// createTopicRequest is the body of POST /api/v1/topics.
type createTopicRequest struct {
	Name   string `json:"name"`
	Queues int    `json:"queues"`
}

// createTopic serves POST /api/v1/topics: 201 when created, 200 when it
// exists with this queue count, 409 with another.
func (a *api) createTopic(w http.ResponseWriter, r *http.Request) error {
	b, err := a.broker()
	if err != nil {
		return err
	}
	var req createTopicRequest
	if err := a.decodeBody(w, r, &req, false); err != nil {
		return err
	}
	if err := core.ValidateTopic(req.Name); err != nil {
		return err // system topics belong to the engine
	}
	if req.Queues < 0 || req.Queues > MaxQueues {
		return httperr.BadRequest("queues %d: want 1 to %d (0 or none: the engine's default)", req.Queues, MaxQueues)
	}
	status := http.StatusCreated
	if old, err := b.Topic(r.Context(), req.Name); err == nil {
		if req.Queues != 0 && old.Queues != req.Queues {
			return httperr.New(http.StatusConflict, CodeTopicExists, "topic %s exists with %d queues, not %d", req.Name, old.Queues, req.Queues)
		}
		status = http.StatusOK
		req.Queues = old.Queues
	} else if !errors.Is(err, core.ErrTopicNotFound) {
		return err
	}
	info, err := b.CreateTopic(r.Context(), core.TopicConfig{Name: req.Name, Queues: req.Queues})
	if err != nil {
		return err
	}
	if status == http.StatusCreated {
		a.audit(r).Str(fieldTopic, info.Name).Int("queues", info.Queues).Msg("topic created")
	}
	a.writeJSON(w, r, status, toTopic(r.Context(), b, info))
	return nil
}

// getTopic serves GET /api/v1/topics/{topic}.
func (a *api) getTopic(w http.ResponseWriter, r *http.Request) error {
	b, err := a.broker()
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	name, err := pathTopicName(r)
	if err != nil {
		return err
	}
	info, err := b.Topic(r.Context(), name)
	if err != nil {
		return err
	}
	a.writeJSON(w, r, http.StatusOK, toTopic(r.Context(), b, info))
	return nil
}

// topicDeleted answers DELETE /api/v1/topics/{topic}.
type topicDeleted struct {
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}

// deleteTopic serves DELETE /api/v1/topics/{topic}: the topic, its queues
// and its groups' offsets go at once; its messages are never served again
// and stay on disk until retention. System topics are refused (400).
func (a *api) deleteTopic(w http.ResponseWriter, r *http.Request) error {
	b, err := a.broker()
	if err != nil {
		return err
	}
	name, err := pathTopicName(r)
	if err != nil {
		return err
	}
	if err := core.ValidateTopic(name); err != nil {
		return httperr.New(http.StatusBadRequest, CodeInvalidTopic, "%s: system topics cannot be deleted", name)
	}
	if err := b.DeleteTopic(r.Context(), name); err != nil {
		return err
	}
	a.audit(r).Str("topic", name).Msg("topic deleted")
	a.writeJSON(w, r, http.StatusOK, topicDeleted{Name: name, Deleted: true})
	return nil
}

// resizeTopicRequest is PATCH /api/v1/topics/{topic}'s body.
type resizeTopicRequest struct {
	Queues int `json:"queues"`
}

// resizeTopic serves PATCH /api/v1/topics/{topic} {"queues": N}: the topic
// takes N queues from now on, every key keeping its order for every group
// (core.Broker.ResizeTopic). 200 with the topic, its epochs included.
func (a *api) resizeTopic(w http.ResponseWriter, r *http.Request) error {
	b, err := a.broker()
	if err != nil {
		return err
	}
	name, err := pathTopicName(r)
	if err != nil {
		return err
	}
	var req resizeTopicRequest
	if err := a.decodeBody(w, r, &req, false); err != nil {
		return err
	}
	if err := core.ValidateTopic(name); err != nil {
		return httperr.New(http.StatusBadRequest, CodeInvalidTopic, "%s: system topics cannot be resized", name)
	}
	if req.Queues < 1 || req.Queues > MaxQueues {
		return httperr.BadRequest("queues %d: want 1 to %d", req.Queues, MaxQueues)
	}
	old, err := b.Topic(r.Context(), name)
	if err != nil {
		return err
	}
	info, err := b.ResizeTopic(r.Context(), name, req.Queues)
	if err != nil {
		return err
	}
	if old.Queues != info.Queues {
		a.audit(r).Str(fieldTopic, name).Int("from", old.Queues).Int("queues", info.Queues).Msg("topic resized")
	}
	a.writeJSON(w, r, http.StatusOK, toTopic(r.Context(), b, info))
	return nil
}
