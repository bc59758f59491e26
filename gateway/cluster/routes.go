package cluster

import (
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// Routes. The engine tells the router every filter of every session here
// (Subscribed, Unsubscribed — online and offline sessions alike, restored
// and adopted ones too) and when a session gets a connection or loses it
// (Online). A route is one distinct filter (a shared one per group),
// wanted while a session holds it — any session listing a plain filter, a
// connected one a shared filter (groups are served by connected members
// only [MQTT-4.8.2-2]) — and NATS has it as one or two subscriptions
// (FilterSubjects) in a queue group: this node's for plain filters, the
// group's for shared ones. The engine's calls change what is wanted under
// mu and wake the reconciler, which alone subscribes and unsubscribes (a
// NATS call never runs under the engine's locks) and keeps route.active,
// under amu, in step with what NATS has.
//
// Lock order: the engine's session lock, mu, amu.

// route is one distinct filter of the local sessions.
type route struct {
	key      string   // the filter, a shared one as "$share/{group}/{filter}"
	filter   string   // without "$share/{group}/"
	group    string   // "" for a plain route
	share    string   // "{group}/{filter}": the engine's name of the group; "" for a plain route
	queue    string   // NATS queue group
	subjects []string // FilterSubjects(filter)

	refs int // sessions listing it; under mu
	n    int // sessions holding it (a shared one: those connected); under mu

	active bool // NATS has it (or is being given it); under amu

	subs []*nats.Subscription // the reconciler's own: the NATS subscriptions while active
}

// sessionRoutes is what one session of this node holds.
type sessionRoutes struct {
	online bool
	routes []*route
}

// routeKey is the key of filter's route: the filter, a shared one with
// its prefix as "$share/" (the engine matches it in any case).
func routeKey(filter string) string {
	group, inner, shared := mqtttopic.Unshare(filter)
	if !shared || filter[:len("$share/")] == "$share/" {
		return filter
	}
	return "$share/" + group + "/" + inner
}

// newRoute parses key; nil for a filter that is not routed ('$' topics,
// invalid filters, shared ones without a group, over MaxSubjectBytes).
func (r *Router) newRoute(key string) *route {
	rt := &route{key: key, filter: key, queue: r.plainQ}
	if group, filter, shared := mqtttopic.Unshare(key); shared {
		if group == "" {
			return nil
		}
		rt.group, rt.filter, rt.share = group, filter, group+"/"+filter
		rt.queue = shareQueue(r.opts.Prefix, group, key)
	}
	var ok bool
	if rt.subjects, ok = FilterSubjects(r.opts.Prefix, rt.filter); !ok {
		return nil
	}
	for _, s := range rt.subjects {
		if len(s) > r.opts.MaxSubjectBytes {
			return nil
		}
	}
	return rt
}

// Subscribed implements engine.Router: clientID's session holds filter.
// Called under the engine's session lock; it only notes what is wanted.
func (r *Router) Subscribed(clientID, filter string) {
	key := routeKey(filter)
	r.mu.Lock()
	defer r.mu.Unlock()
	rt := r.routes[key]
	if rt == nil {
		if rt = r.newRoute(key); rt == nil {
			return
		}
		r.routes[key] = rt
		r.amu.Lock()
		r.table.insert(rt)
		if rt.group != "" {
			r.byQueue[rt.queue] = rt
		}
		r.amu.Unlock()
	}
	ss := r.sessions[clientID]
	if ss == nil {
		ss = &sessionRoutes{}
		r.sessions[clientID] = ss
	}
	if slices.Contains(ss.routes, rt) {
		return
	}
	ss.routes = append(ss.routes, rt)
	rt.refs++
	if rt.group == "" || ss.online {
		r.holdLocked(rt, 1)
	}
}

// Unsubscribed implements engine.Router: clientID's session no longer
// holds filter (unsubscribed, or the session ended, expired, or moved to
// another node). Called under the engine's session lock.
func (r *Router) Unsubscribed(clientID, filter string) {
	key := routeKey(filter)
	r.mu.Lock()
	defer r.mu.Unlock()
	ss := r.sessions[clientID]
	if ss == nil {
		return
	}
	i := slices.IndexFunc(ss.routes, func(rt *route) bool { return rt.key == key })
	if i < 0 {
		return
	}
	rt := ss.routes[i]
	ss.routes = slices.Delete(ss.routes, i, i+1)
	rt.refs--
	if rt.group == "" || ss.online {
		r.holdLocked(rt, -1)
	}
	if rt.refs == 0 {
		r.markLocked(rt) // to be forgotten
	}
	if len(ss.routes) == 0 && !ss.online {
		delete(r.sessions, clientID)
	}
}

// Online implements engine.RouterPresence: clientID's session got a
// connection here, or lost it. Its shared routes are held only while it is
// connected. Called under the engine's session lock.
func (r *Router) Online(clientID string, online bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ss := r.sessions[clientID]
	if ss == nil {
		if !online {
			return
		}
		ss = &sessionRoutes{}
		r.sessions[clientID] = ss
	}
	if ss.online == online {
		return
	}
	ss.online = online
	delta := 1
	if !online {
		delta = -1
	}
	for _, rt := range ss.routes {
		if rt.group != "" {
			r.holdLocked(rt, delta)
		}
	}
	if !online && len(ss.routes) == 0 {
		delete(r.sessions, clientID)
	}
}

// holdLocked counts one more (delta 1) or one fewer (-1) session holding
// rt; the first and the last change what NATS must have.
func (r *Router) holdLocked(rt *route, delta int) {
	rt.n += delta
	if (delta > 0 && rt.n == 1) || (delta < 0 && rt.n == 0) {
		r.markLocked(rt)
	}
}

func (r *Router) markLocked(rt *route) {
	r.dirty[rt] = struct{}{}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// reconcile is the goroutine that subscribes and unsubscribes: at start
// for every route wanted so far, on a kick for the routes marked, every
// RetryInterval for those NATS refused. At Close it unsubscribes
// everything.
func (r *Router) reconcile() {
	t := time.NewTicker(r.opts.RetryInterval)
	defer t.Stop()
	for {
		r.apply()
		select {
		case <-r.ctx.Done():
			r.unsubscribeAll()
			return
		case <-r.kick:
		case <-t.C:
			r.mu.Lock()
			for rt := range r.failed {
				r.dirty[rt] = struct{}{}
			}
			r.mu.Unlock()
		}
	}
}

// apply gives NATS the marked routes: subscribed while wanted, not when
// not; a route no session lists any more is forgotten.
func (r *Router) apply() {
	r.mu.Lock()
	work := make([]*route, 0, len(r.dirty))
	for rt := range r.dirty {
		work = append(work, rt)
	}
	clear(r.dirty)
	r.mu.Unlock()
	for _, rt := range work {
		if r.ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		want := rt.n > 0
		r.mu.Unlock()
		switch {
		case want && rt.subs == nil:
			r.subscribe(rt)
		case !want && rt.subs != nil:
			r.unsubscribe(rt)
		case !want:
			delete(r.failed, rt)
		}
		r.mu.Lock()
		if rt.refs == 0 && rt.n == 0 && rt.subs == nil && r.routes[rt.key] == rt {
			delete(r.routes, rt.key)
			r.amu.Lock()
			r.table.remove(rt)
			if r.byQueue[rt.queue] == rt {
				delete(r.byQueue, rt.queue)
			}
			r.amu.Unlock()
		}
		r.mu.Unlock()
	}
}

// subscribe makes rt active: marked so before NATS may deliver for it.
func (r *Router) subscribe(rt *route) {
	r.setActive(rt, true)
	subs := make([]*nats.Subscription, 0, len(rt.subjects))
	for _, subj := range rt.subjects {
		s, err := r.nc.ChanQueueSubscribe(subj, rt.queue, r.msgs)
		if err != nil {
			ev := r.log.Debug()
			if _, again := r.failed[rt]; !again {
				ev = r.log.Warn()
			}
			ev.Err(err).Str(logFilter, rt.key).Msg("route not subscribed; tried again later")
			for _, s := range subs {
				r.unsubscribeOne(s)
			}
			r.setActive(rt, false)
			r.failed[rt] = struct{}{}
			return
		}
		r.subsMu.Lock()
		r.subs[s] = 0
		r.subsMu.Unlock()
		subs = append(subs, s)
	}
	rt.subs = subs
	delete(r.failed, rt)
}

func (r *Router) unsubscribe(rt *route) {
	r.setActive(rt, false)
	for _, s := range rt.subs {
		r.unsubscribeOne(s)
	}
	rt.subs = nil
	delete(r.failed, rt)
}

func (r *Router) setActive(rt *route, active bool) {
	r.amu.Lock()
	defer r.amu.Unlock()
	if rt.active == active {
		return
	}
	rt.active = active
	if active {
		r.nActive++
	} else {
		r.nActive--
	}
}

func (r *Router) unsubscribeOne(s *nats.Subscription) {
	r.countDrops(s, true)
	if err := s.Unsubscribe(); err != nil && r.nc.IsConnected() {
		r.log.Debug().Err(err).Str(logSubject, s.Subject).Msg("unsubscribe")
	}
}

func (r *Router) unsubscribeAll() {
	r.mu.Lock()
	var all []*route
	for _, rt := range r.routes {
		if rt.subs != nil {
			all = append(all, rt)
		}
	}
	r.mu.Unlock()
	for _, rt := range all {
		r.unsubscribe(rt)
	}
}
