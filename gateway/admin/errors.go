package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
)

// Error codes: the "code" of an error response. These strings are part of
// the API and never change meaning; the "error" text beside them may. The
// codes shared with core/httpapi mean the same there.
const (
	// 400
	CodeBadRequest   = "bad_request"   // a query parameter, path value or field is malformed
	CodeBadJSON      = "bad_json"      // the body is not JSON of the expected shape
	CodeInvalidTopic = "invalid_topic" // the topic name breaks core.ValidateTopic
	CodeInvalidGroup = "invalid_group" // the group name breaks retry.ValidateGroup
	// 401, 403
	CodeUnauthorized   = "unauthorized"    // a write without a valid token (WWW-Authenticate: Bearer)
	CodeWritesDisabled = "writes_disabled" // the API is read-only on this server
	// 404
	CodeNotFound         = "not_found"          // no endpoint at this path
	CodeTopicNotFound    = "topic_not_found"    // the topic does not exist
	CodeGroupNotFound    = "group_not_found"    // the group has no live members
	CodeClientNotFound   = "client_not_found"   // no connected client (nor stored session) with this ID
	CodeSessionNotFound  = "session_not_found"  // no stored session with this ID
	CodeSessionHeld      = "session_held"       // the MQTT server holds the session (connected client): kick it first
	CodeRetainedNotFound = "retained_not_found" // no retained message on this topic
	// 405
	CodeMethodNotAllowed = "method_not_allowed" // see the Allow header
	// 409
	CodeTopicExists = "topic_exists" // the topic exists with another queue count
	// 413
	CodeBodyTooLarge = "body_too_large" // the request body exceeds Options.MaxBodyBytes
	// 500
	CodeCorrupt  = "corrupt"  // stored data failed its checks
	CodeInternal = "internal" // anything else; the server log has the cause
	// 501
	CodeNotSupported     = "not_supported"     // the engine cannot do this (topic deletion)
	CodeStoreDisabled    = "store_disabled"    // no local store (Options.Broker)
	CodeGroupsDisabled   = "groups_disabled"   // no group coordinator (Options.Groups)
	CodeRetryDisabled    = "retry_disabled"    // no retry service (Options.Retry)
	CodeMQTTDisabled     = "mqtt_disabled"     // no MQTT gateway (Options.Gateway)
	CodeSessionsDisabled = "sessions_disabled" // no session store (Options.Sessions)
	// 503
	CodeStoreFailed  = "store_failed"  // the store refuses writes after an I/O error
	CodeShuttingDown = "shutting_down" // the server is closing
	CodeCanceled     = "canceled"      // the request was canceled
)

// apiError is an error answered to the client as it is.
type apiError struct {
	status int
	code   string
	msg    string // the one line the client gets
	// cause is what the log gets when it must not carry msg; nil means msg.
	cause error
}

func (e *apiError) Error() string { return e.msg }

func (e *apiError) logErr() error {
	if e.cause != nil {
		return e.cause
	}
	return errors.New(e.msg)
}

func newError(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, msg: oneLine(fmt.Sprintf(format, args...))}
}

func badRequest(format string, args ...any) *apiError {
	return newError(http.StatusBadRequest, CodeBadRequest, format, args...)
}

func disabled(code, what string) *apiError {
	return newError(http.StatusNotImplemented, code, "this server runs without %s", what)
}

// sentinels maps the errors of core, group and retry to statuses and
// codes, first match wins. For 5xx the client gets msg, not the error's
// text (which may name files); the log gets the error.
var sentinels = []struct {
	err    error
	status int
	code   string
	msg    string // 5xx only
}{
	{core.ErrInvalidTopic, http.StatusBadRequest, CodeInvalidTopic, ""},
	{retry.ErrInvalidGroup, http.StatusBadRequest, CodeInvalidGroup, ""},
	{group.ErrInvalidGroup, http.StatusBadRequest, CodeInvalidGroup, ""},
	{retry.ErrInvalidMax, http.StatusBadRequest, CodeBadRequest, ""},
	{core.ErrInvalidMessage, http.StatusBadRequest, CodeBadRequest, ""},
	{core.ErrTopicNotFound, http.StatusNotFound, CodeTopicNotFound, ""},
	{core.ErrQueueNotFound, http.StatusNotFound, CodeTopicNotFound, ""},
	{group.ErrUnknownMember, http.StatusNotFound, CodeGroupNotFound, ""},
	{core.ErrTopicExists, http.StatusConflict, CodeTopicExists, ""},
	{core.ErrClosed, http.StatusServiceUnavailable, CodeShuttingDown, "server shutting down; retry later"},
	{group.ErrClosed, http.StatusServiceUnavailable, CodeShuttingDown, "server shutting down; retry later"},
	{core.ErrStoreFailed, http.StatusServiceUnavailable, CodeStoreFailed, "store failed; writes refused until an operator restarts it"},
	{core.ErrCorrupt, http.StatusInternalServerError, CodeCorrupt, "stored data corrupt"},
}

// classify turns any error a handler returned into what the client gets.
func classify(ctx context.Context, err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return newError(http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "request body larger than %d bytes", mbe.Limit)
	}
	for _, s := range sentinels {
		if !errors.Is(err, s.err) {
			continue
		}
		if s.status >= 500 {
			return &apiError{status: s.status, code: s.code, msg: s.msg, cause: err}
		}
		return &apiError{status: s.status, code: s.code, msg: oneLine(err.Error())}
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return &apiError{status: http.StatusServiceUnavailable, code: CodeCanceled, msg: "request canceled", cause: err}
	}
	return &apiError{status: http.StatusInternalServerError, code: CodeInternal, msg: "internal error", cause: err}
}

// jsonError describes a decoding failure. The client's message may quote a
// field name from the body; the log's never does.
func jsonError(err error) *apiError {
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
		msg = fmt.Sprintf("%s: wrong type, got JSON %s", field, typ.Value)
		log = "wrong JSON type for a field"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		msg = "unexpected end of JSON"
		log = msg
	default:
		msg = strings.TrimPrefix(err.Error(), "json: ")
		log = "bad JSON value"
	}
	return &apiError{status: http.StatusBadRequest, code: CodeBadJSON, msg: oneLine("bad JSON: " + msg), cause: errors.New("bad JSON: " + log)}
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.NewReplacer("\r\n", "; ", "\n", "; ", "\r", "; ").Replace(s)
}
