package shadow

import "errors"

// Errors of a request (wire codes in core/wire: 82, 83, 84, 6).
var (
	// ErrVersionConflict is returned when an update or delete names a
	// version that is not the document's current one (optimistic
	// concurrency): read the document again and retry.
	ErrVersionConflict = errors.New("shadow: version conflict")
	// ErrNotFound is returned when the device has no shadow (never had one,
	// or it was deleted).
	ErrNotFound = errors.New("shadow: no shadow")
	// ErrTooLarge is returned when an update's request or the document it
	// would make exceeds Options.MaxBytes.
	ErrTooLarge = errors.New("shadow: document too large")
	// ErrBadRequest is returned for a request that does not decode: not
	// JSON, not an object, a section that is not an object, too deep, a
	// negative version, an empty or invalid client ID.
	ErrBadRequest = errors.New("shadow: bad request")
)

// Errors of the service.
var (
	// ErrClosed is returned by a Service after Close.
	ErrClosed = errors.New("shadow: closed")
	// ErrBusy is returned when an update lost the race for the same
	// document to other writers too many times in a row: retry.
	ErrBusy = errors.New("shadow: too many concurrent writers")
	// ErrCorrupt is returned by Open when the snapshot file is damaged
	// (bad magic, version, length or CRC) and when a stored record does
	// not decode.
	ErrCorrupt = errors.New("shadow: corrupt record")
)
