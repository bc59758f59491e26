package httpapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/httperr"
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
	CodeBadRequest     = httperr.CodeBadRequest   // a query parameter, header or field is malformed
	CodeBadJSON        = httperr.CodeBadJSON      // the body is not JSON of the expected shape (syntax, unknown field, wrong type)
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
	CodeBodyTooLarge       = httperr.CodeBodyTooLarge // the request body exceeds Options.MaxBodyBytes
	CodeBatchTooLarge      = "batch_too_large"        // more than Options.MaxBatch messages or handles
	CodeMessageTooLarge    = "message_too_large"      // the stored message would exceed the engine's limit
	CodePropertiesTooLarge = "properties_too_large"   // properties and keys exceed the engine's limit
	// 500
	CodeCorrupt  = "corrupt"            // stored data failed its checks
	CodeInternal = httperr.CodeInternal // anything else; the server log has the cause
	// 501
	CodeConsumeDisabled = "consume_disabled" // the server runs without a POP service
	CodeDelayDisabled   = "delay_disabled"   // the server runs without delayed delivery
	// 503
	CodeStoreFailed  = "store_failed"       // the store refuses writes after an I/O error; an operator must act
	CodeShuttingDown = "shutting_down"      // the server is closing; retry (Retry-After) on a restarted server
	CodeReadOnly     = "read_only"          // a read-only node (mirrors): produce to the primary
	CodeCanceled     = httperr.CodeCanceled // the request was canceled (the client went away, or the server is stopping)
)

// retryAfter is the Retry-After, in seconds, of a 503 shutting_down.
const retryAfter = "5"

// apiError is an error answered to the client as it is.
type apiError = httperr.Error

// sentinels maps the errors of core, pop and retry to statuses and codes,
// first match wins. For 5xx the client gets msg, not the error's text
// (which may name files); the log gets the error.
var sentinels = []httperr.Sentinel{
	{Err: core.ErrInvalidTopic, Status: http.StatusBadRequest, Code: CodeInvalidTopic},
	{Err: core.ErrInvalidMessage, Status: http.StatusBadRequest, Code: CodeInvalidMessage},
	{Err: retry.ErrInvalidGroup, Status: http.StatusBadRequest, Code: CodeInvalidGroup},
	{Err: pop.ErrInvalidHandle, Status: http.StatusBadRequest, Code: CodeInvalidHandle},
	{Err: pop.ErrInvisibleTime, Status: http.StatusBadRequest, Code: CodeInvisibleTime},
	{Err: pop.ErrInvalidRequest, Status: http.StatusBadRequest, Code: CodeBadRequest},
	{Err: query.ErrBadRequest, Status: http.StatusBadRequest, Code: CodeBadRequest},
	{Err: core.ErrInvalidMessageID, Status: http.StatusBadRequest, Code: CodeBadRequest},
	{Err: delay.ErrDelayTooLong, Status: http.StatusBadRequest, Code: CodeDelayTooLong},
	{Err: delay.ErrDeliverAtPast, Status: http.StatusBadRequest, Code: CodeDeliverAtPast},
	{Err: delay.ErrNotDelayed, Status: http.StatusConflict, Code: CodeNotDelayed},
	{Err: delay.ErrAlreadyDue, Status: http.StatusConflict, Code: CodeAlreadyDue},
	{Err: delay.ErrAlreadyCancelled, Status: http.StatusConflict, Code: CodeAlreadyCancelled},
	{Err: delay.ErrCancelLog, Status: http.StatusServiceUnavailable, Code: CodeStoreFailed, Msg: "cancel log failed; cancels refused until an operator restarts the server"},
	{Err: core.ErrTopicNotFound, Status: http.StatusNotFound, Code: CodeTopicNotFound},
	{Err: core.ErrMessageNotFound, Status: http.StatusNotFound, Code: CodeMessageNotFound},
	{Err: core.ErrQueueNotFound, Status: http.StatusNotFound, Code: CodeQueueNotFound},
	{Err: pop.ErrHandleExpired, Status: http.StatusConflict, Code: CodeHandleExpired},
	{Err: core.ErrMessageTooLarge, Status: http.StatusRequestEntityTooLarge, Code: CodeMessageTooLarge},
	{Err: core.ErrPropertiesTooLarge, Status: http.StatusRequestEntityTooLarge, Code: CodePropertiesTooLarge},
	{Err: core.ErrClosed, Status: http.StatusServiceUnavailable, Code: CodeShuttingDown, Msg: "server shutting down; retry later"},
	{Err: core.ErrStoreFailed, Status: http.StatusServiceUnavailable, Code: CodeStoreFailed, Msg: "store failed; writes refused until an operator restarts it"},
	{Err: core.ErrReadOnly, Status: http.StatusForbidden, Code: CodeReadOnly},
	{Err: core.ErrCorrupt, Status: http.StatusInternalServerError, Code: CodeCorrupt, Msg: "stored data corrupt"},
}

// classify turns any error a handler returned into what the client gets.
// ctx is the request's context: a cancellation error counts as "canceled"
// only when the request itself was canceled.
func classify(ctx context.Context, err error) *apiError {
	return httperr.Classify(ctx, err, sentinels)
}
