package mqttbench

import "errors"

// Errors of option checking.
var (
	// ErrInvalidOptions is returned by Run, wrapped together with every
	// problem found, when Options do not describe a runnable benchmark.
	ErrInvalidOptions = errors.New("mqttbench: invalid options")
)

// Errors of the payload codec, returned by DecodePayload.
var (
	// ErrPayloadShort is returned when a payload is shorter than the
	// header (PayloadHeaderBytes).
	ErrPayloadShort = errors.New("mqttbench: payload shorter than its header")
	// ErrPayloadMagic is returned when a payload does not start with the
	// magic byte: it was not sent by this tool (or by another version).
	ErrPayloadMagic = errors.New("mqttbench: payload without the bench magic")
	// ErrPayloadTime is returned when a payload's send time is not a
	// positive number of nanoseconds.
	ErrPayloadTime = errors.New("mqttbench: payload send time out of range")
)

// Errors of the lean MQTT client (connect and idle modes).
var (
	// ErrConnackMalformed is returned when the server answers a CONNECT
	// with something other than a 4-byte MQTT 3.1.1 CONNACK.
	ErrConnackMalformed = errors.New("mqttbench: malformed CONNACK")
	// ErrConnackRefused is returned, wrapped with the return code, when
	// the server refuses a connection [MQTT-3.2.2-5].
	ErrConnackRefused = errors.New("mqttbench: connection refused")
	// ErrSubackRefused is returned when a slow subscriber's SUBSCRIBE is
	// refused or answered with something other than a SUBACK.
	ErrSubackRefused = errors.New("mqttbench: subscription refused")
)
