package delay

import "errors"

// Errors returned by this package; broker errors (core.ErrClosed,
// core.ErrStoreFailed, core.ErrMessageNotFound, …) are passed through
// wrapped. Test with errors.Is.
var (
	// ErrDelayTooLong is returned by a produce whose deliver-at time lies
	// further ahead than Options.MaxDelay.
	ErrDelayTooLong = errors.New("delay: deliver-at too far ahead")
	// ErrDeliverAtPast is returned by a produce whose deliver-at time lies
	// more than Options.PastTolerance in the past: a negative delay.
	ErrDeliverAtPast = errors.New("delay: deliver-at in the past")
	// ErrNotDelayed is returned by Cancel for the ID of a message that was
	// never delayed.
	ErrNotDelayed = errors.New("delay: not a delayed message")
	// ErrAlreadyDue is returned by Cancel when the message's time has come:
	// it has been delivered, or is being delivered, and can no longer be
	// cancelled.
	ErrAlreadyDue = errors.New("delay: message already due")
	// ErrAlreadyCancelled is returned by Cancel for a message cancelled
	// before.
	ErrAlreadyCancelled = errors.New("delay: message already cancelled")
	// ErrCancelLog is returned by Cancel after the cancel log failed a write
	// or an fsync: the service refuses further cancels until it is reopened
	// (scheduling and delivery go on).
	ErrCancelLog = errors.New("delay: cancel log failed")
	// ErrBadOptions is returned by New for invalid Options; the error lists
	// every problem.
	ErrBadOptions = errors.New("delay: invalid options")
)
