package store

import "errors"

// Errors of the store's own; errors shared by every engine (ErrClosed,
// ErrCorrupt, ErrStoreFailed, …) live in package core.
var (
	// ErrLocked is returned by Open when another process holds the data
	// directory.
	ErrLocked = errors.New("store: data directory in use by another process")
	// ErrBadOptions is returned by Open for invalid Options; the error lists
	// every problem.
	ErrBadOptions = errors.New("store: invalid options")
	// ErrBadMetadata is returned by Open when a metadata file (topics,
	// checkpoint, offsets) fails its checksum or cannot be parsed.
	ErrBadMetadata = errors.New("store: metadata file damaged")
	// ErrNewerFormat is returned by Open when store.meta names a format
	// newer than this binary reads: the directory was written by a later
	// ferrymq, and nothing in it is touched.
	ErrNewerFormat = errors.New("store: data directory has a newer format")
)

// Internal decoding outcomes, both wrapped into core.ErrCorrupt before they
// leave the package.
var (
	// errShort: fewer bytes than the record needs — at the end of the log
	// this is a torn tail, not corruption.
	errShort = errors.New("record truncated")
	// errBadRecord: the bytes are there but are not a valid record.
	errBadRecord = errors.New("record invalid")
)
