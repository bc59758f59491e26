package jetstream

import "errors"

// ErrUnavailable means NATS or JetStream does not answer: the engine is not
// ready and produces fail until it does again.
var ErrUnavailable = errors.New("jetstream: unavailable")

// Resizing a topic (resize.go).
var (
	// ErrTooManyEpochs is returned by ResizeTopic when the topic's epoch
	// history would no longer fit in its stream's metadata.
	ErrTooManyEpochs = errors.New("jetstream: too many epochs")
	// ErrResizeBusy is returned by ResizeTopic when another resize of the
	// topic (on this or another node) held the topic's resize lock until
	// the caller's deadline.
	ErrResizeBusy = errors.New("jetstream: topic is being resized")
)
