package session

import (
	"encoding/binary"
	"fmt"
)

// Keys. Every record is a put or a delete of one key; the newest record of
// a key wins. A key is its kind, then (for a session's keys) the client ID
// with its u16 length — a client ID may hold any byte, NUL included — then
// what names the record within the session:
//
//	kind  key                               value
//	'c'   c | u16 n | client ID             client record
//	'd'   d | u16 n | client ID             offline since
//	's'   s | u16 n | client ID | filter    subscription
//	'm'   m | u16 n | client ID | u16 pid   outbound message
//	'p'   p | u16 n | client ID | u16 pid   marker: PUBREC received for that message
//	'q'   q | u16 n | client ID | u16 pid   marker: inbound QoS 2 packet ID awaiting PUBREL
//	'r'   r | topic                         retained message
//
// A delete of 'c' deletes the whole session (the log writes that one
// record; the bucket deletes each key). These are part of the format.
const (
	kClient   = 'c'
	kOffline  = 'd'
	kSub      = 's'
	kMessage  = 'm'
	kReleased = 'p'
	kInbound  = 'q'
	kRetained = 'r'
)

// key is a parsed key.
type key struct {
	kind byte
	id   string // client ID; the topic for kRetained
	sub  string // the filter for kSub
	pid  uint16 // for kMessage, kReleased, kInbound
}

func sessionKey(kind byte, id string, rest []byte) string {
	b := make([]byte, 0, 3+len(id)+len(rest))
	b = append(b, kind)
	b = binary.BigEndian.AppendUint16(b, uint16(len(id)))
	b = append(b, id...)
	return string(append(b, rest...))
}

func clientKey(id string) string  { return sessionKey(kClient, id, nil) }
func offlineKey(id string) string { return sessionKey(kOffline, id, nil) }

func subKey(id, filter string) string { return sessionKey(kSub, id, []byte(filter)) }

func pidKey(kind byte, id string, pid uint16) string {
	return sessionKey(kind, id, binary.BigEndian.AppendUint16(nil, pid))
}

func retainedKey(topic string) string { return string(kRetained) + topic }

// parseKey parses a key; it never panics.
func parseKey(s string) (key, error) {
	if len(s) < 2 {
		return key{}, fmt.Errorf("%w: %d bytes", ErrBadKey, len(s))
	}
	k := key{kind: s[0]}
	if k.kind == kRetained {
		k.id = s[1:]
		return k, nil
	}
	if len(s) < 3 {
		return key{}, fmt.Errorf("%w: %d bytes", ErrBadKey, len(s))
	}
	n := int(binary.BigEndian.Uint16([]byte(s[1:3])))
	if 3+n > len(s) {
		return key{}, fmt.Errorf("%w: client ID of %d bytes in a key of %d", ErrBadKey, n, len(s))
	}
	k.id, s = s[3:3+n], s[3+n:]
	switch k.kind {
	case kClient, kOffline:
		if s != "" {
			return key{}, fmt.Errorf("%w: %d bytes after a %c key", ErrBadKey, len(s), k.kind)
		}
	case kSub:
		if s == "" {
			return key{}, fmt.Errorf("%w: subscription key without a filter", ErrBadKey)
		}
		k.sub = s
	case kMessage, kReleased, kInbound:
		if len(s) != 2 {
			return key{}, fmt.Errorf("%w: %c key with %d bytes of packet ID", ErrBadKey, k.kind, len(s))
		}
		k.pid = binary.BigEndian.Uint16([]byte(s))
	default:
		return key{}, fmt.Errorf("%w: kind %#02x", ErrBadKey, k.kind)
	}
	return k, nil
}

// String is the key as stored.
func (k key) String() string {
	switch k.kind {
	case kRetained:
		return retainedKey(k.id)
	case kSub:
		return subKey(k.id, k.sub)
	case kMessage, kReleased, kInbound:
		return pidKey(k.kind, k.id, k.pid)
	}
	return sessionKey(k.kind, k.id, nil)
}
