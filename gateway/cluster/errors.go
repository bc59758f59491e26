package cluster

import "errors"

var (
	// ErrBadOptions is returned by New for options that cannot work (no
	// connection, no node name, a prefix that is not a plain subject).
	ErrBadOptions = errors.New("cluster: bad options")
	// ErrBadMessage is returned when a message from another node has
	// headers this node cannot read (another format version, a value out
	// of range); the message is dropped and counted.
	ErrBadMessage = errors.New("cluster: bad message from another node")
	// ErrNotRouted is returned by Topic for a subject that no routed topic
	// maps to.
	ErrNotRouted = errors.New("cluster: subject is not a routed MQTT topic")
)
