package group

import "errors"

var (
	// ErrInvalidGroup is returned for a group or client ID that is empty, too
	// long, or holds characters other than [A-Za-z0-9._-].
	ErrInvalidGroup = errors.New("group: invalid group or client id")
	// ErrUnknownMember is returned when a client that has not sent a
	// heartbeat (or was expired for missing them) pulls or commits.
	ErrUnknownMember = errors.New("group: unknown member; send a heartbeat first")
	// ErrModeMismatch is returned when a member heartbeats with a mode
	// (clustering or broadcast) other than the group's.
	ErrModeMismatch = errors.New("group: consume mode differs from the group's")
	// ErrNotAssigned is returned when a clustering member pulls or commits a
	// queue that is not assigned to it.
	ErrNotAssigned = errors.New("group: queue not assigned to this member")
	// ErrQueueBusy is returned when a queue is assigned to the member but
	// its previous holder has neither released it nor let its lease expire;
	// try again shortly.
	ErrQueueBusy = errors.New("group: queue still leased by its previous holder")
	// ErrNotSubscribed is returned for a topic none of the group's members
	// subscribes to.
	ErrNotSubscribed = errors.New("group: topic not subscribed by the member")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("group: coordinator closed")
)
