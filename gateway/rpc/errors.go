package rpc

import "errors"

// Errors returned by Service.Call.
var (
	// ErrNotConnected: no gateway node has the device connected.
	ErrNotConnected = errors.New("rpc: device not connected")
	// ErrTimeout: the device did not answer within the call's timeout.
	ErrTimeout = errors.New("rpc: device did not answer in time")
	// ErrBadRequest: a client ID that cannot be called (empty, with '+',
	// '#' or NUL, or too long), a timeout outside 1–60 s, or a payload over
	// MaxPayload.
	ErrBadRequest = errors.New("rpc: bad call")
	// ErrClosed: the service is shutting down.
	ErrClosed = errors.New("rpc: closed")

	// errMalformed: a message between nodes that does not decode.
	errMalformed = errors.New("rpc: malformed message between nodes")
)
