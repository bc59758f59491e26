package core

// Message size. ferrymq carries a message body of up to MaxBodyBytes
// (4 MiB = 4,194,304 bytes) through every path with its default settings:
// MQTT 3.1.1 and 5 publishes into the core, commands from the core down to
// MQTT devices (and to their offline sessions), the wire protocol, the HTTP
// API, the embedded store and the JetStream engine. docs/gateway.md
// ("Message size") lists each path's limit and the setting that changes it.
//
// A body never travels alone: topic, sharding key, tag, index keys and
// properties come with it (each at most 64 KiB in every encoding), and each
// path frames them its own way. So every path's limit is a whole-message
// limit set to DefaultMaxMessageBytes (or above it), not a body limit: a
// MaxBodyBytes body passes with any metadata the formats allow, and a body
// a little larger may pass too when its metadata is small. Past a path's
// limit the message is refused with a clear error (ErrMessageTooLarge in
// the engines, MQTT reason code 0x95, HTTP 413, a wire error answer).
const (
	// MaxBodyBytes is the largest message body every path accepts with
	// its default settings.
	MaxBodyBytes = 4 << 20
	// EnvelopeBytes is the room above MaxBodyBytes that a whole-message
	// limit leaves for the metadata and framing of a message: 256 KiB,
	// more than a topic, a sharding key, a tag and the properties and keys
	// (each at most 64 KiB) need together with any path's headers.
	EnvelopeBytes = 256 << 10
	// DefaultMaxMessageBytes is the default whole-message limit of the
	// engines (store.max_message_bytes, the JetStream engine's record) and
	// of an MQTT packet: a MaxBodyBytes body plus its envelope.
	DefaultMaxMessageBytes = MaxBodyBytes + EnvelopeBytes
)
