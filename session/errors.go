package session

import "errors"

// Errors of reading what is stored (Open, Load, LoadMessages, OpenKV, the
// decoders), in the order they are checked.
var (
	// ErrNotSessionLog is returned by Open when dir/sessions.log does not
	// start with a session log header (another file; a log of the
	// mochi-based store, whose first byte is 0xF5, is set aside as
	// sessions.log.v1 instead). The file is not touched.
	ErrNotSessionLog = errors.New("session: not a session log")
	// ErrVersion is returned for a log header, record or value of a format
	// version this build does not read (written by a newer one).
	ErrVersion = errors.New("session: unsupported format version")
	// ErrCorrupt is returned for a header or record whose checksum does not
	// match or whose lengths are out of bounds: bit rot, or a torn write
	// that did not end the file.
	ErrCorrupt = errors.New("session: corrupt record")
	// ErrTorn is returned for a record cut short by the end of the file:
	// the tail a crash leaves mid-write. Open cuts it off.
	ErrTorn = errors.New("session: torn record at the end of the log")
	// ErrBadValue is returned for a record value (client, subscription,
	// message, retained message, offline time, marker, owner record) that
	// does not decode: a length past its end, a QoS of 3, trailing bytes.
	ErrBadValue = errors.New("session: malformed value")
	// ErrBadKey is returned for a key (in the log or the bucket) that is
	// not one of the store's, or not the one its value belongs under.
	ErrBadKey = errors.New("session: bad key")
)

// Errors of writing. The write-through methods of engine.SessionStore
// return nothing: these are logged (sampled), counted in Stats and the
// metrics, and returned by the internal paths the tests reach.
var (
	// ErrValueTooLarge is returned for a value that does not fit the format
	// (a string over 65,535 bytes, a payload over 256 MiB) or, on a
	// bucket, one message (KVOptions.MaxValueBytes). It is not stored.
	ErrValueTooLarge = errors.New("session: record too large to store")
	// ErrLogFailed is returned for every write after a write or fsync of
	// the log failed: the error is sticky, so that the file never holds a
	// hole. It wraps the first error. Reopen the store to recover.
	ErrLogFailed = errors.New("session: the session log failed")
	// ErrClosed is returned for calls on a closed store.
	ErrClosed = errors.New("session: store closed")
)

// Errors of the key-value backend (OpenKV).
var (
	// ErrUnavailable is returned when JetStream did not answer (not
	// connected, timeout, no responders, an API error).
	ErrUnavailable = errors.New("session: key-value bucket unavailable")
	// ErrFenced is returned for a write of a session whose owner record
	// changed since this node claimed it: another node took the session
	// over, and this node's write was refused so as not to clobber its
	// state.
	ErrFenced = errors.New("session: another node owns the session")
	// ErrNotOwner is returned for a write of a session this node holds no
	// claim on (the bucket was unreachable when its client connected);
	// nothing of it is written until the client connects again.
	ErrNotOwner = errors.New("session: this node does not own the session")
	// ErrBacklog is returned for a write that finds KVOptions.MaxBacklog
	// writes queued and not yet acknowledged (JetStream too slow or gone).
	ErrBacklog = errors.New("session: too many writes waiting for the bucket")
	// ErrNotShared is returned by AdoptGone on a store that is not shared
	// (opened with Open rather than OpenKV).
	ErrNotShared = errors.New("session: the store is not shared by nodes")
	// ErrNotAttached is returned by AdoptGone before Attach: adopted
	// sessions are handed to the engine.
	ErrNotAttached = errors.New("session: no engine attached")
)
