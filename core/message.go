package core

import (
	"strconv"
	"time"
)

// Message is what a producer sends.
type Message struct {
	// Topic names the core topic: 1–127 characters of [A-Za-z0-9._-]
	// (ValidateTopic), or a system topic starting with '%' created by the
	// engine itself.
	Topic string
	// ShardingKey, when set, picks the queue (QueueFor), so that all messages
	// with one key keep their order. Typically a device's client ID.
	ShardingKey string
	// Tag is a single label consumers can filter on server-side, as in RocketMQ.
	Tag string
	// Keys are extra index keys the message can be found by (FindByKey).
	// The sharding key is indexed too.
	Keys []string
	// Properties travel with the message unchanged. Names starting with
	// "mqtt." are set by the MQTT bridge.
	Properties map[string]string
	// Body is the payload; it may be empty (an MQTT publish may carry none).
	Body []byte
	// DeliverAt, when non-zero, asks for delayed delivery at that time.
	DeliverAt time.Time
	// BornAt is when the producer created the message; zero means "now".
	BornAt time.Time
	// ReconsumeCount is set by an engine's retry path when it stores a
	// message again for redelivery; producers leave it 0.
	ReconsumeCount int
}

// StoredMessage is a message as the store holds it.
type StoredMessage struct {
	Message

	// ID names the message and says where it lives.
	ID MessageID
	// Queue is the queue within Topic the message was stored in.
	Queue int
	// QueueOffset is the message's position in that queue, from 0.
	QueueOffset int64
	// CommitLogOffset is the byte offset of the record in the commit log.
	CommitLogOffset int64
	// Size is the size of the stored record in bytes.
	Size int
	// StoredAt is when the store appended the message. Store times never
	// decrease along the commit log.
	StoredAt time.Time
}

// SendResult is what a successful Produce returns.
type SendResult struct {
	ID              MessageID
	Topic           string
	Queue           int
	QueueOffset     int64
	CommitLogOffset int64
	StoredAt        time.Time
}

// QueueFor returns the queue a sharding key maps to among n queues:
// FNV-1a (32-bit) of the key's bytes, modulo n. This function is part of the
// contract: every engine and every client must place keys the same way, so it
// must never change.
func QueueFor(key string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// QueueKeys returns, for each of n queues, a short sharding key that
// QueueFor places on it: the Broker interface picks queues only by key, so
// engine services that keep one queue per level (retry back-off, delayed
// delivery) address their queues with these.
func QueueKeys(n int) []string {
	keys := make([]string, n)
	found := 0
	for j := 0; found < n; j++ {
		k := "%L" + strconv.Itoa(j)
		if q := QueueFor(k, n); keys[q] == "" {
			keys[q] = k
			found++
		}
	}
	return keys
}

// TagHash is the 64-bit hash of a tag kept in consume-queue entries for
// server-side filtering: FNV-1a (64-bit), 0 for no tag (a tag hashing to 0
// is stored as 1). Part of the on-disk format.
func TagHash(tag string) int64 {
	if tag == "" {
		return 0
	}
	v := int64(FNV64a(FNV64Offset, tag))
	if v == 0 {
		v = 1
	}
	return v
}

// FNV64Offset is the FNV-1a 64-bit offset basis, the seed for FNV64a.
const FNV64Offset uint64 = 14695981039346656037

// FNV64a continues an FNV-1a 64-bit hash h over s without allocating.
func FNV64a(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// MaxTopicLen is the longest topic name allowed.
const MaxTopicLen = 127

// ValidateTopic reports whether name is a valid user topic name.
func ValidateTopic(name string) error {
	if reason := NameProblem(name, MaxTopicLen); reason != "" {
		return &TopicError{Name: name, Reason: reason}
	}
	return nil
}

// NameProblem says what is wrong with a topic or group name — it must be 1
// to max characters of [A-Za-z0-9._-] — or "" if nothing is.
func NameProblem(name string, max int) string {
	if name == "" || len(name) > max {
		return "must be 1–" + strconv.Itoa(max) + " characters"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return "may hold only [A-Za-z0-9._-]"
		}
	}
	return ""
}

// ValidateSystemTopic is ValidateTopic for names an engine creates itself: a
// '%' prefix marks them (e.g. "%DLQ%orders"), and '%' may appear inside.
func ValidateSystemTopic(name string) error {
	if len(name) < 2 || len(name) > MaxTopicLen || name[0] != '%' {
		return &TopicError{Name: name, Reason: "system topic must start with '%' and be 2–127 characters"}
	}
	for i := 1; i < len(name); i++ {
		c := name[i]
		if c == '%' {
			continue
		}
		if err := ValidateTopic(string(c)); err != nil {
			return &TopicError{Name: name, Reason: "may hold only [A-Za-z0-9._-%]"}
		}
	}
	return nil
}
