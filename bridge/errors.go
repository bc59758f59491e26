package bridge

import "errors"

// Configuration errors, returned by New and the rule parsers.
var (
	// ErrBadRule is returned for an uplink or downlink rule that cannot
	// work: a bad filter, a missing topic.
	ErrBadRule = errors.New("bridge: bad rule")
	// ErrBadTemplate is returned for a template with an unknown variable,
	// an unclosed ${ or a stray $.
	ErrBadTemplate = errors.New("bridge: bad template")
)

// Why an MQTT publish is not bridged: it stays MQTT-only. Counted by reason.
var (
	// ErrNoRule is returned by Uplink.Map when no rule matches the topic.
	ErrNoRule = errors.New("bridge: no uplink rule matches")
	// ErrInvalidCoreTopic is returned by Uplink.Map when the rule's topic
	// template expands to a name the core refuses (e.g. an MQTT first level
	// with characters outside [A-Za-z0-9._-]).
	ErrInvalidCoreTopic = errors.New("bridge: not a valid core topic")
)
