package jetstream

import (
	"errors"
	"fmt"

	"github.com/ferrymq/ferrymq/core"
)

// ErrUnavailable means NATS or JetStream does not answer: the engine is not
// ready and produces fail until it does again.
var ErrUnavailable = errors.New("jetstream: unavailable")

// Resizing a topic (resize.go).
var (
	// ErrTooManyEpochs is returned by ResizeTopic when the topic's epoch
	// history would no longer fit in its stream's metadata.
	ErrTooManyEpochs = fmt.Errorf("jetstream: too many epochs: %w", core.ErrResizeRefused)
	// ErrResizeBusy is returned by ResizeTopic when another resize of the
	// topic (on this or another node) held the topic's resize lock until
	// the caller's deadline.
	ErrResizeBusy = fmt.Errorf("jetstream: topic is being resized: %w", core.ErrResizeRefused)
)
