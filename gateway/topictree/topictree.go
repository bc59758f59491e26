// Package topictree is the gateway engine's subscription index: a trie of
// MQTT topic filters, one level per node, that finds every subscription
// matching a topic name in one walk.
//
// A filter "a/+/c" is stored along the path a → + → c; "#" is a child of its
// parent level, so "a/#" matches "a" too [MQTT-4.7.1-2]. A topic name
// starting with '$' is not matched by a filter starting with a wildcard
// [MQTT-4.7.2-1]. Shared subscriptions ("$share/{group}/{filter}") live at
// their filter's node in a group; a match hands each message to one member
// of each group, round-robin over the members the caller accepts
// [MQTT-4.8.2-2].
//
// Memory is what a gateway with a million devices needs it to be: a node
// keeps its children in a slice until there are more than a handful (a
// map only for wide levels such as "devices/<id>"), subscriptions in a
// slice, and nothing for what it does not have. A device's own filter
// "devices/car-42/cmd" costs two small nodes.
//
// A Tree is safe for concurrent use: matching takes a read lock, changes a
// write lock.
package topictree

import (
	"strings"
	"sync"
	"sync/atomic"
)

// Options are the per-subscription options of MQTT 5 (§3.8.3.1) and the
// subscription identifier; MQTT 3 subscriptions use QoS only.
type Options struct {
	QoS               byte
	NoLocal           bool
	RetainAsPublished bool
	RetainHandling    byte
	// Identifier is the MQTT 5 subscription identifier, 0 for none.
	Identifier uint32
}

// Visitor receives the subscriptions a topic matches.
type Visitor[V comparable] interface {
	// Subscription is called for every plain subscription that matches.
	Subscription(v V, o Options)
	// Member is offered members of a matching shared group (named by its
	// group and filter, as in "$share/{group}/{filter}") in turn until it
	// returns true (that member takes the message); at most once per
	// member per group.
	Member(group, filter string, v V, o Options) bool
}

// Tree is a subscription trie. The zero Tree is empty and ready.
type Tree[V comparable] struct {
	mu    sync.RWMutex
	root  node[V]
	count int
}

// wideLevel is the number of literal children past which a node indexes
// them in a map.
const wideLevel = 8

type node[V comparable] struct {
	level  string
	parent *node[V]
	kids   []*node[V]          // literal children while few
	index  map[string]*node[V] // literal children once many (kids then nil)
	plus   *node[V]
	hash   *node[V]
	subs   []entry[V]
	groups []*group[V]
}

type entry[V comparable] struct {
	v V
	o Options
}

type group[V comparable] struct {
	name    string
	filter  string
	members []entry[V]
	next    atomic.Uint32
}

// Add subscribes v to filter (a "$share/{group}/{filter}" filter joins the
// group) with options o, replacing v's options if it already holds that
// subscription; existed reports that case [MQTT-3.8.4-3]. The filter must
// be valid (mqtttopic.ValidFilter); a shared filter must name a group.
func (t *Tree[V]) Add(filter string, v V, o Options) (existed bool) {
	group, f, shared := splitShare(filter)
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.path(f, true)
	if shared {
		g := n.group(group, true)
		g.filter = f
		for i := range g.members {
			if g.members[i].v == v {
				g.members[i].o = o
				return true
			}
		}
		g.members = append(g.members, entry[V]{v: v, o: o})
		t.count++
		return false
	}
	for i := range n.subs {
		if n.subs[i].v == v {
			n.subs[i].o = o
			return true
		}
	}
	n.subs = append(n.subs, entry[V]{v: v, o: o})
	t.count++
	return false
}

// Remove unsubscribes v from filter; it reports whether v held it.
func (t *Tree[V]) Remove(filter string, v V) bool {
	group, f, shared := splitShare(filter)
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.path(f, false)
	if n == nil {
		return false
	}
	removed := false
	if shared {
		if g := n.group(group, false); g != nil {
			g.members, removed = without(g.members, v)
			if len(g.members) == 0 {
				n.dropGroup(g)
			}
		}
	} else {
		n.subs, removed = without(n.subs, v)
	}
	if removed {
		t.count--
		n.prune()
	}
	return removed
}

// Len returns the number of subscriptions held.
func (t *Tree[V]) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.count
}

// Match walks every subscription that matches the topic name.
func (t *Tree[V]) Match(topic string, vis Visitor[V]) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	dollar := topic != "" && topic[0] == '$'
	t.root.match(topic, !dollar, vis)
}

// Filters calls fn for every subscription held, with its filter as given
// to Add; fn must not call into the tree.
func (t *Tree[V]) Filters(fn func(filter string, v V, o Options)) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	t.root.walk(nil, fn)
}

func (n *node[V]) match(rest string, wild bool, vis Visitor[V]) {
	level, more, hasMore := strings.Cut(rest, "/")
	if wild {
		if n.hash != nil {
			n.hash.visit(vis) // "#" matches this level and all below
		}
		if n.plus != nil {
			n.plus.next(more, hasMore, vis)
		}
	}
	if c := n.child(level); c != nil {
		c.next(more, hasMore, vis)
	}
}

// next continues a match below n: the name ended at n's level (!hasMore),
// or goes on with more.
func (n *node[V]) next(more string, hasMore bool, vis Visitor[V]) {
	if !hasMore {
		n.visit(vis)
		if n.hash != nil {
			n.hash.visit(vis) // "a/#" matches "a" [MQTT-4.7.1-2]
		}
		return
	}
	n.match(more, true, vis)
}

func (n *node[V]) visit(vis Visitor[V]) {
	for i := range n.subs {
		vis.Subscription(n.subs[i].v, n.subs[i].o)
	}
	for _, g := range n.groups {
		k := len(g.members)
		start := int(g.next.Add(1)-1) % k
		for i := 0; i < k; i++ {
			e := g.members[(start+i)%k]
			if vis.Member(g.name, g.filter, e.v, e.o) {
				break
			}
		}
	}
}

func (n *node[V]) walk(levels []string, fn func(string, V, Options)) {
	f := strings.Join(levels, "/")
	for _, e := range n.subs {
		fn(f, e.v, e.o)
	}
	for _, g := range n.groups {
		for _, e := range g.members {
			fn("$share/"+g.name+"/"+f, e.v, e.o)
		}
	}
	for _, c := range n.children() {
		c.walk(append(levels, c.level), fn)
	}
}

func (n *node[V]) children() []*node[V] {
	out := append([]*node[V](nil), n.kids...)
	for _, c := range n.index {
		out = append(out, c)
	}
	if n.plus != nil {
		out = append(out, n.plus)
	}
	if n.hash != nil {
		out = append(out, n.hash)
	}
	return out
}

// path returns the node of filter f, creating the nodes on its way if
// create; nil if it does not exist.
func (t *Tree[V]) path(f string, create bool) *node[V] {
	n := &t.root
	for {
		level, rest, more := strings.Cut(f, "/")
		c := n.child(level)
		switch level {
		case "+":
			c = n.plus
		case "#":
			c = n.hash
		}
		if c == nil {
			if !create {
				return nil
			}
			c = &node[V]{level: level, parent: n}
			n.add(c)
		}
		n = c
		if !more {
			return n
		}
		f = rest
	}
}

// child returns the literal child for level, or nil.
func (n *node[V]) child(level string) *node[V] {
	if n.index != nil {
		return n.index[level]
	}
	for _, c := range n.kids {
		if c.level == level {
			return c
		}
	}
	return nil
}

func (n *node[V]) add(c *node[V]) {
	switch c.level {
	case "+":
		n.plus = c
		return
	case "#":
		n.hash = c
		return
	}
	if n.index != nil {
		n.index[c.level] = c
		return
	}
	n.kids = append(n.kids, c)
	if len(n.kids) > wideLevel {
		n.index = make(map[string]*node[V], len(n.kids))
		for _, k := range n.kids {
			n.index[k.level] = k
		}
		n.kids = nil
	}
}

func (n *node[V]) remove(c *node[V]) {
	switch {
	case n.plus == c:
		n.plus = nil
	case n.hash == c:
		n.hash = nil
	case n.index != nil:
		delete(n.index, c.level)
		if len(n.index) == 0 {
			n.index = nil
		}
	default:
		for i, k := range n.kids {
			if k == c {
				n.kids = append(n.kids[:i], n.kids[i+1:]...)
				break
			}
		}
		if len(n.kids) == 0 {
			n.kids = nil
		}
	}
}

// prune removes n and its ancestors while they hold nothing.
func (n *node[V]) prune() {
	for n.parent != nil && len(n.subs) == 0 && len(n.groups) == 0 && len(n.kids) == 0 && n.index == nil && n.plus == nil && n.hash == nil {
		n.parent.remove(n)
		n = n.parent
	}
	if len(n.subs) == 0 {
		n.subs = nil
	}
}

func (n *node[V]) group(name string, create bool) *group[V] {
	for _, g := range n.groups {
		if g.name == name {
			return g
		}
	}
	if !create {
		return nil
	}
	g := &group[V]{name: name}
	n.groups = append(n.groups, g)
	return g
}

func (n *node[V]) dropGroup(g *group[V]) {
	for i, x := range n.groups {
		if x == g {
			n.groups = append(n.groups[:i], n.groups[i+1:]...)
			break
		}
	}
	if len(n.groups) == 0 {
		n.groups = nil
	}
}

func without[V comparable](es []entry[V], v V) ([]entry[V], bool) {
	for i := range es {
		if es[i].v == v {
			last := len(es) - 1
			es[i] = es[last]
			es[last] = entry[V]{}
			if last == 0 {
				return nil, true
			}
			return es[:last], true
		}
	}
	return es, false
}

// splitShare splits "$share/{group}/{filter}" (prefix in any case, as the
// gateway has always matched it).
func splitShare(f string) (group, filter string, shared bool) {
	const prefix = "$share/"
	if len(f) < len(prefix) || !strings.EqualFold(f[:len(prefix)], prefix) {
		return "", f, false
	}
	group, filter, _ = strings.Cut(f[len(prefix):], "/")
	return group, filter, true
}
