package session

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
)

// Keys in the bucket. NATS KV keys are dot-separated tokens of
// [-/_=.A-Za-z0-9], so every client ID, filter and topic — arbitrary UTF-8,
// dots, slashes, wildcards — becomes one token:
//
//	token(s) = base64url(s), unpadded    when that is at most maxTokenBytes
//	         = "=" + hex(SHA-256(s))     otherwise (65 bytes)
//	         = "="                       for the empty string
//
// The forms cannot be confused ('=' is not in the base64url alphabet). A
// hashed token is not reversible: what it stands for is read from the
// value (the owner record carries the client ID, a subscription its
// filter, a retained message its topic) and checked against the key.
//
//	key                       value                                     the log's key
//	o.<client>                owner record (below)                      —
//	c.<client>                mochi storage.Client, JSON                c/<client>
//	d.<client>                when it went offline, 8 bytes BE unix s    d/<client>
//	s.<client>.<filter>       mochi storage.Subscription, JSON          s/<client>\0<filter>
//	i.<client>.<packet id>    queued message (codec.go); id 4 hex digits i/<client>\0<id>
//	r.<topic>                 mochi storage.Message, JSON                r/<topic>
//
// These are part of the format.
const (
	kvOwner       = "o."
	kvClient      = "c."
	kvGone        = "d."
	kvSub         = "s."
	kvInflight    = "i."
	kvRetained    = "r."
	maxTokenBytes = 128
)

// token is s as one KV key token.
func token(s string) string {
	if s == "" {
		return "="
	}
	if base64.RawURLEncoding.EncodedLen(len(s)) <= maxTokenBytes {
		return base64.RawURLEncoding.EncodeToString([]byte(s))
	}
	sum := sha256.Sum256([]byte(s))
	return "=" + hex.EncodeToString(sum[:])
}

func ownerKey(id string) string { return kvOwner + token(id) }

// kvKey maps a key of the store's scheme (store.go) to the bucket's, and
// returns the session it belongs to ("" for a retained message).
func kvKey(key string) (kk, id string, err error) {
	if len(key) < 2 {
		return "", "", fmt.Errorf("%w: %q", ErrBadKey, key)
	}
	prefix, rest := key[:2], key[2:]
	switch prefix {
	case kRetained:
		return kvRetained + token(rest), "", nil
	case kClient:
		return kvClient + token(rest), rest, nil
	case kGone:
		return kvGone + token(rest), rest, nil
	}
	id, sub, ok := strings.Cut(rest, "\x00")
	switch {
	case ok && prefix == kSub:
		return kvSub + token(id) + "." + token(sub), id, nil
	case ok && prefix == kInflight && len(sub) == 2:
		return fmt.Sprintf("%s%s.%04x", kvInflight, token(id), binary.BigEndian.Uint16([]byte(sub))), id, nil
	}
	return "", "", fmt.Errorf("%w: %q", ErrBadKey, key)
}

// logicalKey maps key, one of session id's keys read from the bucket with
// value, back to the store's scheme. It checks that the key is the one
// the value belongs under.
func logicalKey(id, key string, value []byte) (string, error) {
	tok := token(id)
	bad := func(why string) error { return fmt.Errorf("%w: %q of client %q: %s", ErrBadKey, key, id, why) }
	kind, rest, ok := strings.Cut(key, ".")
	if !ok || len(kind) != 1 {
		return "", bad("no kind")
	}
	owner, sub, hasSub := strings.Cut(rest, ".")
	if owner != tok {
		return "", bad("another client's key")
	}
	switch kind + "." {
	case kvClient:
		if !hasSub {
			return clientKey(id), nil
		}
	case kvGone:
		if !hasSub && len(value) == 8 {
			return kGone + id, nil
		}
	case kvSub:
		if hasSub {
			var s storage.Subscription
			if err := s.UnmarshalBinary(value); err != nil {
				return "", fmt.Errorf("%w: %w", errBadValue, err)
			}
			if token(s.Filter) != sub {
				return "", bad("its subscription is for " + fmt.Sprintf("%q", s.Filter))
			}
			return subKey(id, s.Filter), nil
		}
	case kvInflight:
		if b, err := hex.DecodeString(sub); hasSub && err == nil && len(sub) == 4 && strings.ToLower(sub) == sub {
			return inflightKey(id, binary.BigEndian.Uint16(b)), nil
		}
	}
	return "", bad("not a session key")
}

// decodeRetained decodes the value of the retained key r.<tok>, checking
// that the message's topic is the key's.
func decodeRetained(tok string, value []byte) (storage.Message, error) {
	var m storage.Message
	if err := m.UnmarshalBinary(value); err != nil {
		return m, fmt.Errorf("%w: %w", errBadValue, err)
	}
	if m.TopicName == "" || token(m.TopicName) != tok {
		return m, fmt.Errorf("%w: retained message for %q under %q", ErrBadKey, m.TopicName, tok)
	}
	return m, nil
}

// The owner record, value of o.<client>: who serves the session. Written
// by the node a client connects to (kv.Create or kv.Update with the
// revision it read), so exactly one node holds each revision; every
// write of the session's other keys is fenced by it (kv.go). Big-endian:
//
//	offset  size  field
//	0       1     magic 0xF6
//	1       1     version 1
//	2       8     generation: the node's connection counter
//	10      8     incarnation: random, one per process
//	18      8     since, unix nanoseconds
//	26      2     node ID length n (1 … 1024)
//	28      n     node ID
//	28+n    2     client ID length k (0 … 65535)
//	30+n    k     client ID
//
// These are part of the format.
const (
	ownerMagic   = 0xF6
	ownerVersion = 1
	ownerFixed   = 30
	maxNodeBytes = 1024
)

// owner is a decoded owner record.
type owner struct {
	gen   uint64
	inc   uint64
	since int64
	node  string
	id    string
}

func encodeOwner(o owner) []byte {
	b := make([]byte, 0, ownerFixed+len(o.node)+len(o.id))
	b = append(b, ownerMagic, ownerVersion)
	b = binary.BigEndian.AppendUint64(b, o.gen)
	b = binary.BigEndian.AppendUint64(b, o.inc)
	b = binary.BigEndian.AppendUint64(b, uint64(o.since))
	b = binary.BigEndian.AppendUint16(b, uint16(len(o.node)))
	b = append(b, o.node...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(o.id)))
	return append(b, o.id...)
}

// decodeOwner decodes an owner record, checking magic, version, then
// lengths; it never panics.
func decodeOwner(b []byte) (owner, error) {
	var o owner
	switch {
	case len(b) < ownerFixed:
		return o, fmt.Errorf("%w: owner record of %d bytes", errBadValue, len(b))
	case b[0] != ownerMagic:
		return o, fmt.Errorf("%w: owner record magic %#x", errBadValue, b[0])
	case b[1] != ownerVersion:
		return o, fmt.Errorf("%w: owner record version %d", errBadValue, b[1])
	}
	o.gen = binary.BigEndian.Uint64(b[2:])
	o.inc = binary.BigEndian.Uint64(b[10:])
	o.since = int64(binary.BigEndian.Uint64(b[18:]))
	n := int(binary.BigEndian.Uint16(b[26:]))
	if n == 0 || n > maxNodeBytes || 28+n+2 > len(b) {
		return owner{}, fmt.Errorf("%w: owner record node length %d", errBadValue, n)
	}
	o.node = string(b[28 : 28+n])
	k := int(binary.BigEndian.Uint16(b[28+n:]))
	if 30+n+k != len(b) {
		return owner{}, fmt.Errorf("%w: owner record client ID length %d in %d bytes", errBadValue, k, len(b))
	}
	o.id = string(b[30+n:])
	return o, nil
}
