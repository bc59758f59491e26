package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/query"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/txn"
)

// Code is a stable numeric error code carried by error frames. These values
// are part of the protocol and never change meaning.
type Code uint16

const (
	CodeBadFrame      Code = 1 // the frame could not be decoded; the connection is closed
	CodeVersion       Code = 2 // unsupported protocol version; closed
	CodeUnauthorized  Code = 3 // bad or missing token; closed
	CodeUnknownOp     Code = 4 // op not known to this server
	CodeFrameTooLarge Code = 5 // frame over the limit: skipped (closed if its header is not sound), or an answer that would be
	CodeBadRequest    Code = 6 // the payload does not decode or a field is invalid
	CodeHandshake     Code = 7 // a request before hello; closed

	CodeTopicNotFound      Code = 10
	CodeInvalidTopic       Code = 11
	CodeMessageTooLarge    Code = 12
	CodeInvalidMessage     Code = 13
	CodeMessageNotFound    Code = 14
	CodeStoreFailed        Code = 15 // the store refuses writes (disk full, I/O error)
	CodeCorrupt            Code = 16
	CodeQueueNotFound      Code = 17
	CodeTopicExists        Code = 18
	CodePropertiesTooLarge Code = 19
	CodeResizeRefused      Code = 21 // another resize of the topic is under way (retry later), or its epochs are full
	CodeNoCommittedOffset  Code = 20
	CodeUnknownMember      Code = 30
	CodeNotAssigned        Code = 31
	CodeQueueBusy          Code = 32 // retry shortly
	CodeModeMismatch       Code = 33
	CodeInvalidGroup       Code = 34
	CodeNotSubscribed      Code = 35
	CodeInvalidHandle      Code = 40
	CodeHandleExpired      Code = 41
	CodeInvisibleTime      Code = 42
	CodeDelayTooLong       Code = 60 // deliver-at beyond the server's maximum delay
	CodeDeliverAtPast      Code = 61 // deliver-at in the past: a negative delay
	CodeNotDelayed         Code = 62 // cancel of a message that was not delayed
	CodeAlreadyDue         Code = 63 // cancel of a message already delivered or being delivered
	CodeAlreadyCancelled   Code = 64
	CodeTxnNotFound        Code = 70 // unknown half message
	CodeTxnResolved        Code = 71 // half message already committed, rolled back or discarded
	CodeTxnGroupMismatch   Code = 72 // half message of another producer group
	CodeTxnTooManyPending  Code = 73 // retry later
	CodeNotEnabled         Code = 74 // the server does not run this service (e.g. a gateway without a store)
	CodeMoved              Code = 75 // another node serves the request's shard: the message names it (MovedError); send it there
	CodeReadOnly           Code = 76 // a read-only node (mirrors of another cluster): writes go to the primary
	CodeNotConnected       Code = 80 // a call to a device that no gateway node has connected
	CodeDeviceTimeout      Code = 81 // the device did not answer the call in time
	CodeVersionConflict    Code = 82 // a shadow update named a version that is not the current one
	CodeShadowNotFound     Code = 83 // the device has no shadow
	CodeShadowTooLarge     Code = 84 // the shadow document would exceed its limit
	CodeInternal           Code = 50
	CodeShuttingDown       Code = 51 // retry on another connection
	CodeOverloaded         Code = 52 // retry later
	CodeTimeout            Code = 53 // the server gave up waiting (e.g. for durability); the outcome is unknown
)

// sentinels maps codes to the errors they stand for, in both directions.
var sentinels = []struct {
	code Code
	err  error
}{
	{CodeTopicNotFound, core.ErrTopicNotFound},
	{CodeInvalidTopic, core.ErrInvalidTopic},
	{CodeMessageTooLarge, core.ErrMessageTooLarge},
	{CodePropertiesTooLarge, core.ErrPropertiesTooLarge},
	{CodeInvalidMessage, core.ErrInvalidMessage},
	{CodeMessageNotFound, core.ErrMessageNotFound},
	{CodeStoreFailed, core.ErrStoreFailed},
	{CodeCorrupt, core.ErrCorrupt},
	{CodeQueueNotFound, core.ErrQueueNotFound},
	{CodeTopicExists, core.ErrTopicExists},
	{CodeResizeRefused, core.ErrResizeRefused},
	{CodeNoCommittedOffset, core.ErrNoCommittedOffset},
	{CodeShuttingDown, core.ErrClosed},
	{CodeUnknownMember, group.ErrUnknownMember},
	{CodeNotAssigned, group.ErrNotAssigned},
	{CodeQueueBusy, group.ErrQueueBusy},
	{CodeModeMismatch, group.ErrModeMismatch},
	{CodeInvalidGroup, group.ErrInvalidGroup},
	{CodeInvalidGroup, retry.ErrInvalidGroup},
	{CodeNotSubscribed, group.ErrNotSubscribed},
	{CodeInvalidHandle, pop.ErrInvalidHandle},
	{CodeHandleExpired, pop.ErrHandleExpired},
	{CodeInvisibleTime, pop.ErrInvisibleTime},
	{CodeBadRequest, pop.ErrInvalidRequest},
	{CodeDelayTooLong, delay.ErrDelayTooLong},
	{CodeDeliverAtPast, delay.ErrDeliverAtPast},
	{CodeNotDelayed, delay.ErrNotDelayed},
	{CodeAlreadyDue, delay.ErrAlreadyDue},
	{CodeAlreadyCancelled, delay.ErrAlreadyCancelled},
	{CodeStoreFailed, delay.ErrCancelLog},
	{CodeTxnNotFound, txn.ErrNotFound},
	{CodeTxnResolved, txn.ErrResolved},
	{CodeTxnGroupMismatch, txn.ErrGroupMismatch},
	{CodeInvalidGroup, txn.ErrInvalidGroup},
	{CodeTxnTooManyPending, txn.ErrTooManyPending},
	{CodeBadRequest, txn.ErrInvalidAction},
	{CodeBadRequest, query.ErrBadRequest},
	{CodeShuttingDown, txn.ErrClosed},
	{CodeNotEnabled, ErrNotEnabled},
	{CodeMoved, ErrMoved},
	{CodeReadOnly, core.ErrReadOnly},
	{CodeNotConnected, ErrDeviceNotConnected},
	{CodeDeviceTimeout, ErrDeviceTimeout},
	{CodeBadRequest, retry.ErrInvalidMax},
	{CodeVersionConflict, shadow.ErrVersionConflict},
	{CodeShadowNotFound, shadow.ErrNotFound},
	{CodeShadowTooLarge, shadow.ErrTooLarge},
	{CodeBadRequest, shadow.ErrBadRequest},
	{CodeShuttingDown, shadow.ErrClosed},
	{CodeOverloaded, shadow.ErrBusy},
	{CodeBadRequest, ErrBadPayload},
	{CodeFrameTooLarge, ErrFrameTooLarge},
	{CodeBadFrame, ErrBadFrame},
}

// Error is an error frame's content. It wraps the sentinel error its code
// stands for, so errors.Is(err, core.ErrTopicNotFound) works across the wire.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("ferrymq: %s (code %d)", e.Message, e.Code) }

// Unwrap returns the sentinels of the code: several packages' errors share
// some codes (invalid group, bad request), and errors.Is matches any of
// them.
func (e *Error) Unwrap() []error {
	var out []error
	for _, s := range sentinels {
		if s.code == e.Code {
			out = append(out, s.err)
		}
	}
	return out
}

// Retryable reports whether the same request may succeed if sent again
// (on this or another connection).
func (e *Error) Retryable() bool {
	switch e.Code {
	case CodeShuttingDown, CodeOverloaded, CodeQueueBusy, CodeTxnTooManyPending:
		return true
	}
	return false
}

// CodeOf picks the code for an error returned by the core.
func CodeOf(err error) Code {
	var we *Error
	if errors.As(err, &we) {
		return we.Code
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.code
		}
	}
	return CodeInternal
}

// movedPrefix begins the message of a CodeMoved error: the address comes
// next, up to a space, then the node's name in parentheses and a text.
const movedPrefix = "moved to "

// MovedError is the answer for a request of shard (a consumer group's
// name, or "" for the node-wide services) that node serves at addr, its
// core address.
func MovedError(shard, node, addr string) *Error {
	what := "the node-wide services (delayed delivery, transactions, group listing)"
	if shard != "" {
		what = "consumer group " + shard
	}
	return &Error{Code: CodeMoved, Message: movedPrefix + addr + " (" + node + "): " + what + " is served there"}
}

// MovedTo returns the core address a CodeMoved error names; ok is false
// for any other error, or one that names no address.
func MovedTo(err error) (addr string, ok bool) {
	var we *Error
	if !errors.As(err, &we) || we.Code != CodeMoved {
		return "", false
	}
	rest, ok := strings.CutPrefix(we.Message, movedPrefix)
	if !ok {
		return "", false
	}
	addr, _, _ = strings.Cut(rest, " ")
	return addr, addr != ""
}

// maxErrorText bounds the message of an error frame.
const maxErrorText = 1024

// EncodeError is the payload of an error frame.
func EncodeError(code Code, msg string) []byte {
	if len(msg) > maxErrorText {
		msg = msg[:maxErrorText]
		for !utf8.ValidString(msg) {
			msg = msg[:len(msg)-1]
		}
	}
	b := make([]byte, 2+len(msg))
	binary.BigEndian.PutUint16(b, uint16(code))
	copy(b[2:], msg)
	return b
}

// DecodeError parses an error frame's payload.
func DecodeError(p []byte) *Error {
	if len(p) < 2 {
		return &Error{Code: CodeBadFrame, Message: "error frame without a code"}
	}
	return &Error{Code: Code(binary.BigEndian.Uint16(p)), Message: string(p[2:])}
}
