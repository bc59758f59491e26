package jetstream

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/ferrymq/ferrymq/core"
)

// Names on the NATS side. A core topic T with N queues is one stream
// "FMQ_<tok(T)>" holding subjects "fmq.<tok(T)>.<queue>": a queue is one
// literal subject, so reading it uses the server's per-subject index and
// costs the same however many devices write to it. Index keys (the
// sharding key and Keys) go to the index stream FMQ__KEYS, one small entry
// per key and message under "fmqk.<tok(T)>.<keytok>"; arrivals to the core
// subjects "fmqa.<tok(T)>".
const (
	streamPrefix  = "FMQ_"
	subjectPrefix = "fmq."
	keysStream    = "FMQ__KEYS"
	keysPrefix    = "fmqk."
	arrivalPrefix = "fmqa."
	// maxTokenLen bounds an encoded name; longer ones are replaced by a hash
	// (the real name is in the stream's metadata).
	maxTokenLen = 200
)

// token encodes a topic or group name as one subject token that is also a
// valid part of a stream name: [A-Za-z0-9-] stand for themselves, any other
// byte is '_' and two upper-case hex digits ('.' is "_2E", '%' is "_25").
// The encoding is injective, so distinct names never share a stream.
func token(name string) string {
	var b strings.Builder
	b.Grow(len(name) + 8)
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-':
			b.WriteByte(c)
		default:
			const hexd = "0123456789ABCDEF"
			b.WriteByte('_')
			b.WriteByte(hexd[c>>4])
			b.WriteByte(hexd[c&15])
		}
	}
	if b.Len() > maxTokenLen {
		sum := sha256.Sum256([]byte(name))
		return "H_" + hex.EncodeToString(sum[:16])
	}
	return b.String()
}

func streamName(topic string) string { return streamPrefix + token(topic) }

func queueSubject(tok string, queue int) string {
	return subjectPrefix + tok + "." + strconv.Itoa(queue)
}

func keySubject(tok, key string) string { return keysPrefix + tok + "." + keyToken(key) }

func topicSubjects(tok string) string { return subjectPrefix + tok + ".>" }

// keyToken is the subject token for a key: 16 hex digits of its FNV-1a
// 64-bit hash. Different keys may share one; readers compare the real key.
func keyToken(key string) string {
	var b [16]byte
	h := core.FNV64a(core.FNV64Offset, key)
	const hexd = "0123456789abcdef"
	for i := 15; i >= 0; i-- {
		b[i] = hexd[h&15]
		h >>= 4
	}
	return string(b[:])
}

// queueOf parses the queue from a message subject "fmq.<tok>.<queue>".
func queueOf(subject string) (int, bool) {
	parts := strings.Split(subject, ".")
	if len(parts) != 3 {
		return 0, false
	}
	q, err := strconv.Atoi(parts[2])
	return q, err == nil && q >= 0
}

// topicHash is the 56-bit hash of a topic name kept in message IDs.
func topicHash(topic string) uint64 { return core.FNV64a(core.FNV64Offset, topic) & (1<<56 - 1) }

// IDKindJetStream marks a message ID issued by this engine:
//
//	byte   0     kind (2)
//	bytes  1–7   56-bit FNV-1a hash of the topic name
//	bytes  8–15  stream sequence (big-endian)
//
// Sequences are never reused within a topic — a deleted topic's successor
// starts after the last sequence the old one had — so an ID is unique.
const IDKindJetStream = 2

func newID(topic string, seq uint64) core.MessageID {
	var id core.MessageID
	h := topicHash(topic)
	id[0] = IDKindJetStream
	for i := 7; i >= 1; i-- {
		id[i] = byte(h)
		h >>= 8
	}
	for i := 15; i >= 8; i-- {
		id[i] = byte(seq)
		seq >>= 8
	}
	return id
}

func idParts(id core.MessageID) (hash, seq uint64) {
	for i := 1; i <= 7; i++ {
		hash = hash<<8 | uint64(id[i])
	}
	for i := 8; i <= 15; i++ {
		seq = seq<<8 | uint64(id[i])
	}
	return hash, seq
}
