package listener

import "errors"

// Errors returned by this package. Test with errors.Is.
var (
	// ErrInvalidConfig is returned by Init when the Config or WSConfig breaks
	// a rule; the returned error joins every problem found, each wrapping it.
	ErrInvalidConfig = errors.New("listener: invalid config")
	// ErrClosed is returned by Init on a listener that was already closed.
	ErrClosed = errors.New("listener: closed")
	// ErrAlreadyOpen is returned by a second Init on the same listener.
	ErrAlreadyOpen = errors.New("listener: already open")
	// ErrNotBinary is returned by a websocket connection's Read when the peer
	// sends a text message: MQTT travels only in binary messages
	// [MQTT-6.0.0-1]. The connection is unusable afterwards.
	ErrNotBinary = errors.New("listener: websocket message is not binary")
	// ErrNoCertificates is returned by LoadTLS when the client CA file holds
	// no PEM certificate.
	ErrNoCertificates = errors.New("listener: no certificate in PEM file")
)
