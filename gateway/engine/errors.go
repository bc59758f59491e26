package engine

import "errors"

// Errors of the engine.
var (
	// ErrBadOptions is returned by New for invalid Options; it lists every
	// problem.
	ErrBadOptions = errors.New("engine: invalid options")
	// ErrStarted is returned by Start when called twice.
	ErrStarted = errors.New("engine: already started")
	// ErrClosed is returned by calls on a closed engine.
	ErrClosed = errors.New("engine: closed")
	// ErrNotConnected is returned by Send and Disconnect for a client ID
	// with no connection here (Send queues for an offline session instead).
	ErrNotConnected = errors.New("engine: client not connected")
	// ErrNoSession is returned by Send for a client ID with no session here.
	ErrNoSession = errors.New("engine: no session")
	// ErrQueueFull is returned by Send when the session's queue is full.
	ErrQueueFull = errors.New("engine: session queue full")
)
