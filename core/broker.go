package core

import (
	"context"
	"time"
)

// Broker is the durable queue every other part of ferrymq talks to. The
// embedded engine (core/store) implements it; so will the NATS JetStream
// engine, which is why it speaks only of topics, queues, offsets and IDs,
// never of files.
//
// All methods are safe for concurrent use. After Close every method returns
// ErrClosed.
type Broker interface {
	// Produce stores one message and returns once it is durable under the
	// engine's flush policy (for the embedded engine in sync mode: fsynced).
	// A topic that does not exist is created with default settings unless
	// the engine is configured not to.
	Produce(ctx context.Context, msg *Message) (SendResult, error)
	// ProduceBatch stores msgs in order as one unit of work: on success all
	// are stored, with one durability wait for the batch. On error none of
	// them has been acknowledged (some may still be stored, as with any
	// failed produce: at-least-once). Topics that do not exist are created
	// as by Produce.
	ProduceBatch(ctx context.Context, msgs []*Message) ([]SendResult, error)
	// ProduceAsync stores msgs like ProduceBatch without waiting: the
	// messages are appended before it returns, in call order, so pipelined
	// calls keep per-key order; done is called exactly once, when they are
	// durable under the flush policy or with the error (possibly before
	// ProduceAsync returns). done runs on an engine goroutine and must not
	// block.
	ProduceAsync(msgs []*Message, done func([]SendResult, error))

	// CreateTopic creates a topic, or returns the existing one when its
	// configuration matches (ErrTopicExists otherwise).
	CreateTopic(ctx context.Context, cfg TopicConfig) (TopicInfo, error)
	// ResizeTopic changes a user topic's queue count while it is in use:
	// from its return on, produces pick their queue among the new count; a
	// queue beyond it keeps what it holds, readable until retention takes
	// it. The change begins a new epoch (TopicInfo.Epochs, core/epoch.go):
	// group consumption that honours its barriers (core/group, core/pop)
	// keeps every key's order across it. The same count again changes
	// nothing. ErrTopicNotFound if absent; ErrInvalidTopic for a system
	// topic or a count outside 1..MaxQueues.
	ResizeTopic(ctx context.Context, name string, queues int) (TopicInfo, error)
	// Topic describes one topic; ErrTopicNotFound if absent.
	Topic(ctx context.Context, name string) (TopicInfo, error)
	// Topics lists all topics, sorted by name.
	Topics(ctx context.Context) ([]TopicInfo, error)
	// DeleteTopic deletes a user topic: it is gone at once with its queues
	// and its groups' committed offsets; its messages are never served
	// again, and a topic created later under the same name starts empty.
	// ErrTopicNotFound if absent; a system topic ('%…') or another invalid
	// name is ErrInvalidTopic.
	DeleteTopic(ctx context.Context, name string) error

	// Read returns stored messages of one queue from an offset on, in order.
	// An offset below the queue's minimum is moved up to it and one above its
	// maximum down to it; ReadResult.Clamped says so.
	Read(ctx context.Context, req ReadRequest) (ReadResult, error)
	// Get returns the message with the given ID, or ErrMessageNotFound
	// (ErrCorrupt when the ID points into damaged or unrelated bytes of the
	// engine's storage).
	Get(ctx context.Context, id MessageID) (*StoredMessage, error)
	// FindByKey returns messages of topic whose sharding key or one of whose
	// Keys equals key, oldest first: the oldest q.Max of them.
	FindByKey(ctx context.Context, topic, key string, q KeyQuery) ([]*StoredMessage, error)
	// OffsetAt returns the offset of the first message of the queue stored at
	// or after t; the queue's max offset if there is none.
	OffsetAt(ctx context.Context, topic string, queue int, t time.Time) (int64, error)

	// Backlog counts the messages of one queue stored at offsets ≥ from:
	// a consumer's lag when from is its next offset. Offsets are increasing
	// within a queue but need not be dense (the JetStream engine's are
	// stream sequences shared by the topic's queues), so this, not
	// Range.Max − from, is the count.
	Backlog(ctx context.Context, topic string, queue int, from int64) (int64, error)

	// CommitOffset records a consumer group's progress in one queue: offset
	// is the next message the group wants. Committed offsets persist.
	CommitOffset(ctx context.Context, group, topic string, queue int, offset int64) error
	// CommittedOffset returns what CommitOffset last recorded, or
	// ErrNoCommittedOffset.
	CommittedOffset(ctx context.Context, group, topic string, queue int) (int64, error)

	// Arrivals returns a channel that is closed as soon as new messages of
	// topic (of any topic, for "") become readable after the call.
	// Long-pollers take it, check their queue, then wait on it (and on their
	// deadline), then check again.
	Arrivals(topic string) <-chan struct{}

	// Close stops the engine after making acknowledged data durable.
	Close() error
}

// QueueHeads is implemented by an engine that can tell cheaply, without a
// read, where a queue ends. A long-poller whose topic had an arrival uses it
// to skip re-reading the queues the arrival did not touch.
type QueueHeads interface {
	// QueueHead returns one past the last readable offset of the queue; ok
	// is false for a queue the engine does not know.
	QueueHead(topic string, queue int) (head int64, ok bool)
}

// TopicConfig is how a topic is created.
type TopicConfig struct {
	Name string
	// Queues is the number of queues; 0 means the engine's default (8).
	Queues int
}

// TopicInfo describes a topic and its queues.
type TopicInfo struct {
	Name string
	// Queues is the number of queues producers write to.
	Queues    int
	CreatedAt time.Time
	// Ranges has one entry per queue that can be read: the Queues that take
	// writes, then any a resize retired that still hold messages. Consumers
	// read len(Ranges) queues.
	Ranges []QueueRange
	// Epochs is the topic's history of queue counts, oldest first; the last
	// is the one in force (its Queues equals Queues). A topic never resized
	// has one. Epochs whose messages are all gone may be dropped.
	Epochs []Epoch
}

// QueueRange is the span of offsets a queue holds: messages at offsets
// Min ≤ o < Max are readable (Min moves up as retention deletes old data).
// In the embedded engine every offset in the span holds a message of the
// queue; in the JetStream engine offsets are shared by a topic's queues, so
// a queue's messages are some of them (count them with Broker.Backlog).
type QueueRange struct {
	Min, Max int64
}

// ReadRequest asks for messages of one queue.
type ReadRequest struct {
	Topic  string
	Queue  int
	Offset int64
	// MaxCount bounds the number of messages (0 means 32).
	MaxCount int
	// MaxBytes bounds the total stored size (0 means 4 MiB); at least one
	// message is always returned when one is available.
	MaxBytes int
	// Tags, when non-empty, returns only messages with one of these tags;
	// filtered-out messages still advance NextOffset.
	Tags []string
	// Until, when positive, returns only messages at offsets below it, and
	// NextOffset goes no further than it (an epoch barrier, core.Gate).
	Until int64
	// Reader names who reads — a consumer group, say — for engines that
	// budget reads per reader (the embedded store charges reads from
	// behind its tail cache to the reader's budget, and such a Read may
	// wait for it, as long as ctx allows). Empty: the readers that give no
	// name, together.
	Reader string
}

// ReadResult is what Read found.
type ReadResult struct {
	Messages []*StoredMessage
	// NextOffset is where the next Read should start.
	NextOffset int64
	// Range is the queue's offsets at the time of the read.
	Range QueueRange
	// Clamped is true when the requested offset was outside Range and was
	// moved to its nearest end.
	Clamped bool
	// Epochs is how many of the topic's epochs the engine knew of when it
	// read: every message returned belongs to one of them. A reader holding
	// fewer must learn the new ones (Topic) before it trusts its barriers.
	Epochs int
	// Release, if not nil, lets the engine reuse the memory the messages'
	// bodies are in. A caller done with every byte of them — it encoded
	// them into an answer, say — may call it (once is enough; more are
	// no-ops); one that keeps a message or a body, or hands them on, must
	// not. Leaving it uncalled is always safe.
	Release func()
}

// KeyQuery bounds a FindByKey.
type KeyQuery struct {
	// Begin and End bound the store time (zero: unbounded).
	Begin, End time.Time
	// Max bounds the number of results (0 means 32).
	Max int
}
