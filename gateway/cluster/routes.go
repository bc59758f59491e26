package cluster

import (
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/nats-io/nats.go"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// Routes. The local sessions' filters are counted by client ID: a route is
// one distinct filter (a shared one per group), wanted while at least one
// session holds it, and NATS has it as one or two subscriptions
// (FilterSubjects) in a queue group — this node's for plain filters, the
// group's for shared ones. Hooks change what is wanted under mu and wake
// the reconciler, which alone subscribes and unsubscribes (a NATS call
// never runs on mochi's goroutines) and keeps the active table, under amu,
// in step with what NATS has.
//
// Who holds what: a connected client its subscriptions; an offline
// session its plain ones while mochi keeps it or the session store has it
// parked (Options.Parked), so its node queues what other nodes publish for
// it; shared subscriptions only while connected. A session that moves to
// another node is routed there when it connects (OnSessionEstablished);
// the sweep drops it here.
//
// Lock order: mu, then amu or mochi's locks.

// route is one distinct filter of the local sessions.
type route struct {
	key      string   // the filter as subscribed: "a/+/c", "$share/g/a/#"
	filter   string   // without "$share/{group}/"
	group    string   // "" for a plain route
	queue    string   // NATS queue group
	subjects []string // FilterSubjects(filter)

	n int // sessions holding it; under Hook.mu

	// The reconciler's own: the NATS subscriptions while active.
	subs []*nats.Subscription
}

// newRoute parses key; nil for a filter that is not routed ('$' topics,
// invalid filters, over MaxSubjectBytes).
func (h *Hook) newRoute(key string) *route {
	r := &route{key: key, filter: key, queue: h.plainQ}
	if group, filter, shared := mqtttopic.Unshare(key); shared {
		if group == "" {
			return nil
		}
		r.group, r.filter, r.queue = group, filter, shareQueue(h.opts.Prefix, group, key)
	}
	var ok bool
	if r.subjects, ok = FilterSubjects(h.opts.Prefix, r.filter); !ok {
		return nil
	}
	for _, s := range r.subjects {
		if len(s) > h.opts.MaxSubjectBytes {
			return nil
		}
	}
	return r
}

// routable reports whether key could be a route (without building it).
func routable(key string) bool { return key != "" && (key[0] != '$' || isShared(key)) }

func isShared(key string) bool { _, _, shared := mqtttopic.Unshare(key); return shared }

// addLocked records that client holds key.
func (h *Hook) addLocked(client, key string) {
	if !routable(key) {
		return
	}
	keys := h.clients[client]
	if _, ok := keys[key]; ok {
		return
	}
	r := h.routes[key]
	if r == nil {
		if r = h.newRoute(key); r == nil {
			return
		}
		h.routes[key] = r
	}
	if keys == nil {
		keys = map[string]struct{}{}
		h.clients[client] = keys
	}
	keys[key] = struct{}{}
	if r.n++; r.n == 1 {
		h.markLocked(r)
	}
}

// removeLocked records that client no longer holds key.
func (h *Hook) removeLocked(client, key string) {
	keys := h.clients[client]
	if _, ok := keys[key]; !ok {
		return
	}
	delete(keys, key)
	if len(keys) == 0 {
		delete(h.clients, client)
	}
	if r := h.routes[key]; r != nil {
		if r.n--; r.n == 0 {
			h.markLocked(r)
		}
	}
}

// dropClientLocked drops client's routes: its shared ones only, or all.
func (h *Hook) dropClientLocked(client string, sharedOnly bool) {
	for key := range h.clients[client] {
		if !sharedOnly || isShared(key) {
			h.removeLocked(client, key)
		}
	}
}

func (h *Hook) markLocked(r *route) {
	h.dirty[r] = struct{}{}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// syncClient makes cl's routes what mochi has for it: its subscriptions,
// the shared ones only while it is connected. Read under mu, so that a
// SUBSCRIBE or UNSUBSCRIBE in between (mochi changes the client's map
// before it calls the hook) is neither lost nor undone.
func (h *Hook) syncClient(cl *mqtt.Client) {
	online := cl.Net.Conn != nil && !cl.Closed()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.currentLocked(cl) {
		return
	}
	want := cl.State.Subscriptions.GetAll()
	for key := range h.clients[cl.ID] {
		if _, ok := want[key]; !ok || (!online && isShared(key)) {
			h.removeLocked(cl.ID, key)
		}
	}
	for key := range want {
		if online || !isShared(key) {
			h.addLocked(cl.ID, key)
		}
	}
}

// sweep brings the routes in line with the sessions: mochi's (each as
// syncClient), the parked ones (their plain routes stay), and drops those
// of sessions this node no longer has — expired while parked, taken over
// by another node, ended in a way no hook saw.
func (h *Hook) sweep() {
	held := h.server.Clients.GetAll()
	for _, cl := range held {
		if !cl.Net.Inline {
			h.syncClient(cl)
		}
	}
	h.mu.Lock()
	var gone []string
	for id := range h.clients {
		if _, ok := held[id]; !ok {
			gone = append(gone, id)
		}
	}
	h.mu.Unlock()
	for _, id := range gone {
		parked := h.opts.Parked != nil && h.opts.Parked(id) // the store's lock: not under mu
		h.mu.Lock()
		if _, back := h.server.Clients.Get(id); !back {
			h.dropClientLocked(id, parked)
		}
		h.mu.Unlock()
	}
	if h.opts.ParkedFilters == nil {
		return
	}
	parked := h.opts.ParkedFilters() // the store's lock: not under mu
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, filters := range parked {
		if _, inMochi := held[id]; inMochi {
			continue // syncClient's
		}
		for _, f := range filters {
			if !isShared(f) { // shared subscriptions are served by connected members only
				h.addLocked(id, f)
			}
		}
	}
}

// reconcile is the goroutine that subscribes and unsubscribes: on a kick
// for the routes marked, every SweepInterval after a sweep for all of
// them (retrying what failed). At Close it unsubscribes everything.
func (h *Hook) reconcile() {
	t := time.NewTicker(h.opts.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			h.unsubscribeAll()
			return
		case <-h.kick:
		case <-h.resync:
			h.sweep()
		case <-t.C:
			h.sweep()
			h.mu.Lock()
			for _, r := range h.routes {
				h.dirty[r] = struct{}{}
			}
			h.mu.Unlock()
		}
		h.apply()
	}
}

// apply gives NATS the marked routes: subscribed while wanted, not when
// not; a route no session wants any more is forgotten.
func (h *Hook) apply() {
	h.mu.Lock()
	work := make([]*route, 0, len(h.dirty))
	for r := range h.dirty {
		work = append(work, r)
	}
	clear(h.dirty)
	h.mu.Unlock()
	for _, r := range work {
		if h.ctx.Err() != nil {
			return
		}
		h.mu.Lock()
		want := r.n > 0
		h.mu.Unlock()
		switch {
		case want && r.subs == nil:
			h.subscribe(r)
		case !want && r.subs != nil:
			h.unsubscribe(r)
		}
		h.mu.Lock()
		if r.n == 0 && r.subs == nil && h.routes[r.key] == r {
			delete(h.routes, r.key)
		}
		h.mu.Unlock()
	}
}

// subscribe makes r active: in the table (and, for a shared one, known by
// its queue group) before NATS may deliver for it.
func (h *Hook) subscribe(r *route) {
	h.amu.Lock()
	h.active.insert(r)
	if r.group != "" {
		h.byQueue[r.queue] = r
	}
	h.amu.Unlock()
	subs := make([]*nats.Subscription, 0, len(r.subjects))
	for _, subj := range r.subjects {
		s, err := h.nc.ChanQueueSubscribe(subj, r.queue, h.msgs)
		if err != nil {
			h.log.Warn().Err(err).Str("filter", r.key).Msg("route not subscribed; retried at the next sweep")
			for _, s := range subs {
				h.unsubscribeOne(s)
			}
			h.deactivate(r)
			return
		}
		h.subsMu.Lock()
		h.subs[s] = 0
		h.subsMu.Unlock()
		subs = append(subs, s)
	}
	r.subs = subs
}

func (h *Hook) unsubscribe(r *route) {
	h.deactivate(r)
	for _, s := range r.subs {
		h.unsubscribeOne(s)
	}
	r.subs = nil
}

func (h *Hook) deactivate(r *route) {
	h.amu.Lock()
	h.active.remove(r)
	if h.byQueue[r.queue] == r {
		delete(h.byQueue, r.queue)
	}
	h.amu.Unlock()
}

func (h *Hook) unsubscribeOne(s *nats.Subscription) {
	h.countDrops(s, true)
	if err := s.Unsubscribe(); err != nil && h.nc.IsConnected() {
		h.log.Debug().Err(err).Str("subject", s.Subject).Msg("unsubscribe")
	}
}

func (h *Hook) unsubscribeAll() {
	h.mu.Lock()
	var all []*route
	for _, r := range h.routes {
		if r.subs != nil {
			all = append(all, r)
		}
	}
	h.mu.Unlock()
	for _, r := range all {
		h.unsubscribe(r)
	}
}
