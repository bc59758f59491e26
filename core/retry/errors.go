package retry

import "errors"

// Errors returned by this package; broker errors (core.ErrClosed,
// core.ErrStoreFailed, …) are passed through wrapped. Test with errors.Is.
var (
	// ErrInvalidGroup is returned when a consumer group name breaks
	// ValidateGroup.
	ErrInvalidGroup = errors.New("retry: invalid group name")
	// ErrBadOptions is returned by New for invalid Options; the error lists
	// every problem.
	ErrBadOptions = errors.New("retry: invalid options")
	// ErrInvalidMax is returned by Redrive when max is less than 1.
	ErrInvalidMax = errors.New("retry: max must be at least 1")
)
