package shadow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Update is one change of a document's section.
type Update struct {
	Section Section
	// Patch is the JSON merge patch applied to the section (RFC 7386:
	// null removes a field, objects merge); ignored with Clear.
	Patch map[string]any
	// Clear removes every field of the section (the request's section was
	// null).
	Clear bool
	// Version, when not 0, must be the document's current version (0 for
	// a device without a shadow is "any"); ErrVersionConflict otherwise.
	Version int64
	// ClientToken is echoed in the MQTT answer, so that a device can match
	// answers to requests.
	ClientToken string
}

// Limits bound what a request and a document may hold.
type Limits struct {
	// MaxBytes bounds a document's two sections as JSON, and a request
	// (which may be MaxBytes+RequestOverhead bytes long).
	MaxBytes int
	// MaxDepth bounds the nesting of objects and arrays in a section
	// (a section's own fields are depth 1).
	MaxDepth int
}

// Defaults of Limits, and the room a request has besides its section.
const (
	DefaultMaxBytes = 8 << 10
	DefaultMaxDepth = 6
	RequestOverhead = 1 << 10
	// MaxClientToken bounds a request's client_token.
	MaxClientToken = 64
)

func (l Limits) withDefaults() Limits {
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxDepth == 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	return l
}

// DecodeRequest decodes an update request of section s:
//
//	{"state": {"reported": {...}}, "version": 3, "client_token": "abc"}
//
// (s Desired: "desired"). state must hold exactly that section, an object
// or null (null clears the section); version (≥ 0) and client_token are
// optional; any other field is refused. Errors wrap ErrBadRequest or
// ErrTooLarge.
func DecodeRequest(b []byte, s Section, lim Limits) (Update, error) {
	lim = lim.withDefaults()
	if len(b) > lim.MaxBytes+RequestOverhead {
		return Update{}, fmt.Errorf("%w: request of %d bytes, limit %d", ErrTooLarge, len(b), lim.MaxBytes+RequestOverhead)
	}
	var req struct {
		State       map[string]json.RawMessage `json:"state"`
		Version     *json.Number               `json:"version"`
		ClientToken string                     `json:"client_token"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		return Update{}, fmt.Errorf("%w: %s", ErrBadRequest, jsonProblem(err))
	}
	if err := atEnd(dec); err != nil {
		return Update{}, err
	}
	if req.State == nil {
		return Update{}, fmt.Errorf("%w: no state object", ErrBadRequest)
	}
	u := Update{Section: s, ClientToken: req.ClientToken}
	if len(u.ClientToken) > MaxClientToken || !utf8.ValidString(u.ClientToken) {
		return Update{}, fmt.Errorf("%w: client_token over %d bytes or not UTF-8", ErrBadRequest, MaxClientToken)
	}
	if req.Version != nil {
		v, err := req.Version.Int64()
		if err != nil || v < 0 {
			return Update{}, fmt.Errorf("%w: version %s: want an integer ≥ 0", ErrBadRequest, req.Version.String())
		}
		u.Version = v
	}
	for k := range req.State {
		if Section(k) != s {
			return Update{}, fmt.Errorf("%w: state.%s: this request may change only state.%s", ErrBadRequest, k, s)
		}
	}
	raw, ok := req.State[string(s)]
	if !ok {
		return Update{}, fmt.Errorf("%w: no state.%s", ErrBadRequest, s)
	}
	patch, err := DecodePatch(raw, lim)
	if err != nil {
		return Update{}, fmt.Errorf("state.%s: %w", s, err)
	}
	u.Patch, u.Clear = patch, patch == nil
	return u, nil
}

// DecodePatch decodes one section's merge patch: a JSON object, or null
// (nil, nil: clear the section), nested at most lim.MaxDepth deep. Errors
// wrap ErrBadRequest or ErrTooLarge.
func DecodePatch(b []byte, lim Limits) (map[string]any, error) {
	lim = lim.withDefaults()
	if len(b) > lim.MaxBytes+RequestOverhead {
		return nil, fmt.Errorf("%w: patch of %d bytes, limit %d", ErrTooLarge, len(b), lim.MaxBytes+RequestOverhead)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrBadRequest, jsonProblem(err))
	}
	if err := atEnd(dec); err != nil {
		return nil, err
	}
	if v == nil {
		return nil, nil
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: want a JSON object or null, got %s", ErrBadRequest, kind(v))
	}
	if d := depth(obj); d > lim.MaxDepth {
		return nil, fmt.Errorf("%w: nested %d deep, limit %d", ErrBadRequest, d, lim.MaxDepth)
	}
	return obj, nil
}

// atEnd refuses anything but white space after the decoded value.
func atEnd(dec *json.Decoder) error {
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: data after the JSON value", ErrBadRequest)
	}
	return nil
}

// jsonProblem says what is wrong with the JSON without quoting it back.
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("not JSON (at byte %d): %s", syn.Offset, syn.Error())
	case errors.As(err, &typ):
		return fmt.Sprintf("field %q: want %s, got %s", typ.Field, typ.Type, typ.Value)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "not JSON: empty or cut short"
	default:
		return err.Error()
	}
}

// kind names a decoded JSON value's type.
func kind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	default:
		return "null"
	}
}

// depth is how deeply v nests: 1 for an object of plain values.
func depth(v any) int {
	switch v := v.(type) {
	case map[string]any:
		d := 0
		for _, e := range v {
			d = max(d, depth(e))
		}
		return d + 1
	case []any:
		d := 0
		for _, e := range v {
			d = max(d, depth(e))
		}
		return d + 1
	default:
		return 0
	}
}

// DecodeDocument decodes a document as the surfaces show it (wire and
// HTTP answers), numbers kept as json.Number as requests decode them.
// Errors wrap ErrCorrupt.
func DecodeDocument(b []byte) (*Document, error) {
	var d Document
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%w: document: %s", ErrCorrupt, jsonProblem(err))
	}
	if err := atEnd(dec); err != nil {
		return nil, fmt.Errorf("%w: document: data after the JSON value", ErrCorrupt)
	}
	if d.Version < 1 {
		return nil, fmt.Errorf("%w: document of version %d", ErrCorrupt, d.Version)
	}
	return &d, nil
}
