package cluster

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// DefaultPrefix is the first token of every subject a routed MQTT message
// travels under.
const DefaultPrefix = "fmqmqtt"

// escapeMark starts a token that carries an encoded level: '~' followed by
// the level's bytes in unpadded base64url. A plain level never contains it.
const escapeMark = '~'

var b64 = base64.RawURLEncoding.Strict()

// plain reports whether level travels as itself: one or more of
// [A-Za-z0-9_-], which are valid in any NATS token and never '~'.
func plain(level string) bool {
	if level == "" {
		return false
	}
	for i := 0; i < len(level); i++ {
		c := level[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Token maps one MQTT topic level to one NATS subject token: a plain level
// ([A-Za-z0-9_-]+) as itself, any other — empty, with '.', '*', '>',
// spaces, '$', '~', any UTF-8 — as '~' + its bytes in unpadded base64url.
// Distinct levels give distinct tokens, and every token is a valid literal
// NATS token.
func Token(level string) string {
	if plain(level) {
		return level
	}
	return string(appendToken(nil, level))
}

func appendToken(b []byte, level string) []byte {
	if plain(level) {
		return append(b, level...)
	}
	b = append(b, escapeMark)
	return b64.AppendEncode(b, []byte(level))
}

// level decodes one token; false for a token Token never produces.
func level(tok string) (string, bool) {
	if tok == "" {
		return "", false
	}
	if tok[0] != escapeMark {
		return tok, plain(tok)
	}
	v, err := b64.DecodeString(tok[1:])
	if err != nil || plain(string(v)) { // a plain level is never encoded
		return "", false
	}
	return string(v), true
}

// Routed reports whether topic is routed between nodes: a valid topic name
// (not empty, no wildcard) that does not start with '$' ($SYS, the
// gateway's own $ferrymq/ namespace, $delayed/).
func Routed(topic string) bool {
	return topic != "" && topic[0] != '$' && !strings.ContainsAny(topic, "+#")
}

// Subject is the subject topic is published on between nodes: prefix, then
// one token per level (Token). ok is false for a topic that is not Routed.
func Subject(prefix, topic string) (subject string, ok bool) {
	if !Routed(topic) {
		return "", false
	}
	return string(appendSubject(make([]byte, 0, len(prefix)+len(topic)+8), prefix, topic)), true
}

func appendSubject(b []byte, prefix, topic string) []byte {
	b = append(b, prefix...)
	for {
		l, rest, more := strings.Cut(topic, "/")
		b = append(b, '.')
		b = appendToken(b, l)
		if !more {
			return b
		}
		topic = rest
	}
}

// Topic maps a subject made by Subject back to its topic; ErrNotRouted for
// any other subject (another prefix, a token Token never produces).
func Topic(prefix, subject string) (string, error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok || prefix == "" {
		return "", fmt.Errorf("%w: %q", ErrNotRouted, subject)
	}
	var b strings.Builder
	b.Grow(len(rest))
	for i := 0; ; i++ {
		tok, next, more := strings.Cut(rest, ".")
		l, ok := level(tok)
		if !ok {
			return "", fmt.Errorf("%w: %q: token %q", ErrNotRouted, subject, tok)
		}
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(l)
		if !more {
			break
		}
		rest = next
	}
	t := b.String()
	if !Routed(t) {
		return "", fmt.Errorf("%w: %q: topic %q", ErrNotRouted, subject, t)
	}
	return t, nil
}

// FilterSubjects are the subjects whose subscriptions together receive what
// the MQTT filter matches: '+' becomes '*'; a last level '#' becomes '>'
// and, because "a/#" matches "a" too [MQTT-4.7.1-2], the subject of the
// parent level as well ("a/#" → prefix.a and prefix.a.>; "#" → prefix.>,
// every topic having a level). The two never match the same subject. ok is
// false for an invalid filter, a shared one, or one starting with '$'
// (those topics are not Routed).
func FilterSubjects(prefix, filter string) (subjects []string, ok bool) {
	if filter == "" || filter[0] == '$' || mqtttopic.ValidFilter(filter) != nil {
		return nil, false
	}
	if filter == "#" {
		return []string{prefix + ".>"}, true
	}
	b := make([]byte, 0, len(prefix)+len(filter)+8)
	b = append(b, prefix...)
	for {
		l, rest, more := strings.Cut(filter, "/")
		switch l {
		case "#":
			parent := string(b)
			return []string{parent, parent + ".>"}, true
		case "+":
			b = append(b, '.', '*')
		default:
			b = append(b, '.')
			b = appendToken(b, l)
		}
		if !more {
			return []string{string(b)}, true
		}
		filter = rest
	}
}

// validPrefix: one or more dot-separated plain tokens.
func validPrefix(p string) bool {
	for {
		t, rest, more := strings.Cut(p, ".")
		if !plain(t) {
			return false
		}
		if !more {
			return true
		}
		p = rest
	}
}

// nodeQueue is the queue group of every plain route of node: NATS hands a
// message to one member of a queue group, so a node whose filters overlap
// ("cars/+/cmd" and "cars/#") gets each message once.
func nodeQueue(prefix, node string) string { return prefix + ".node." + Token(node) }

// shareQueue is the queue group of the shared subscription key
// ("$share/{group}/{filter}", as the client wrote it): the same on every
// node, so NATS hands each message to one node of the group. The group is
// in it for people reading the server's monitoring; the hash of the whole
// key tells two filters of one group apart.
func shareQueue(prefix, group, key string) string {
	sum := sha256.Sum256([]byte(key))
	return prefix + ".share." + Token(group) + "." + hex.EncodeToString(sum[:8])
}
