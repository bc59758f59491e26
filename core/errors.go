package core

import (
	"errors"
	"fmt"
)

// Errors every engine returns for the same conditions. Test with errors.Is.
var (
	// ErrClosed is returned by any operation on a closed Broker.
	ErrClosed = errors.New("core: broker closed")
	// ErrInvalidTopic is returned when a topic name breaks ValidateTopic.
	// The returned error is a *TopicError that wraps it.
	ErrInvalidTopic = errors.New("core: invalid topic name")
	// ErrTopicNotFound is returned when a topic does not exist and is not
	// auto-created (auto-creation is off, or the operation only reads).
	ErrTopicNotFound = errors.New("core: topic not found")
	// ErrTopicExists is returned by CreateTopic for a name already taken
	// with a different configuration.
	ErrTopicExists = errors.New("core: topic exists")
	// ErrResizeRefused is returned by ResizeTopic when the engine cannot
	// change the topic's queue count now: another resize of it is under way
	// (retry later), or its epoch history is full. The returned error says
	// which.
	ErrResizeRefused = errors.New("core: resize refused")
	// ErrQueueNotFound is returned for a queue number outside the topic.
	ErrQueueNotFound = errors.New("core: queue not found")
	// ErrMessageTooLarge is returned when a message's encoded size exceeds
	// the engine's limit.
	ErrMessageTooLarge = errors.New("core: message too large")
	// ErrPropertiesTooLarge is returned when a message's properties and keys
	// exceed the engine's limit.
	ErrPropertiesTooLarge = errors.New("core: properties too large")
	// ErrInvalidMessage is returned for a message that cannot be stored as
	// given (e.g. a property name that is empty, a field longer than its
	// length prefix allows).
	ErrInvalidMessage = errors.New("core: invalid message")
	// ErrMessageNotFound is returned when a lookup by ID or key finds nothing,
	// or the message was removed by retention.
	ErrMessageNotFound = errors.New("core: message not found")
	// ErrInvalidMessageID is returned when a string is not a message ID.
	ErrInvalidMessageID = errors.New("core: invalid message id")
	// ErrCorrupt is returned when stored data fails its checksum or is
	// otherwise damaged. The damaged message is never returned as valid.
	ErrCorrupt = errors.New("core: stored data corrupt")
	// ErrStoreFailed is returned for every write after the store hit an I/O
	// error it cannot recover from (a failed write or fsync, a full disk):
	// the store refuses writes from then on, and acknowledged data stays
	// readable. Reopen the store after fixing the cause.
	ErrStoreFailed = errors.New("core: store failed; writes refused")
	// ErrReadOnly is returned for a write (produce, topic changes) to a
	// read-only engine: a standby over mirrors of another cluster's topics
	// (failover mode 2), which serves consumption, queries and traces only.
	ErrReadOnly = errors.New("core: read-only: this node serves reads from mirrors; produce to the primary")
)

// TopicError describes why a topic name was refused. It wraps ErrInvalidTopic.
type TopicError struct {
	Name   string
	Reason string
}

func (e *TopicError) Error() string {
	return fmt.Sprintf("core: invalid topic name %q: %s", e.Name, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidTopic) hold.
func (e *TopicError) Unwrap() error { return ErrInvalidTopic }

// ErrNoCommittedOffset is returned by CommittedOffset when the group never
// committed an offset for that queue.
var ErrNoCommittedOffset = errors.New("core: no committed offset")

// CorruptError reports a stored message that failed its checks. It wraps
// ErrCorrupt. Readers may skip past it: the messages around it are intact.
type CorruptError struct {
	Topic       string
	Queue       int
	QueueOffset int64
	Err         error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("core: message %s/%d@%d corrupt: %v", e.Topic, e.Queue, e.QueueOffset, e.Err)
}

// Unwrap makes errors.Is(err, ErrCorrupt) hold.
func (e *CorruptError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }
