package cluster

import "errors"

// Errors of the router, by phase.
var (
	// ErrBadOptions is returned by New for options that cannot work (no
	// NATS connection, no node name, a prefix that is not a plain subject,
	// negative bounds); it lists every problem.
	ErrBadOptions = errors.New("cluster: bad options")
	// ErrNotAttached is returned by Start when Attach was not called.
	ErrNotAttached = errors.New("cluster: router not attached to an engine")
	// ErrStarted is returned by Start when called twice.
	ErrStarted = errors.New("cluster: router already started")
	// ErrClosed is returned by Start after Close.
	ErrClosed = errors.New("cluster: router closed")

	// ErrBadMessage is returned when a message from another node has
	// headers this node cannot read (another format version, a value out
	// of range); the message is dropped and counted.
	ErrBadMessage = errors.New("cluster: bad message from another node")
	// ErrNotRouted is returned by Topic for a subject that no routed topic
	// maps to.
	ErrNotRouted = errors.New("cluster: subject is not a routed MQTT topic")
)
