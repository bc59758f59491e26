package txn

import "errors"

// Errors returned by this package; broker errors (core.ErrClosed,
// core.ErrStoreFailed, …) are passed through wrapped, and SendHalf returns
// core.ErrInvalidTopic (wrapped) for a bad real topic. Test with errors.Is.
var (
	// ErrNotFound is returned by End for an ID that names no half message:
	// not pending and not a half message stored in HalfTopic (never sent,
	// removed by retention, or from another broker); and by State for an ID
	// whose fate the Service does not know.
	ErrNotFound = errors.New("txn: half message not found")
	// ErrResolved is returned by End for a half that is already committed,
	// rolled back or discarded, or that another End or the checker is
	// resolving right now. The message says which.
	ErrResolved = errors.New("txn: transaction already resolved")
	// ErrGroupMismatch is returned by End when a group is given and the half
	// was sent by another producer group.
	ErrGroupMismatch = errors.New("txn: half message belongs to another producer group")
	// ErrInvalidGroup is returned by SendHalf for a producer group name
	// breaking ValidateGroup.
	ErrInvalidGroup = errors.New("txn: invalid producer group name")
	// ErrTooManyPending is returned by SendHalf while Options.MaxPending
	// halves are unresolved; nothing was stored.
	ErrTooManyPending = errors.New("txn: too many pending transactions")
	// ErrInvalidAction is returned by End for an Action other than Commit,
	// Rollback and Unknown.
	ErrInvalidAction = errors.New("txn: invalid action")
	// ErrNotStarted is returned by SendHalf and End before Start has
	// succeeded: until recovery has run the Service cannot tell a pending
	// half from a resolved one.
	ErrNotStarted = errors.New("txn: service not started")
	// ErrClosed is returned by Start, SendHalf and End after Close.
	ErrClosed = errors.New("txn: service closed")
	// ErrBadOptions is returned by New for invalid Options; the error lists
	// every problem.
	ErrBadOptions = errors.New("txn: invalid options")
)
