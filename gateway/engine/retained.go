package engine

import (
	"strings"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// retainedTree holds the last retained message of every topic, in a trie
// of topic levels so that a subscription's filter finds its messages in
// one walk [MQTT-3.3.1-5].
type retainedTree struct {
	mu    sync.RWMutex
	root  rnode
	count int
}

type rnode struct {
	kids map[string]*rnode
	msg  *Message
}

// set stores m as its topic's retained message, or clears the topic for an
// empty payload [MQTT-3.3.1-6] [MQTT-3.3.1-7]. It reports whether anything
// changed.
func (t *retainedTree) set(m *Message) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(m.Payload) == 0 {
		return t.clearLocked(m.Topic)
	}
	n := &t.root
	rest := m.Topic
	for {
		level, more, ok := strings.Cut(rest, "/")
		c := n.kids[level]
		if c == nil {
			if n.kids == nil {
				n.kids = map[string]*rnode{}
			}
			c = &rnode{}
			n.kids[level] = c
		}
		n = c
		if !ok {
			break
		}
		rest = more
	}
	if n.msg == nil {
		t.count++
	}
	n.msg = m
	return true
}

func (t *retainedTree) clearLocked(topic string) bool {
	path := []*rnode{&t.root}
	levels := strings.Split(topic, "/")
	n := &t.root
	for _, l := range levels {
		n = n.kids[l]
		if n == nil {
			return false
		}
		path = append(path, n)
	}
	if n.msg == nil {
		return false
	}
	n.msg = nil
	t.count--
	for i := len(levels) - 1; i >= 0; i-- {
		node := path[i+1]
		if node.msg != nil || len(node.kids) > 0 {
			break
		}
		delete(path[i].kids, levels[i])
	}
	return true
}

// get returns the retained message of topic, or nil.
func (t *retainedTree) get(topic string) *Message {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := &t.root
	for _, l := range strings.Split(topic, "/") {
		if n = n.kids[l]; n == nil {
			return nil
		}
	}
	return n.msg
}

// match calls fn for every retained message whose topic filter matches;
// topics starting with '$' do not match a leading wildcard [MQTT-4.7.2-1].
func (t *retainedTree) match(filter string, fn func(*Message)) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	t.root.match(strings.Split(filter, "/"), true, fn)
}

func (n *rnode) match(levels []string, top bool, fn func(*Message)) {
	if len(levels) == 0 {
		if n.msg != nil {
			fn(n.msg)
		}
		return
	}
	l := levels[0]
	switch l {
	case "#":
		if !top && n.msg != nil {
			fn(n.msg) // "a/#" matches "a" [MQTT-4.7.1-2]
		}
		n.all(top, fn)
	case "+":
		for k, c := range n.kids {
			if top && strings.HasPrefix(k, "$") {
				continue
			}
			c.match(levels[1:], false, fn)
		}
	default:
		if c := n.kids[l]; c != nil {
			c.match(levels[1:], false, fn)
		}
	}
}

// all calls fn for every message below n.
func (n *rnode) all(top bool, fn func(*Message)) {
	for k, c := range n.kids {
		if top && strings.HasPrefix(k, "$") {
			continue
		}
		if c.msg != nil {
			fn(c.msg)
		}
		c.all(false, fn)
	}
}

// each calls fn for every retained message.
func (t *retainedTree) each(fn func(*Message)) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.root.msg != nil {
		fn(t.root.msg)
	}
	t.root.all(false, fn)
}

// retain stores a retained message (the session store too).
func (e *Engine) retain(m *Message) {
	if e.retained.set(m) {
		e.storeRetained(m)
	}
}

// sendRetained delivers the retained messages that filter matches to s, with
// RETAIN set [MQTT-3.3.1-8], at most the granted QoS.
func (e *Engine) sendRetained(s *session, filter string, o topictree.Options) {
	var list []*Message
	now := time.Now().Unix()
	e.retained.match(filter, func(m *Message) {
		if !m.expired(now) {
			list = append(list, m)
		}
	})
	var ids []uint32
	if o.Identifier > 0 {
		ids = []uint32{o.Identifier}
	}
	for _, m := range list {
		if e.opts.Hooks.ACL != nil && !e.readable(s, m.Topic) {
			continue
		}
		e.deliver(s, m, min(m.QoS, o.QoS), true, ids)
	}
}
