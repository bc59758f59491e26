// Package httperr is the error half shared by ferrymq's two HTTP APIs
// (core/httpapi, the produce/consume/query API, and gateway/admin): an
// error answered to the client as it is, the classification of any other
// error through a table of sentinel errors, and strict JSON object
// decoding whose failures are described to the client without the log
// ever quoting the request body.
//
// Each API keeps its own error codes and sentinel table; the codes used
// here (CodeBadJSON, CodeBodyTooLarge, CodeCanceled, CodeInternal) mean the
// same in both.
package httperr

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
)

// Error codes this package answers with.
const (
	CodeBadRequest   = "bad_request"    // a query parameter, path value, header or field is malformed
	CodeBadJSON      = "bad_json"       // the body is not JSON of the expected shape (syntax, unknown field, wrong type)
	CodeBodyTooLarge = "body_too_large" // the request body exceeds the API's limit
	CodeCanceled     = "canceled"       // the request was canceled
	CodeInternal     = "internal"       // anything else; the log has the cause
)

// Error is an error answered to the client as it is.
type Error struct {
	Status int
	Code   string
	// Msg is the one line the client gets.
	Msg string
	// Cause is what the log gets when it must not carry Msg (Msg may quote
	// the body, or a 5xx error's text may name files); nil means Msg.
	Cause error
}

func (e *Error) Error() string { return e.Msg }

// LogErr is the error for the log line of a failed request.
func (e *Error) LogErr() error {
	if e.Cause != nil {
		return e.Cause
	}
	return errors.New(e.Msg)
}

// New returns an Error whose message is format's, on one line.
func New(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Msg: OneLine(fmt.Sprintf(format, args...))}
}

// BadRequest is a 400 bad_request with format's message.
func BadRequest(format string, args ...any) *Error {
	return New(http.StatusBadRequest, CodeBadRequest, format, args...)
}

// BadJSON is a 400 bad_json with msg after "bad JSON: ".
func BadJSON(msg string) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeBadJSON, Msg: OneLine("bad JSON: " + msg)}
}

// Sentinel maps an error (errors.Is) to a status and a code. For 5xx the
// client gets Msg, not the error's text; the log gets the error.
type Sentinel struct {
	Err    error
	Status int
	Code   string
	Msg    string // 5xx only
}

// Classify turns any error a handler returned into what the client gets:
// an *Error as it is, an oversized body, the first matching sentinel, a
// cancellation — only when ctx, the request's context, was canceled — or
// else a 500 internal error.
func Classify(ctx context.Context, err error, sentinels []Sentinel) *Error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return New(http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "request body larger than %d bytes", mbe.Limit)
	}
	for _, s := range sentinels {
		if !errors.Is(err, s.Err) {
			continue
		}
		if s.Status >= 500 {
			return &Error{Status: s.Status, Code: s.Code, Msg: s.Msg, Cause: err}
		}
		return &Error{Status: s.Status, Code: s.Code, Msg: OneLine(err.Error())}
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeCanceled, Msg: "request canceled", Cause: err}
	}
	return &Error{Status: http.StatusInternalServerError, Code: CodeInternal, Msg: "internal error", Cause: err}
}

// JSON describes a decoding failure of the value at prefix ("" for the
// body, "messages[2]: " inside it). The client's message may quote a field
// name from the body; the log's never does.
func JSON(prefix string, err error) *Error {
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
		msg string
		log string
	)
	switch {
	case errors.As(err, &syn):
		msg = fmt.Sprintf("%v (at byte %d)", syn, syn.Offset)
		log = fmt.Sprintf("syntax error at byte %d", syn.Offset)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "value"
		}
		want := "another type"
		if typ.Type != nil {
			want = jsonType(typ.Type.Kind())
		}
		msg = fmt.Sprintf("%s: want %s, got JSON %s", field, want, typ.Value)
		log = "wrong JSON type for a field"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		msg = "unexpected end of JSON"
		log = msg
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		msg = strings.TrimPrefix(err.Error(), "json: ")
		log = "unknown field"
	default:
		msg = strings.TrimPrefix(err.Error(), "json: ")
		log = "bad JSON value"
	}
	return &Error{Status: http.StatusBadRequest, Code: CodeBadJSON,
		Msg: OneLine("bad JSON: " + prefix + msg), Cause: errors.New("bad JSON: " + prefix + log)}
}

// jsonType names a Go kind the way a JSON user thinks of it.
func jsonType(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		return "an object"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "a number"
	default:
		return k.String()
	}
}

// DecodeObject decodes raw, one JSON value (the value at prefix), into v.
// It must be an object whose names are all in fields, each once, spelled
// exactly: encoding/json alone would take "BODY" for "body" and keep the
// last of two "body"s.
func DecodeObject(raw []byte, prefix string, v any, fields []string) error {
	if b := bytes.TrimLeft(raw, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return BadJSON(prefix + "want an object")
	}
	dec := NewDecoder(raw)
	if _, err := dec.Token(); err != nil { // '{'
		return JSON(prefix, err)
	}
	seen := make([]bool, len(fields))
	var skip json.RawMessage
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return JSON(prefix, err)
		}
		name, _ := tok.(string) // object keys are strings
		i := slices.Index(fields, name)
		switch {
		case i < 0:
			e := BadJSON(fmt.Sprintf("%sunknown field %q", prefix, name))
			e.Cause = errors.New("bad JSON: unknown field")
			return e
		case seen[i]:
			e := BadJSON(fmt.Sprintf("%sfield %q given twice", prefix, name))
			e.Cause = errors.New("bad JSON: field given twice")
			return e
		}
		seen[i] = true
		if err := dec.Decode(&skip); err != nil {
			return JSON(prefix, err)
		}
	}
	if _, err := dec.Token(); err != nil { // '}'
		return JSON(prefix, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return BadJSON(prefix + "data after the top-level value")
	}
	if err := NewDecoder(raw).Decode(v); err != nil {
		return JSON(prefix, err)
	}
	return nil
}

// Fields lists the JSON names of struct type T's fields.
func Fields[T any]() []string {
	t := reflect.TypeFor[T]()
	out := make([]string, t.NumField())
	for i := range out {
		out[i], _, _ = strings.Cut(t.Field(i).Tag.Get("json"), ",")
	}
	return out
}

// NewDecoder is a JSON decoder of body that refuses unknown fields.
func NewDecoder(body []byte) *json.Decoder {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	return dec
}

// ExpectEnd checks that nothing but white space follows the value dec
// decoded last.
func ExpectEnd(dec *json.Decoder) error {
	if _, err := dec.Token(); err != io.EOF {
		return BadJSON("data after the top-level value")
	}
	return nil
}

// OneLine keeps an error message on one line.
func OneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.NewReplacer("\r\n", "; ", "\n", "; ", "\r", "; ").Replace(s)
}
