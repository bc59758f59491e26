package jetstream

import "errors"

// ErrUnavailable means NATS or JetStream does not answer: the engine is not
// ready and produces fail until it does again.
var ErrUnavailable = errors.New("jetstream: unavailable")
