package admin

import (
	"encoding/base64"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// retainedMsg is a retained MQTT message.
type retainedMsg struct {
	Topic         string    `json:"topic"`
	QoS           byte      `json:"qos"`
	Size          int       `json:"size"`
	Payload       *string   `json:"payload,omitempty"` // set, maybe to "", when the (cut) payload is UTF-8
	PayloadBase64 string    `json:"payload_base64,omitempty"`
	Truncated     bool      `json:"truncated,omitempty"` // the payload was cut to PreviewBytes
	ContentType   string    `json:"content_type,omitempty"`
	Origin        string    `json:"origin,omitempty"` // the client ID that published it
	CreatedAt     time.Time `json:"created_at,omitzero"`
	ExpiresAt     time.Time `json:"expires_at,omitzero"`
}

func toRetained(m *engine.Message) retainedMsg {
	out := retainedMsg{Topic: m.Topic, QoS: m.QoS, Size: len(m.Payload), Origin: m.Origin}
	if m.Props != nil {
		out.ContentType = m.Props.ContentType
	}
	if m.Created > 0 {
		out.CreatedAt = time.Unix(0, m.Created).UTC()
	}
	if m.Expiry > 0 {
		out.ExpiresAt = time.Unix(m.Expiry, 0).UTC()
	}
	out.Payload, out.PayloadBase64, out.Truncated = preview(m.Payload)
	return out
}

// preview shows at most PreviewBytes of b: as text when that is UTF-8 (a
// character cut in two at the end is dropped), else in standard base64.
func preview(b []byte) (text *string, b64 string, truncated bool) {
	if len(b) > PreviewBytes {
		b, truncated = b[:PreviewBytes], true
	}
	cut := b
	if truncated {
		for k := 1; k < utf8.UTFMax && !utf8.Valid(cut) && k < len(b); k++ {
			cut = b[:len(b)-k]
		}
	}
	if utf8.Valid(cut) {
		s := string(cut)
		return &s, "", truncated
	}
	return nil, base64.StdEncoding.EncodeToString(b), truncated
}

// retainedPage is one page of GET /api/v1/retained.
type retainedPage struct {
	Retained []retainedMsg `json:"retained"`
	Next     string        `json:"next,omitempty"`
}

// listRetained serves GET /api/v1/retained?max=&cursor=&system=: retained
// messages sorted by topic; those under '$' topics ($SYS) only with
// system=true.
func (a *api) listRetained(w http.ResponseWriter, r *http.Request) error {
	e, err := a.mqttEngine()
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
	var list []*engine.Message
	for _, m := range e.Retained("") {
		if m.Topic > cursor && (system || !strings.HasPrefix(m.Topic, "$")) {
			list = append(list, m)
		}
	}
	slices.SortFunc(list, func(x, y *engine.Message) int { return strings.Compare(x.Topic, y.Topic) })
	got, next := pageOf(list, func(m *engine.Message) string { return m.Topic }, n, "")
	page := retainedPage{Retained: make([]retainedMsg, 0, len(got)), Next: next}
	for _, m := range got {
		page.Retained = append(page.Retained, toRetained(m))
	}
	a.writeJSON(w, r, http.StatusOK, page)
	return nil
}

// pathRetainedTopic returns the {topic...} of the path: an MQTT topic name
// (no wildcards).
func pathRetainedTopic(r *http.Request) (string, error) {
	t := r.PathValue("topic")
	switch {
	case t == "":
		return "", httperr.BadRequest("topic missing: /api/v1/retained/{topic}")
	case strings.ContainsAny(t, "+#\x00"):
		return "", httperr.BadRequest("topic %q: a topic name, without wildcards", t)
	case !utf8.ValidString(t), len(t) > 65535:
		return "", httperr.BadRequest("topic: not an MQTT topic name")
	}
	return t, nil
}

// getRetained serves GET /api/v1/retained/{topic...}.
func (a *api) getRetained(w http.ResponseWriter, r *http.Request) error {
	e, err := a.mqttEngine()
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	topic, err := pathRetainedTopic(r)
	if err != nil {
		return err
	}
	m, ok := e.RetainedMessage(topic)
	if !ok {
		return httperr.New(http.StatusNotFound, CodeRetainedNotFound, "no retained message on %q", topic)
	}
	a.writeJSON(w, r, http.StatusOK, toRetained(m))
	return nil
}

type clearResult struct {
	Topic   string `json:"topic"`
	Cleared bool   `json:"cleared"`
}

// clearRetained serves DELETE /api/v1/retained/{topic...}: publishes an
// empty retained message on the topic, as an MQTT client clears one
// [MQTT-3.3.1-6]: the retained message goes (from the session store too),
// and current subscribers get the empty publish.
func (a *api) clearRetained(w http.ResponseWriter, r *http.Request) error {
	e, err := a.mqttEngine()
	if err != nil {
		return err
	}
	topic, err := pathRetainedTopic(r)
	if err != nil {
		return err
	}
	if _, ok := e.RetainedMessage(topic); !ok {
		return httperr.New(http.StatusNotFound, CodeRetainedNotFound, "no retained message on %q", topic)
	}
	if err := e.Publish(&engine.Message{Topic: topic, Retain: true, Created: a.opts.Now().UnixNano()}, false); err != nil {
		return err
	}
	a.audit(r).Str(fieldTopic, topic).Msg("retained message cleared")
	a.writeJSON(w, r, http.StatusOK, clearResult{Topic: topic, Cleared: true})
	return nil
}
