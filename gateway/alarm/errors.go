package alarm

import "errors"

// ErrBadOptions is returned by New for invalid Options; the error lists
// every problem.
var ErrBadOptions = errors.New("alarm: invalid options")

// ErrBadEvent is returned by DecodeEvent for bytes that are not an Event.
var ErrBadEvent = errors.New("alarm: not an alarm event")
