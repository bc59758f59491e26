package admin

import (
	"context"
	"net/http"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/shadow"
)

// Error codes: the "code" of an error response. These strings are part of
// the API and never change meaning; the "error" text beside them may. The
// codes shared with core/httpapi mean the same there.
const (
	// 400
	CodeBadRequest   = httperr.CodeBadRequest // a query parameter, path value or field is malformed
	CodeBadJSON      = httperr.CodeBadJSON    // the body is not JSON of the expected shape
	CodeInvalidTopic = "invalid_topic"        // the topic name breaks core.ValidateTopic
	CodeInvalidGroup = "invalid_group"        // the group name breaks retry.ValidateGroup
	// 401, 403
	CodeUnauthorized   = "unauthorized"    // a write without a valid token (WWW-Authenticate: Bearer)
	CodeWritesDisabled = "writes_disabled" // the API is read-only on this server
	// 404
	CodeNotFound           = "not_found"            // no endpoint at this path
	CodeTopicNotFound      = "topic_not_found"      // the topic does not exist
	CodeGroupNotFound      = "group_not_found"      // the group has no live members
	CodeClientNotFound     = "client_not_found"     // no connected client (nor stored session) with this ID
	CodeSessionNotFound    = "session_not_found"    // no stored session with this ID
	CodeSessionHeld        = "session_held"         // the MQTT server holds the session (connected client): kick it first
	CodeRetainedNotFound   = "retained_not_found"   // no retained message on this topic
	CodeDeviceNotConnected = "device_not_connected" // a call to a device no gateway node has connected
	CodeShadowNotFound     = "shadow_not_found"     // the device has no shadow
	// 405
	CodeMethodNotAllowed = "method_not_allowed" // see the Allow header
	// 409
	CodeTopicExists     = "topic_exists"     // the topic exists with another queue count
	CodeResizeRefused   = "resize_refused"   // another resize of the topic is under way, or its epochs are full
	CodeVersionConflict = "version_conflict" // a shadow change named a version that is not the current one
	// 413
	CodeBodyTooLarge   = httperr.CodeBodyTooLarge // the request body exceeds Options.MaxBodyBytes
	CodeShadowTooLarge = "shadow_too_large"       // the shadow (or the request) would exceed its limit
	// 500
	CodeCorrupt  = "corrupt"            // stored data failed its checks
	CodeInternal = httperr.CodeInternal // anything else; the server log has the cause
	// 501
	CodeNotSupported    = "not_supported"    // the engine cannot do this (topic deletion)
	CodeStoreDisabled   = "store_disabled"   // no local store (Options.Broker)
	CodeGroupsDisabled  = "groups_disabled"  // no group coordinator (Options.Groups)
	CodeRetryDisabled   = "retry_disabled"   // no retry service (Options.Retry)
	CodeMQTTDisabled    = "mqtt_disabled"    // no MQTT gateway (Options.Gateway)
	CodeShadowsDisabled = "shadows_disabled" // no device shadows (Options.Shadows)
	// 503
	CodeStoreFailed  = "store_failed"       // the store refuses writes after an I/O error
	CodeShuttingDown = "shutting_down"      // the server is closing
	CodeShadowBusy   = "shadow_busy"        // the shadow changed under this request too many times in a row: retry
	CodeCanceled     = httperr.CodeCanceled // the request was canceled
	// 504
	CodeDeviceTimeout = "device_timeout" // the device did not answer a call in time
)

// apiError is an error answered to the client as it is.
type apiError = httperr.Error

func disabled(code, what string) *apiError {
	return httperr.New(http.StatusNotImplemented, code, "this server runs without %s", what)
}

// sentinels maps the errors of core, group and retry to statuses and
// codes, first match wins. For 5xx the client gets msg, not the error's
// text (which may name files); the log gets the error.
var sentinels = []httperr.Sentinel{
	{Err: core.ErrInvalidTopic, Status: http.StatusBadRequest, Code: CodeInvalidTopic},
	{Err: retry.ErrInvalidGroup, Status: http.StatusBadRequest, Code: CodeInvalidGroup},
	{Err: group.ErrInvalidGroup, Status: http.StatusBadRequest, Code: CodeInvalidGroup},
	{Err: retry.ErrInvalidMax, Status: http.StatusBadRequest, Code: CodeBadRequest},
	{Err: core.ErrInvalidMessage, Status: http.StatusBadRequest, Code: CodeBadRequest},
	{Err: core.ErrTopicNotFound, Status: http.StatusNotFound, Code: CodeTopicNotFound},
	{Err: core.ErrQueueNotFound, Status: http.StatusNotFound, Code: CodeTopicNotFound},
	{Err: group.ErrUnknownMember, Status: http.StatusNotFound, Code: CodeGroupNotFound},
	{Err: core.ErrTopicExists, Status: http.StatusConflict, Code: CodeTopicExists},
	{Err: core.ErrResizeRefused, Status: http.StatusConflict, Code: CodeResizeRefused},
	{Err: shadow.ErrBadRequest, Status: http.StatusBadRequest, Code: CodeBadJSON},
	{Err: shadow.ErrNotFound, Status: http.StatusNotFound, Code: CodeShadowNotFound},
	{Err: shadow.ErrVersionConflict, Status: http.StatusConflict, Code: CodeVersionConflict},
	{Err: shadow.ErrTooLarge, Status: http.StatusRequestEntityTooLarge, Code: CodeShadowTooLarge},
	{Err: shadow.ErrBusy, Status: http.StatusServiceUnavailable, Code: CodeShadowBusy, Msg: "too many concurrent changes of this shadow; retry"},
	{Err: shadow.ErrClosed, Status: http.StatusServiceUnavailable, Code: CodeShuttingDown, Msg: "server shutting down; retry later"},
	{Err: core.ErrClosed, Status: http.StatusServiceUnavailable, Code: CodeShuttingDown, Msg: "server shutting down; retry later"},
	{Err: group.ErrClosed, Status: http.StatusServiceUnavailable, Code: CodeShuttingDown, Msg: "server shutting down; retry later"},
	{Err: core.ErrStoreFailed, Status: http.StatusServiceUnavailable, Code: CodeStoreFailed, Msg: "store failed; writes refused until an operator restarts it"},
	{Err: core.ErrCorrupt, Status: http.StatusInternalServerError, Code: CodeCorrupt, Msg: "stored data corrupt"},
}

// classify turns any error a handler returned into what the client gets.
func classify(ctx context.Context, err error) *apiError {
	return httperr.Classify(ctx, err, append(sentinels[:len(sentinels):len(sentinels)], callSentinels...))
}
