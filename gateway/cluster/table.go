package cluster

import "strings"

// table finds the routes whose MQTT filter matches a topic name: a trie
// of filter levels, "+" and "#" being children like any level (a topic
// name never has them as levels). It holds the routes of this node's
// sessions, so that a message from another node knows which other copies
// of it may still come and which of this node's shared groups must not
// take it (receive.go). Not safe for concurrent use: Router.amu guards it.
type table struct {
	root tnode
	n    int
}

type tnode struct {
	children map[string]*tnode
	routes   []*route // routes whose filter ends here
}

func (t *table) insert(r *route) {
	n := &t.root
	for l := range strings.SplitSeq(r.filter, "/") {
		c := n.children[l]
		if c == nil {
			if n.children == nil {
				n.children = map[string]*tnode{}
			}
			c = &tnode{}
			n.children[l] = c
		}
		n = c
	}
	n.routes = append(n.routes, r)
	t.n++
}

func (t *table) remove(r *route) {
	if t.removeFrom(&t.root, r, r.filter) {
		t.n--
	}
}

// removeFrom removes r under n, whose remaining filter levels are rest,
// and prunes nodes left empty.
func (t *table) removeFrom(n *tnode, r *route, rest string) bool {
	l, next, more := strings.Cut(rest, "/")
	c := n.children[l]
	if c == nil {
		return false
	}
	var done bool
	if more {
		done = t.removeFrom(c, r, next)
	} else {
		for i, x := range c.routes {
			if x == r {
				last := len(c.routes) - 1
				c.routes[i] = c.routes[last]
				c.routes[last] = nil
				c.routes = c.routes[:last]
				done = true
				break
			}
		}
	}
	if len(c.routes) == 0 && len(c.children) == 0 {
		delete(n.children, l)
	}
	return done
}

// match calls visit for every route whose filter matches topic, once each.
func (t *table) match(topic string, visit func(*route)) {
	t.root.match(topic, true, visit)
}

// match visits the routes under n for the topic levels left in rest
// (none when !more).
func (n *tnode) match(rest string, more bool, visit func(*route)) {
	if h := n.children["#"]; h != nil { // "#" matches the parent level too
		for _, r := range h.routes {
			visit(r)
		}
	}
	if !more {
		for _, r := range n.routes {
			visit(r)
		}
		return
	}
	l, next, nmore := strings.Cut(rest, "/")
	if c := n.children[l]; c != nil && l != "+" && l != "#" {
		c.match(next, nmore, visit)
	}
	if c := n.children["+"]; c != nil {
		c.match(next, nmore, visit)
	}
}

// each calls visit for every route.
func (t *table) each(visit func(*route)) { t.root.each(visit) }

func (n *tnode) each(visit func(*route)) {
	for _, r := range n.routes {
		visit(r)
	}
	for _, c := range n.children {
		c.each(visit)
	}
}
