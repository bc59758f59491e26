package cluster

import (
	"errors"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Receiving. NATS may hand this node several copies of one message: one
// for its plain routes (one queue group: however many of its filters
// match, one copy) and one per shared group it is chosen for. The engine
// must see the message once — one Engine.PublishRouted, so that no
// subscriber and no offline session gets it twice — told which of this
// node's shared groups must not take it: those whose copy went to another
// node, or that the origin served itself. So the copies are collated
// before delivery.
//
// NATS delivers the messages of one publisher connection to a subscriber
// connection in order, and every copy of one message to one connection is
// written out before anything that publisher sent next. All subscriptions
// share one channel, so the receiver sees the wire order: a message from
// an origin is complete when the next one from that origin arrives. It is
// delivered sooner when nothing more can come — no copy missing for a
// plain route, no shared route of this node matching whose copy has not
// come — and otherwise after CollateWait at most (copies already read
// from the connection count first). A copy that comes after its message
// was delivered is late (counted): a plain one is dropped (PublishRouted
// delivered the message to the plain subscribers already); a shared
// group's is delivered to that group alone when no plain subscription here
// matches, and dropped (counted) otherwise — a duplicate for those
// subscribers would be worse.

// delivery is one message from another node for the local engine.
type delivery struct {
	m      *engine.Message
	skip   []string // this node's shared groups ("group/filter") that must not take it
	retain bool     // retain it here (Options.LocalRetain; first delivery only)
	size   int
}

// pending is the last message from one origin node, while its copies come.
type pending struct {
	id     uint64
	m      *engine.Message
	size   int
	want   bool     // a plain copy will come (an active plain route matches)
	plain  bool     // a plain copy came
	shares []string // shared groups ("group/filter") whose copy may come: active here, not served at the origin
	groups []string // those whose copy came
	// local are all of this node's shared groups matching (every route the
	// sessions here list, active or not: an engine member whose route NATS
	// does not have yet has no copy coming either); localPlain: a plain
	// route matches.
	local      []string
	localPlain bool
	sent       bool // delivered
	deadline   time.Time
}

// complete: no copy can come any more.
func (p *pending) complete() bool {
	return (!p.want || p.plain) && len(p.groups) == len(p.shares)
}

// receiveLoop reads every subscription's deliveries, collates the copies
// of each message and queues it for injectLoop.
func (r *Router) receiveLoop() {
	last := map[string]*pending{} // by origin
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	prune := time.NewTicker(time.Second)
	defer prune.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case m := <-r.msgs:
			r.receive(last, m)
		case <-timer.C:
			r.drain(last)
			now := time.Now()
			for _, p := range last {
				if !p.sent && !p.deadline.IsZero() && !now.Before(p.deadline) {
					r.deliver(p)
				}
			}
		case now := <-prune.C:
			for origin, p := range last {
				if p.sent && now.Sub(p.deadline) > time.Second {
					delete(last, origin) // its late copies are long past
				}
			}
		}
		var next time.Time
		for _, p := range last {
			if !p.sent && !p.deadline.IsZero() && (next.IsZero() || p.deadline.Before(next)) {
				next = p.deadline
			}
		}
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
	}
}

// drain takes what the channel holds already, before a deadline passes:
// a copy that is here is not late.
func (r *Router) drain(last map[string]*pending) {
	for range cap(r.msgs) {
		select {
		case m := <-r.msgs:
			r.receive(last, m)
		default:
			return
		}
	}
}

func (r *Router) receive(last map[string]*pending, nm *nats.Msg) {
	w, err := decodeMessage(nm.Header)
	if err != nil {
		r.m.drop(dropBad)
		r.log.Debug().Err(err).Str(logSubject, nm.Subject).Msg("message from another node dropped")
		return
	}
	if w.origin == r.opts.Node {
		return // delivered here when it was published
	}
	p := last[w.origin]
	if p != nil && p.id != w.id {
		if !p.sent {
			r.deliver(p) // complete: the origin's next message is here
		}
		p = nil
	}
	share := "" // the shared group this copy is for; "" for the plain copy
	if q := nm.Sub.Queue; q != r.plainQ {
		r.amu.RLock()
		if rt := r.byQueue[q]; rt != nil {
			share = rt.share
		}
		r.amu.RUnlock()
		if share == "" || slices.Contains(w.served, q) {
			return // gone since, or served at the origin
		}
	}
	if p == nil {
		if p = r.collate(nm, &w); p == nil {
			return
		}
		last[w.origin] = p
	}
	switch {
	case share == "" && p.plain, share != "" && slices.Contains(p.groups, share):
		return // a copy already taken (a subscription replaced meanwhile)
	case share == "":
		p.plain = true
	default:
		p.groups = append(p.groups, share)
		if !slices.Contains(p.shares, share) {
			p.shares = append(p.shares, share)
		}
	}
	if p.sent {
		r.late(p, share)
		return
	}
	if p.complete() {
		r.deliver(p)
	} else if p.deadline.IsZero() {
		p.deadline = time.Now().Add(r.opts.CollateWait)
	}
}

// collate starts collating a message: which copies of it may come.
func (r *Router) collate(nm *nats.Msg, w *message) *pending {
	topic, err := Topic(r.opts.Prefix, nm.Subject)
	if err != nil {
		r.m.drop(dropBad)
		r.log.Debug().Err(err).Msg("message from another node dropped")
		return nil
	}
	if !utf8.ValidString(topic) || strings.IndexByte(topic, 0) >= 0 {
		r.m.drop(dropBad) // no engine would have published it [MQTT-1.5.4-1] [MQTT-1.5.4-2]
		return nil
	}
	p := &pending{id: w.id, m: w.engineMessage(topic, nm.Data, time.Now()), size: len(nm.Data) + len(topic) + 256}
	r.amu.RLock()
	r.table.match(topic, func(rt *route) {
		if rt.group == "" {
			p.localPlain = true
			p.want = p.want || rt.active
			return
		}
		if !slices.Contains(p.local, rt.share) {
			p.local = append(p.local, rt.share)
		}
		if rt.active && !slices.Contains(w.served, rt.queue) && !slices.Contains(p.shares, rt.share) {
			p.shares = append(p.shares, rt.share)
		}
	})
	r.amu.RUnlock()
	return p
}

// deliver queues p's message for the engine: to the plain subscribers and
// the shared groups whose copy came.
func (r *Router) deliver(p *pending) {
	p.sent = true
	p.deadline = time.Now()
	r.queue(delivery{m: p.m, skip: p.skip(p.groups), retain: r.opts.LocalRetain, size: p.size})
}

// skip are p's local groups but those in take.
func (p *pending) skip(take []string) []string {
	var out []string
	for _, g := range p.local {
		if !slices.Contains(take, g) {
			out = append(out, g)
		}
	}
	return out
}

// late handles a copy that came after its message was delivered.
func (r *Router) late(p *pending, share string) {
	r.m.late.Inc()
	if share == "" {
		return // the plain subscribers had it with the message
	}
	if p.localPlain {
		r.m.drop(dropLate)
		return
	}
	r.queue(delivery{m: p.m, skip: p.skip([]string{share}), size: p.size})
}

func (r *Router) queue(d delivery) {
	if !r.in.push(d, d.size) {
		r.m.drop(dropInjectFull)
	}
}

// injectLoop hands the collated messages to the engine (PublishRouted:
// delivered with the engine's QoS handling and queued for offline
// sessions, not routed back, not bridged again — the origin's core has it).
func (r *Router) injectLoop() {
	var batch []delivery
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.in.ready:
		}
		batch, _ = r.in.take(batch)
		for i := range batch {
			if r.ctx.Err() != nil {
				return
			}
			d := &batch[i]
			if err := r.eng.PublishRouted(d.m, d.skip, d.retain); err != nil {
				if errors.Is(err, engine.ErrClosed) {
					r.m.drop(dropClosed)
				} else {
					r.m.drop(dropInject)
					r.log.Debug().Err(err).Str(logTopic, d.m.Topic).Msg("message from another node not delivered")
				}
			} else {
				r.m.received.Inc()
			}
			batch[i] = delivery{}
		}
	}
}

// countDrops counts what the NATS client dropped on s (its pending limit:
// this node read too slowly) since last counted; final forgets s.
func (r *Router) countDrops(s *nats.Subscription, final bool) {
	n, err := s.Dropped()
	r.subsMu.Lock()
	defer r.subsMu.Unlock()
	seen, ok := r.subs[s]
	if !ok {
		return
	}
	if final {
		delete(r.subs, s)
	}
	if err == nil && n > seen {
		r.m.dropped.WithLabelValues(dropPending).Add(float64(n - seen))
		if !final {
			r.subs[s] = n
		}
	}
}

// dropCollector is ferrymq_cluster_dropped_total, with the NATS client's
// drops counted at collection.
type dropCollector Router

func (c *dropCollector) Describe(ch chan<- *prometheus.Desc) { c.m.dropped.Describe(ch) }

func (c *dropCollector) Collect(ch chan<- prometheus.Metric) {
	r := (*Router)(c)
	r.subsMu.Lock()
	subs := make([]*nats.Subscription, 0, len(r.subs))
	for s := range r.subs {
		subs = append(subs, s)
	}
	r.subsMu.Unlock()
	for _, s := range subs {
		r.countDrops(s, false)
	}
	r.m.dropped.Collect(ch)
}
