package httpapi

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/httperr"
)

// Headers of a raw-body produce. Names are matched case-insensitively.
const (
	headerPrefix    = "x-ferrymq-"
	headerKey       = "x-ferrymq-key"        // sharding key
	headerTag       = "x-ferrymq-tag"        // tag
	headerKeys      = "x-ferrymq-keys"       // index keys, comma-separated; may repeat
	headerDeliverAt = "x-ferrymq-deliver-at" // RFC 3339 time
	headerDelay     = "x-ferrymq-delay"      // duration from now: "90s", "2h30m"
	headerProp      = "x-ferrymq-prop-"      // + property name, lower-cased
)

// produceMessage is one message of a JSON produce.
type produceMessage struct {
	Key        string            `json:"key"`
	Tag        string            `json:"tag"`
	Keys       []string          `json:"keys"`
	Properties map[string]string `json:"properties"`
	Body       *string           `json:"body"`
	BodyBase64 *string           `json:"body_base64"`
	DeliverAt  *string           `json:"deliver_at"` // RFC 3339
	Delay      *string           `json:"delay"`      // from now: "90s", "2h30m"
}

// sendResult is the answer for one stored message.
type sendResult struct {
	ID          core.MessageID `json:"id"`
	Topic       string         `json:"topic"`
	Queue       int            `json:"queue"`
	QueueOffset int64          `json:"queue_offset"`
	StoredAt    time.Time      `json:"stored_at"`
}

func toSendResult(r core.SendResult) sendResult {
	return sendResult{ID: r.ID, Topic: r.Topic, Queue: r.Queue, QueueOffset: r.QueueOffset, StoredAt: r.StoredAt.UTC()}
}

// produce serves POST /api/v1/topics/{topic}/messages.
func (a *api) produce(w http.ResponseWriter, r *http.Request) error {
	topic := r.PathValue("topic")
	if err := core.ValidateTopic(topic); err != nil {
		return err // system topics ('%…') belong to the engine
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		return a.produceRaw(w, r, topic)
	}
	for name := range r.Header {
		if strings.HasPrefix(strings.ToLower(name), headerPrefix) {
			return httperr.BadRequest("header %s applies only to raw bodies; put key, tag, keys and properties in the JSON", name)
		}
	}
	body, err := a.readBody(w, r)
	if err != nil {
		return err
	}
	msgs, batch, err := a.decodeMessages(topic, body)
	if err != nil {
		return err
	}
	at := a.opts.Trace.ProduceStart(msgs)
	if !batch {
		res, err := a.b.Produce(r.Context(), msgs[0])
		if err != nil {
			return err
		}
		a.opts.Trace.Produced("http", r.RemoteAddr, at, msgs, []core.SendResult{res})
		a.writeJSON(w, r, http.StatusCreated, toSendResult(res))
		return nil
	}
	res, err := a.b.ProduceBatch(r.Context(), msgs)
	if err != nil {
		return err
	}
	a.opts.Trace.Produced("http", r.RemoteAddr, at, msgs, res)
	out := make([]sendResult, len(res))
	for i, sr := range res {
		out[i] = toSendResult(sr)
	}
	a.writeJSON(w, r, http.StatusCreated, out)
	return nil
}

// isJSON reports whether a Content-Type is application/json (parameters
// such as charset ignored).
func isJSON(contentType string) bool {
	if contentType == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// decodeMessages decodes a JSON produce body: one object, or an array of
// 1 to MaxBatch objects (batch true).
func (a *api) decodeMessages(topic string, body []byte) (msgs []*core.Message, batch bool, err error) {
	dec := httperr.NewDecoder(body)
	var raw json.RawMessage
	switch firstByte(body) {
	case '{':
		if err := dec.Decode(&raw); err != nil {
			return nil, false, httperr.JSON("", err)
		}
		if err := httperr.ExpectEnd(dec); err != nil {
			return nil, false, err
		}
		msg, err := decodeMessage(topic, raw, "")
		if err != nil {
			return nil, false, err
		}
		return []*core.Message{msg}, false, nil
	case '[':
		if _, err := dec.Token(); err != nil {
			return nil, true, httperr.JSON("", err)
		}
		for dec.More() {
			i := len(msgs)
			if i == a.opts.MaxBatch {
				return nil, true, httperr.New(http.StatusRequestEntityTooLarge, CodeBatchTooLarge, "batch of more than %d messages", a.opts.MaxBatch)
			}
			at := fmt.Sprintf("message %d: ", i)
			if err := dec.Decode(&raw); err != nil {
				return nil, true, httperr.JSON(at, err)
			}
			msg, err := decodeMessage(topic, raw, at)
			if err != nil {
				return nil, true, err
			}
			msgs = append(msgs, msg)
		}
		if _, err := dec.Token(); err != nil { // the closing ']'
			return nil, true, httperr.JSON("", err)
		}
		if err := httperr.ExpectEnd(dec); err != nil {
			return nil, true, err
		}
		if len(msgs) == 0 {
			return nil, true, httperr.BadRequest("empty batch: want at least one message")
		}
		return msgs, true, nil
	default:
		return nil, false, httperr.BadJSON("want an object or an array of objects")
	}
}

// produceFields are the names a message object may have.
var produceFields = httperr.Fields[produceMessage]()

// decodeMessage decodes one message object; at prefixes errors.
func decodeMessage(topic string, raw json.RawMessage, at string) (*core.Message, error) {
	var m produceMessage
	if err := httperr.DecodeObject(raw, at, &m, produceFields); err != nil {
		return nil, err
	}
	return m.message(topic, at)
}

// message turns a decoded message into a core.Message; at prefixes errors.
// Everything else (empty property names, sizes) the broker checks.
func (m *produceMessage) message(topic, at string) (*core.Message, error) {
	msg := &core.Message{
		Topic:       topic,
		ShardingKey: m.Key,
		Tag:         m.Tag,
		Keys:        m.Keys,
		Properties:  m.Properties,
	}
	switch {
	case m.Body != nil && m.BodyBase64 != nil:
		return nil, httperr.BadRequest("%sgive body or body_base64, not both", at)
	case m.Body != nil:
		msg.Body = []byte(*m.Body)
	case m.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*m.BodyBase64)
		if err != nil {
			return nil, httperr.BadRequest("%sbody_base64: %v", at, err)
		}
		msg.Body = b
	}
	if m.DeliverAt != nil && m.Delay != nil {
		return nil, httperr.BadRequest("%sgive deliver_at or delay, not both", at)
	}
	if m.DeliverAt != nil {
		t, err := parseTime(*m.DeliverAt)
		if err != nil {
			return nil, httperr.BadRequest("%sdeliver_at: %v", at, err)
		}
		msg.DeliverAt = t
	}
	if m.Delay != nil {
		t, err := parseDelay(*m.Delay)
		if err != nil {
			return nil, httperr.BadRequest("%sdelay: %v", at, err)
		}
		msg.DeliverAt = t
	}
	return msg, nil
}

// produceRaw stores the request body as one message, described by the
// X-Ferrymq-* headers.
func (a *api) produceRaw(w http.ResponseWriter, r *http.Request, topic string) error {
	msg, err := headerMessage(topic, r.Header) // before the body: a bad header costs no read
	if err != nil {
		return err
	}
	if msg.Body, err = a.readBody(w, r); err != nil {
		return err
	}
	msgs := []*core.Message{msg}
	at := a.opts.Trace.ProduceStart(msgs)
	res, err := a.b.Produce(r.Context(), msg)
	if err != nil {
		return err
	}
	a.opts.Trace.Produced("http", r.RemoteAddr, at, msgs, []core.SendResult{res})
	a.writeJSON(w, r, http.StatusCreated, toSendResult(res))
	return nil
}

// headerMessage builds a message from the X-Ferrymq-* headers. Unknown
// X-Ferrymq-* headers are refused, as unknown JSON fields are. Error
// messages name headers, never their values.
func headerMessage(topic string, h http.Header) (*core.Message, error) {
	msg := &core.Message{Topic: topic}
	for _, name := range slices.Sorted(maps.Keys(h)) { // sorted: the same request, the same error
		lower := strings.ToLower(name)
		if !strings.HasPrefix(lower, headerPrefix) {
			continue
		}
		vals := h[name]
		for _, v := range vals {
			if !utf8.ValidString(v) {
				return nil, httperr.BadRequest("header %s: not valid UTF-8", name)
			}
		}
		if lower == headerKeys {
			for _, v := range vals {
				for k := range strings.SplitSeq(v, ",") {
					if k = strings.TrimSpace(k); k != "" {
						msg.Keys = append(msg.Keys, k)
					}
				}
			}
			continue
		}
		if len(vals) != 1 {
			return nil, httperr.BadRequest("header %s given %d times, want once", name, len(vals))
		}
		v := vals[0]
		switch {
		case lower == headerKey:
			msg.ShardingKey = v
		case lower == headerTag:
			msg.Tag = v
		case lower == headerDeliverAt, lower == headerDelay:
			if !msg.DeliverAt.IsZero() {
				return nil, httperr.BadRequest("give header %s or %s, not both", headerDeliverAt, headerDelay)
			}
			parse := parseTime
			if lower == headerDelay {
				parse = parseDelay
			}
			t, err := parse(v)
			if err != nil {
				return nil, httperr.BadRequest("header %s: %v", name, err)
			}
			msg.DeliverAt = t
		case strings.HasPrefix(lower, headerProp):
			prop := lower[len(headerProp):]
			if prop == "" {
				return nil, httperr.BadRequest("header %s: property name missing", name)
			}
			if msg.Properties == nil {
				msg.Properties = map[string]string{}
			}
			msg.Properties[prop] = v
		default:
			return nil, httperr.BadRequest("unknown header %s", name)
		}
	}
	return msg, nil
}

// parseTime parses an RFC 3339 time; its error never quotes the input.
func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, errors.New("want an RFC 3339 time such as 2030-01-02T15:04:05Z")
	}
	return t, nil
}

// parseDelay turns a delay ("90s", "2h30m") into a deliver-at time.
func parseDelay(s string) (time.Time, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return time.Time{}, errors.New("want a duration such as 90s or 2h30m")
	}
	if d < 0 {
		return time.Time{}, fmt.Errorf("%v is negative", d)
	}
	return time.Now().Add(d), nil
}
