package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/query"
	"github.com/ferrymq/ferrymq/core/retry"
)

// ErrBadOptions is returned by New for invalid Options; the error lists
// every problem.
var ErrBadOptions = errors.New("httpapi: invalid options")

// Error codes: the "code" of an error response, and of a failed ack result.
// These strings are part of the API and never change meaning; the "error"
// text beside them may.
const (
	// 400
	CodeBadRequest     = "bad_request"            // a query parameter, header or field is malformed
	CodeBadJSON        = "bad_json"               // the body is not JSON of the expected shape (syntax, unknown field, wrong type)
	CodeInvalidTopic   = "invalid_topic"          // the topic name breaks core.ValidateTopic
	CodeInvalidMessage = "invalid_message"        // the engine cannot store the message as given
	CodeInvalidGroup   = "invalid_group"          // the group name breaks retry.ValidateGroup
	CodeInvalidHandle  = "invalid_handle"         // not a receipt handle this server issued (or issued before a restart)
	CodeInvisibleTime  = "invalid_invisible_time" // invisible time outside the server's bounds
	CodeDelayTooLong   = "delay_too_long"         // deliver-at beyond the server's longest delay
	CodeDeliverAtPast  = "deliver_at_past"        // deliver-at in the past: a negative delay
	// 404
	CodeNotFound        = "not_found"         // no endpoint at this path
	CodeTopicNotFound   = "topic_not_found"   // the topic does not exist
	CodeMessageNotFound = "message_not_found" // the message does not exist (any more)
	CodeQueueNotFound   = "queue_not_found"   // the queue does not exist
	// 405
	CodeMethodNotAllowed = "method_not_allowed" // see the Allow header
	// 409
	CodeHandleExpired    = "handle_expired"    // the handle's deadline passed, it was replaced, or it was already acknowledged
	CodeNotDelayed       = "not_delayed"       // the message was not a delayed one
	CodeAlreadyDue       = "already_due"       // the delayed message was delivered, or is being delivered
	CodeAlreadyCancelled = "already_cancelled" // the delayed message was cancelled before
	// 413
	CodeBodyTooLarge       = "body_too_large"       // the request body exceeds Options.MaxBodyBytes
	CodeBatchTooLarge      = "batch_too_large"      // more than Options.MaxBatch messages or handles
	CodeMessageTooLarge    = "message_too_large"    // the stored message would exceed the engine's limit
	CodePropertiesTooLarge = "properties_too_large" // properties and keys exceed the engine's limit
	// 500
	CodeCorrupt  = "corrupt"  // stored data failed its checks
	CodeInternal = "internal" // anything else; the server log has the cause
	// 501
	CodeConsumeDisabled = "consume_disabled" // the server runs without a POP service
	CodeDelayDisabled   = "delay_disabled"   // the server runs without delayed delivery
	// 503
	CodeStoreFailed  = "store_failed"  // the store refuses writes after an I/O error; an operator must act
	CodeShuttingDown = "shutting_down" // the server is closing; retry (Retry-After) on a restarted server
	CodeCanceled     = "canceled"      // the request was canceled (the client went away, or the server is stopping)
)

// retryAfter is the Retry-After, in seconds, of a 503 shutting_down.
const retryAfter = "5"

// apiError is an error answered to the client as it is.
type apiError struct {
	status int
	code   string
	// msg is the one line the client gets.
	msg string
	// cause is what the log gets when it must not carry msg (msg may quote
	// the body); nil means msg.
	cause error
}

func (e *apiError) Error() string { return e.msg }

// logErr is the error for the log line of a failed request.
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

// sentinels maps the errors of core, pop and retry to statuses and codes,
// first match wins. For 5xx the client gets msg, not the error's text
// (which may name files); the log gets the error.
var sentinels = []struct {
	err    error
	status int
	code   string
	msg    string // 5xx only
}{
	{core.ErrInvalidTopic, http.StatusBadRequest, CodeInvalidTopic, ""},
	{core.ErrInvalidMessage, http.StatusBadRequest, CodeInvalidMessage, ""},
	{retry.ErrInvalidGroup, http.StatusBadRequest, CodeInvalidGroup, ""},
	{pop.ErrInvalidHandle, http.StatusBadRequest, CodeInvalidHandle, ""},
	{pop.ErrInvisibleTime, http.StatusBadRequest, CodeInvisibleTime, ""},
	{pop.ErrInvalidRequest, http.StatusBadRequest, CodeBadRequest, ""},
	{query.ErrBadRequest, http.StatusBadRequest, CodeBadRequest, ""},
	{core.ErrInvalidMessageID, http.StatusBadRequest, CodeBadRequest, ""},
	{delay.ErrDelayTooLong, http.StatusBadRequest, CodeDelayTooLong, ""},
	{delay.ErrDeliverAtPast, http.StatusBadRequest, CodeDeliverAtPast, ""},
	{delay.ErrNotDelayed, http.StatusConflict, CodeNotDelayed, ""},
	{delay.ErrAlreadyDue, http.StatusConflict, CodeAlreadyDue, ""},
	{delay.ErrAlreadyCancelled, http.StatusConflict, CodeAlreadyCancelled, ""},
	{delay.ErrCancelLog, http.StatusServiceUnavailable, CodeStoreFailed, "cancel log failed; cancels refused until an operator restarts the server"},
	{core.ErrTopicNotFound, http.StatusNotFound, CodeTopicNotFound, ""},
	{core.ErrMessageNotFound, http.StatusNotFound, CodeMessageNotFound, ""},
	{core.ErrQueueNotFound, http.StatusNotFound, CodeQueueNotFound, ""},
	{pop.ErrHandleExpired, http.StatusConflict, CodeHandleExpired, ""},
	{core.ErrMessageTooLarge, http.StatusRequestEntityTooLarge, CodeMessageTooLarge, ""},
	{core.ErrPropertiesTooLarge, http.StatusRequestEntityTooLarge, CodePropertiesTooLarge, ""},
	{core.ErrClosed, http.StatusServiceUnavailable, CodeShuttingDown, "server shutting down; retry later"},
	{core.ErrStoreFailed, http.StatusServiceUnavailable, CodeStoreFailed, "store failed; writes refused until an operator restarts it"},
	{core.ErrCorrupt, http.StatusInternalServerError, CodeCorrupt, "stored data corrupt"},
}

// classify turns any error a handler returned into what the client gets.
// ctx is the request's context: a cancellation error counts as "canceled"
// only when the request itself was canceled.
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
func jsonError(prefix string, err error) *apiError {
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
			want = jsonType(typ.Type.Kind().String())
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
		msg = err.Error()
		log = "bad JSON value"
	}
	return &apiError{
		status: http.StatusBadRequest, code: CodeBadJSON,
		msg:   oneLine("bad JSON: " + prefix + msg),
		cause: errors.New("bad JSON: " + prefix + log),
	}
}

// jsonType names a Go kind the way a JSON user thinks of it.
func jsonType(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "map", "struct", "ptr":
		return "an object"
	default:
		return kind
	}
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.NewReplacer("\r\n", "; ", "\n", "; ", "\r", "; ").Replace(s)
}
