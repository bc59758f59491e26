package session

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
)

// Keys in the bucket. NATS KV keys are dot-separated tokens of
// [-/_=.A-Za-z0-9], so every client ID, filter and topic — arbitrary
// UTF-8, dots, slashes, wildcards — becomes one token:
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
//	bucket key                the log's key (key.go)   value
//	o.<client>                —                        owner record (below)
//	c.<client>                c | client               client record
//	d.<client>                d | client               offline since
//	s.<client>.<filter>       s | client | filter      subscription
//	m.<client>.<pid, 4 hex>   m | client | pid         outbound message
//	p.<client>.<pid, 4 hex>   p | client | pid         PUBREC marker
//	q.<client>.<pid, 4 hex>   q | client | pid         inbound QoS 2 marker
//	r.<topic>                 r | topic                retained message
//
// These are part of the format.
const (
	kvOwner       = "o."
	kvClient      = "c."
	kvOffline     = "d."
	kvSub         = "s."
	kvMessage     = "m."
	kvReleased    = "p."
	kvInbound     = "q."
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

// untoken is the string a token stands for, when it is not hashed.
func untoken(tok string) (string, bool) {
	if tok == "=" {
		return "", true
	}
	if strings.HasPrefix(tok, "=") {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || token(string(b)) != tok {
		return "", false
	}
	return string(b), true
}

func ownerKey(id string) string { return kvOwner + token(id) }

// bucketKey maps a key of the store (key.go) to the bucket's.
func bucketKey(k key) string {
	switch k.kind {
	case kClient:
		return kvClient + token(k.id)
	case kOffline:
		return kvOffline + token(k.id)
	case kSub:
		return kvSub + token(k.id) + "." + token(k.sub)
	case kMessage, kReleased, kInbound:
		return fmt.Sprintf("%c.%s.%04x", k.kind, token(k.id), k.pid)
	case kRetained:
		return kvRetained + token(k.id)
	}
	return ""
}

// sessionSubjects are the bucket keys (wildcards) of every record of
// session id but its owner record.
func sessionSubjects(id string) []string {
	tok := token(id)
	return []string{kvClient + tok, kvOffline + tok, kvSub + tok + ".*", kvMessage + tok + ".*",
		kvReleased + tok + ".*", kvInbound + tok + ".*"}
}

// storeKey maps bucket key bk, one of session id's read with value, back
// to the store's key. It checks that the key is the one the value belongs
// under (a subscription's filter is in its value).
func storeKey(id, bk string, value []byte) (key, error) {
	bad := func(why string) (key, error) {
		return key{}, fmt.Errorf("%w: %q of client %q: %s", ErrBadKey, bk, id, why)
	}
	kind, rest, ok := strings.Cut(bk, ".")
	if !ok || len(kind) != 1 {
		return bad("no kind")
	}
	owner, sub, hasSub := strings.Cut(rest, ".")
	if owner != token(id) {
		return bad("another client's key")
	}
	k := key{kind: kind[0], id: id}
	switch k.kind {
	case kClient, kOffline:
		if !hasSub {
			return k, nil
		}
	case kSub:
		if hasSub {
			filter, _, err := decodeSub(value)
			if err != nil {
				return key{}, err
			}
			if token(filter) != sub {
				return bad(fmt.Sprintf("its subscription is to %q", filter))
			}
			k.sub = filter
			return k, nil
		}
	case kMessage, kReleased, kInbound:
		if b, err := hex.DecodeString(sub); hasSub && err == nil && len(sub) == 4 && strings.ToLower(sub) == sub {
			k.pid = binary.BigEndian.Uint16(b)
			return k, nil
		}
	}
	return bad("not a session key")
}

// The owner record, value of o.<client>: who serves the session. Written
// by the node a client connects to (kv.Create, or kv.Update with the
// revision it read), so exactly one node holds each revision; every write
// of the session's other keys is fenced by it (kv.go). Big-endian:
//
//	offset  size  field
//	0       1     magic 0xF6
//	1       1     version 1
//	2       8     generation: the node's claim counter
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
	case len(b) < 2:
		return o, fmt.Errorf("%w: owner record of %d bytes", ErrBadValue, len(b))
	case b[0] != ownerMagic:
		return o, fmt.Errorf("%w: owner record magic %#02x", ErrBadValue, b[0])
	case b[1] != ownerVersion:
		return o, fmt.Errorf("%w: owner record version %d, this build reads %d", ErrVersion, b[1], ownerVersion)
	case len(b) < ownerFixed:
		return o, fmt.Errorf("%w: owner record of %d bytes", ErrBadValue, len(b))
	}
	o.gen = binary.BigEndian.Uint64(b[2:])
	o.inc = binary.BigEndian.Uint64(b[10:])
	o.since = int64(binary.BigEndian.Uint64(b[18:]))
	n := int(binary.BigEndian.Uint16(b[26:]))
	if n == 0 || n > maxNodeBytes || 28+n+2 > len(b) {
		return owner{}, fmt.Errorf("%w: owner record node length %d", ErrBadValue, n)
	}
	o.node = string(b[28 : 28+n])
	k := int(binary.BigEndian.Uint16(b[28+n:]))
	if 30+n+k != len(b) {
		return owner{}, fmt.Errorf("%w: owner record client ID length %d in %d bytes", ErrBadValue, k, len(b))
	}
	o.id = string(b[30+n:])
	return o, nil
}
