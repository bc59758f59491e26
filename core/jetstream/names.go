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
// costs the same however many devices write to it. After a resize
// (epochs.go) queue q of epoch e ≥ 1 is "fmq.<tok(T)>.<q>.<e>", and the
// stream takes only the current epoch's subjects and its marker subject
// "fmqe.<tok(T)>.<e>". Index keys (the sharding key and Keys) go to the
// index stream FMQ__KEYS, one small entry per key and message under
// "fmqk.<tok(T)>.<keytok>"; arrivals to the core subjects "fmqa.<tok(T)>".
const (
	streamPrefix  = "FMQ_"
	subjectPrefix = "fmq."
	markerPrefix  = "fmqe."
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

// queueSubject is queue's subject in an epoch: epoch 0 keeps the layout of
// topics never resized, later epochs add the epoch as a fourth token.
func queueSubject(tok string, queue, epoch int) string {
	if epoch == 0 {
		return subjectPrefix + tok + "." + strconv.Itoa(queue)
	}
	return subjectPrefix + tok + "." + strconv.Itoa(queue) + "." + strconv.Itoa(epoch)
}

// epochSubjects are the subjects a topic's stream takes in an epoch: its
// queues' and, from epoch 1 on, its marker's.
func epochSubjects(tok string, epoch int) []string {
	if epoch == 0 {
		return []string{topicSubjects(tok)}
	}
	return []string{epochPattern(tok, epoch), markerSubject(tok, epoch)}
}

// epochPattern matches exactly the queue subjects of one epoch.
func epochPattern(tok string, epoch int) string {
	if epoch == 0 {
		return subjectPrefix + tok + ".*"
	}
	return subjectPrefix + tok + ".*." + strconv.Itoa(epoch)
}

// markerSubject is where an epoch's markers are stored (epochs.go).
func markerSubject(tok string, epoch int) string {
	return markerPrefix + tok + "." + strconv.Itoa(epoch)
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

// queueOf parses the queue and the epoch from a message subject of topic
// token tok: "fmq.<tok>.<queue>" (epoch 0) or "fmq.<tok>.<queue>.<epoch>"
// (epoch ≥ 1). Numbers are canonical decimals, so one (queue, epoch) has
// one subject.
func queueOf(tok, subject string) (queue, epoch int, ok bool) {
	rest, found := strings.CutPrefix(subject, subjectPrefix+tok+".")
	if !found {
		return 0, 0, false
	}
	qs, es, four := strings.Cut(rest, ".")
	if queue, ok = decimal(qs); !ok {
		return 0, 0, false
	}
	if !four {
		return queue, 0, true
	}
	if epoch, ok = decimal(es); !ok || epoch == 0 {
		return 0, 0, false
	}
	return queue, epoch, true
}

// decimal parses a canonical non-negative decimal below 2^31.
func decimal(s string) (int, bool) {
	if s == "" || len(s) > 10 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, n < 1<<31
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

// untoken inverts token; ok is false for a string token never makes.
func untoken(tok string) (string, bool) {
	var b strings.Builder
	b.Grow(len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c != '_' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(tok) {
			return "", false
		}
		v, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), true
}
