package bridge

import (
	"fmt"
	"strconv"
	"strings"
)

// A template is text with variables, compiled once and expanded per
// message without parsing:
//
//	${clientid}   the publisher's MQTT client ID
//	${username}   the username it connected with ("" if none)
//	${level:N}    the N-th level of the MQTT topic, counting from 1 ("" past the end)
//	${key}        the core message's sharding key (downlink)
//	${prop:NAME}  the core message's property NAME, "" if absent (downlink)
//
// Everything else is literal. "$$" is a literal "$".
type template struct {
	src   string
	parts []part
}

type partKind uint8

const (
	literal partKind = iota
	varClientID
	varUsername
	varLevel
	varKey
	varProp
)

type part struct {
	kind  partKind
	text  string // literal text, or the property name for varProp
	level int    // 1-based topic level for varLevel
}

// vars is what a template expands against.
type vars struct {
	clientID string
	username string
	topic    string
	key      string
	props    map[string]string
}

func parseTemplate(src string) (template, error) {
	t := template{src: src}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, part{kind: literal, text: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(src); i++ {
		c := src[i]
		if c != '$' {
			lit.WriteByte(c)
			continue
		}
		if i+1 < len(src) && src[i+1] == '$' {
			lit.WriteByte('$')
			i++
			continue
		}
		if i+1 >= len(src) || src[i+1] != '{' {
			return template{}, fmt.Errorf("%w: %q: '$' at %d must start ${…} (write $$ for a literal $)", ErrBadTemplate, src, i)
		}
		end := strings.IndexByte(src[i:], '}')
		if end < 0 {
			return template{}, fmt.Errorf("%w: %q: unclosed ${ at %d", ErrBadTemplate, src, i)
		}
		name := src[i+2 : i+end]
		p, err := parseVar(name)
		if err != nil {
			return template{}, fmt.Errorf("%w: %q: %v", ErrBadTemplate, src, err)
		}
		flush()
		t.parts = append(t.parts, p)
		i += end
	}
	flush()
	return t, nil
}

func parseVar(name string) (part, error) {
	switch {
	case name == "clientid":
		return part{kind: varClientID}, nil
	case name == "username":
		return part{kind: varUsername}, nil
	case name == "key":
		return part{kind: varKey}, nil
	case strings.HasPrefix(name, "prop:") && len(name) > len("prop:"):
		return part{kind: varProp, text: name[len("prop:"):]}, nil
	case strings.HasPrefix(name, "level:"):
		n, err := strconv.Atoi(name[len("level:"):])
		if err != nil || n < 1 || n > 64 {
			return part{}, fmt.Errorf("${%s}: level must be 1–64", name)
		}
		return part{kind: varLevel, level: n}, nil
	}
	return part{}, fmt.Errorf("unknown variable ${%s} (want clientid, username, level:N, key or prop:NAME)", name)
}

// constant reports whether the template has no variables.
func (t template) constant() bool {
	return len(t.parts) == 0 || (len(t.parts) == 1 && t.parts[0].kind == literal)
}

func (t template) expand(v *vars) string {
	if len(t.parts) == 1 { // the common case allocates nothing
		return t.parts[0].value(v)
	}
	var b strings.Builder
	for _, p := range t.parts {
		b.WriteString(p.value(v))
	}
	return b.String()
}

func (p part) value(v *vars) string {
	switch p.kind {
	case varClientID:
		return v.clientID
	case varUsername:
		return v.username
	case varLevel:
		return topicLevel(v.topic, p.level)
	case varKey:
		return v.key
	case varProp:
		return v.props[p.text]
	}
	return p.text
}

// topicLevel returns the n-th (1-based) '/'-separated level of topic, or "".
func topicLevel(topic string, n int) string {
	for i := 1; ; i++ {
		j := strings.IndexByte(topic, '/')
		if i == n {
			if j < 0 {
				return topic
			}
			return topic[:j]
		}
		if j < 0 {
			return ""
		}
		topic = topic[j+1:]
	}
}
