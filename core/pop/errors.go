package pop

import "errors"

// Errors returned by this package. Pop also returns core.ErrTopicNotFound
// for an unknown topic, retry.ErrInvalidGroup for a bad group name and
// core.ErrClosed after Close, all wrapped. Test with errors.Is.
var (
	// ErrInvalidHandle is returned by Ack and ChangeInvisibleTime for a
	// receipt handle this Service did not issue: empty, garbled, forged
	// (its authentication tag does not match), or issued before a restart.
	ErrInvalidHandle = errors.New("pop: invalid receipt handle")
	// ErrHandleExpired is returned by Ack and ChangeInvisibleTime for a
	// genuine handle that no longer names an invisible message: its
	// invisibility deadline has passed, ChangeInvisibleTime replaced it, or
	// the message was already acknowledged. The call has no effect.
	ErrHandleExpired = errors.New("pop: receipt handle expired")
	// ErrInvisibleTime is returned by Pop and ChangeInvisibleTime for an
	// invisible time outside [Options.MinInvisible, Options.MaxInvisible].
	ErrInvisibleTime = errors.New("pop: invisible time out of bounds")
	// ErrInvalidRequest is returned by Pop for a negative Max or Wait.
	ErrInvalidRequest = errors.New("pop: invalid request")
	// ErrBadOptions is returned by New for invalid Options; the error lists
	// every problem.
	ErrBadOptions = errors.New("pop: invalid options")
)
