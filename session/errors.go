package session

import "errors"

// Errors of Enqueue and Delete.
var (
	// ErrNotParked is returned by Enqueue and Delete when no parked session
	// of that client ID is held by this node.
	ErrNotParked = errors.New("session: no parked session with that client ID")
	// ErrQueueFull is returned by Enqueue when the session's queue is at
	// Options.MaxQueued or MaxQueuedBytes (and for a QoS 0 message).
	ErrQueueFull = errors.New("session: the session's queue is full")
	// ErrNoPackets is returned by Enqueue when every packet ID of the
	// session is taken.
	ErrNoPackets = errors.New("session: no free packet ID in the session")
	// ErrNotStored is returned by Enqueue when the backend did not take the
	// message (the log failed, the bucket is unreachable, the message is
	// too large, this node lost the session); it wraps the backend's error.
	ErrNotStored = errors.New("session: the session store cannot be written")
	// ErrHeld is returned by Delete for a session the MQTT server still
	// holds: its client is connected, went away less than ParkAfter ago,
	// or has a will pending. Disconnect it, wait a moment and delete again.
	ErrHeld = errors.New("session: the session is held by the MQTT server")
)

// Errors of the key-value backend (OpenKV), wrapped by what returns them.
var (
	// ErrValueTooLarge is returned when a record does not fit in one
	// message (KVOptions.MaxValueBytes, JetStream's max payload) or a log
	// key exceeds 64 KiB. The record is not stored; it is counted and
	// logged.
	ErrValueTooLarge = errors.New("session: record too large to store")
	// ErrUnavailable is returned when JetStream did not answer (not
	// connected, timeout, no responders, an API error).
	ErrUnavailable = errors.New("session: key-value bucket unavailable")
	// ErrFenced is returned for a write of a session whose owner record
	// changed since this node claimed it: another node took the session
	// over, and this node's write was refused so as not to clobber its state.
	ErrFenced = errors.New("session: another node owns the session")
	// ErrNotShared is returned by AdoptGone on a store that is not shared
	// (opened with Open rather than OpenKV).
	ErrNotShared = errors.New("session: the store is not shared by nodes")
	// ErrNotOwner is returned for a write of a session this node could not
	// claim (the bucket was unreachable when its client connected); nothing
	// of it is written until the client connects again.
	ErrNotOwner = errors.New("session: this node does not own the session")
	// ErrBadKey is returned for a key in the bucket that is not one of the
	// store's (or not the one its value says).
	ErrBadKey = errors.New("session: bad key")
)
