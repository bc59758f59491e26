package session

import (
	"strings"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// routes finds the parked sessions whose subscriptions match a topic.
// Each filter is filed under its literal head: the whole filter when it has
// no wildcard, else what comes before its first wildcard level ("cars/7/#"
// → "cars/7/", "+/x" → ""). A topic's candidates are the lists under the
// topic itself, under each of its level prefixes ("a/", "a/b/", …), under
// "" and under topic+"/" ("a/#" matches "a"); each candidate is then
// matched in full. Device filters are mostly their own, so a list is
// mostly one entry, and a head is a substring of its filter (no new
// string): a parked subscription costs a map slot and 16 bytes.
type routes map[string][]routeRef

type routeRef struct {
	s   *sess
	sub int32 // index in s.subs
}

// head is the literal part of a filter before its first wildcard level.
func head(filter string) string {
	for i := 0; i < len(filter); i++ {
		if c := filter[i]; (c == '+' || c == '#') && (i == 0 || filter[i-1] == '/') {
			return filter[:i]
		}
	}
	return filter
}

// routable: shared subscriptions are served by the group's online members
// only, and the internal namespace (the point-to-point subscription every
// client gets at connect) is re-created at every connection.
func routable(r *subRef) bool {
	return r.flags&subShared == 0 && !strings.HasPrefix(r.filter, mqtttopic.Internal)
}

func (s *Store) routeLocked(ss *sess) {
	for i := range ss.subs {
		r := &ss.subs[i]
		if !routable(r) {
			r.slot = -1
			continue
		}
		h := head(r.filter)
		list := s.routes[h]
		r.slot = int32(len(list))
		s.routes[h] = append(list, routeRef{ss, int32(i)})
	}
}

func (s *Store) unrouteLocked(ss *sess) {
	for i := range ss.subs {
		r := &ss.subs[i]
		if r.slot < 0 {
			continue
		}
		h := head(r.filter)
		list := s.routes[h]
		last := len(list) - 1
		if int(r.slot) < last {
			moved := list[last]
			list[r.slot] = moved
			moved.s.subs[moved.sub].slot = r.slot
		}
		list[last] = routeRef{}
		if last == 0 {
			delete(s.routes, h)
		} else {
			s.routes[h] = list[:last]
		}
		r.slot = -1
	}
}

// hit is a parked session a topic reaches, with the granted QoS and the
// subscription that grants it.
type hit struct {
	s   *sess
	sub *subRef
}

// matchLocked returns the parked sessions topic reaches, once each, with
// their best matching subscription (highest QoS).
func (s *Store) matchLocked(topic string, hits []hit) []hit {
	s.gen++
	visit := func(list []routeRef) {
		for _, ref := range list {
			r := &ref.s.subs[ref.sub]
			if !mqtttopic.Match(r.filter, topic) {
				continue
			}
			if ref.s.mark != s.gen {
				ref.s.mark = s.gen
				hits = append(hits, hit{ref.s, r})
				continue
			}
			for i := range hits {
				if hits[i].s == ref.s && r.qos > hits[i].sub.qos {
					hits[i].sub = r
				}
			}
		}
	}
	visit(s.routes[topic])
	visit(s.routes[topic+"/"])
	visit(s.routes[""])
	for i := 0; i < len(topic)-1; i++ {
		if topic[i] == '/' {
			visit(s.routes[topic[:i+1]])
		}
	}
	return hits
}
