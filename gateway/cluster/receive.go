package cluster

import (
	"slices"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Receiving. NATS may hand this node several copies of one message: one
// for its plain routes (one queue group: however many of its filters
// match, one copy) and one per shared group it is chosen for. mochi must
// see the message once — once through its topic tree, so no subscriber
// and no parked session gets it twice — with the shared groups of every
// copy. So the copies are collated before delivery.
//
// NATS delivers the messages of one publisher connection to a subscriber
// connection in order, and every copy of one message to one connection is
// written out before anything that publisher sent next. All
// subscriptions share one channel, so the receiver sees the wire order: a
// message from an origin is complete when the next one from that origin
// arrives. It is delivered sooner when nothing more can come — no copy
// missing for a plain route, no shared route of this node matching whose
// copy has not come — and otherwise after CollateWait at most. A copy
// that comes after its message was delivered is delivered on its own:
// only to its shared group, or only to plain subscribers (counted late;
// a parked session may then queue the message twice).

// delivery is one message from another node for the local server.
type delivery struct {
	pk     packets.Packet
	client string // the publisher's client ID
	plain  bool   // for the plain subscribers (and parked sessions)
	groups []string
	size   int
}

func (d *delivery) hasGroup(key string) bool { return slices.Contains(d.groups, key) }

// pending is the last message from one origin node, while its copies come.
type pending struct {
	id       uint64
	msg      message
	pk       packets.Packet
	size     int
	want     bool     // a plain copy will come (a plain route matches)
	plain    bool     // a plain copy came
	shares   []*route // shared routes matching, not served at the origin
	groups   []string // keys of those whose copy came
	sent     bool     // delivered
	deadline time.Time
}

// complete: no copy can come any more.
func (p *pending) complete() bool {
	return (!p.want || p.plain) && len(p.groups) == len(p.shares)
}

// receiveLoop reads every subscription's deliveries, collates the copies
// of each message and queues it for injectLoop.
func (h *Hook) receiveLoop() {
	last := map[string]*pending{} // by origin
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	prune := time.NewTicker(time.Second)
	defer prune.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case m := <-h.msgs:
			h.receive(last, m)
		case now := <-timer.C:
			for _, p := range last {
				if !p.sent && !p.deadline.IsZero() && !now.Before(p.deadline) {
					h.deliver(p)
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

func (h *Hook) receive(last map[string]*pending, m *nats.Msg) {
	msg, err := decodeMessage(m.Header)
	if err != nil {
		h.m.drop(dropBad)
		h.log.Debug().Err(err).Str("subject", m.Subject).Msg("message from another node dropped")
		return
	}
	if msg.origin == h.origin {
		return // delivered here when it was published
	}
	p := last[msg.origin]
	if p != nil && p.id != msg.id {
		if !p.sent {
			h.deliver(p) // complete: the origin's next message is here
		}
		p = nil
	}
	var share *route
	if q := m.Sub.Queue; q != h.plainQ {
		h.amu.RLock()
		share = h.byQueue[q]
		h.amu.RUnlock()
		if share == nil || slices.Contains(msg.served, q) {
			return // gone since, or served at the origin
		}
	}
	if p == nil {
		if p = h.collate(m, msg); p == nil {
			return
		}
		last[msg.origin] = p
	}
	switch {
	case share == nil && p.plain, share != nil && slices.Contains(p.groups, share.key):
		return // a copy already taken (a subscription replaced meanwhile)
	case share == nil:
		p.plain = true
	default:
		p.groups = append(p.groups, share.key)
		if !slices.Contains(p.shares, share) {
			p.shares = append(p.shares, share)
		}
	}
	if p.sent {
		h.m.late.Inc()
		d := delivery{pk: p.pk, client: p.msg.client, plain: share == nil, size: p.size}
		if share != nil {
			d.groups = []string{share.key}
		}
		h.queue(d)
		return
	}
	if p.complete() {
		h.deliver(p)
	} else if p.deadline.IsZero() {
		p.deadline = time.Now().Add(h.opts.CollateWait)
	}
}

// collate starts collating a message: which copies of it may come.
func (h *Hook) collate(m *nats.Msg, msg message) *pending {
	topic, err := Topic(h.opts.Prefix, m.Subject)
	if err != nil {
		h.m.drop(dropBad)
		h.log.Debug().Err(err).Msg("message from another node dropped")
		return nil
	}
	if !h.opts.LocalRetain {
		msg.retain = false // the bucket brings retained messages (Options.LocalRetain)
	}
	p := &pending{id: msg.id, msg: msg, pk: msg.packet(topic, m.Data), size: len(m.Data) + len(topic) + 256}
	h.amu.RLock()
	h.active.match(topic, func(r *route) {
		switch {
		case r.group == "":
			p.want = true
		case !slices.Contains(msg.served, r.queue):
			p.shares = append(p.shares, r)
		}
	})
	h.amu.RUnlock()
	return p
}

func (h *Hook) deliver(p *pending) {
	p.sent = true
	p.deadline = time.Now()
	h.queue(delivery{pk: p.pk, client: p.msg.client, plain: p.plain, groups: slices.Clip(p.groups), size: p.size})
}

func (h *Hook) queue(d delivery) {
	if !h.in.push(d, d.size) {
		h.m.drop(dropInjectFull)
	}
}

// injectLoop hands the collated messages to the local server, as the
// hook's inline client: mochi delivers them with its QoS handling (inline
// publishes skip the bridge, so the origin's core stores them once), and
// OnPublished sees the inline client and does not forward them again.
func (h *Hook) injectLoop() {
	var batch []delivery
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-h.in.ready:
		}
		batch, _ = h.in.take(batch)
		for i := range batch {
			if h.ctx.Err() != nil {
				return
			}
			d := &batch[i]
			pk := d.pk
			pk.Connect.ClientIdentifier = inlineID // marks it for OnSelectSubscribers
			h.cur = d
			err := h.server.InjectPacket(h.inline, pk)
			h.cur = nil
			if err != nil {
				h.m.drop(dropInject)
				h.log.Debug().Err(err).Str("topic", pk.TopicName).Msg("message from another node not delivered")
			} else {
				h.m.received.Inc()
			}
			batch[i] = delivery{}
		}
	}
}

// countDrops counts what the NATS client dropped on s (its pending limit:
// this node read too slowly) since last counted; final forgets s.
func (h *Hook) countDrops(s *nats.Subscription, final bool) {
	n, err := s.Dropped()
	h.subsMu.Lock()
	defer h.subsMu.Unlock()
	seen, ok := h.subs[s]
	if !ok {
		return
	}
	if final {
		delete(h.subs, s)
	}
	if err == nil && n > seen {
		h.m.dropped.WithLabelValues(dropPending).Add(float64(n - seen))
		if !final {
			h.subs[s] = n
		}
	}
}

// dropCollector is ferrymq_cluster_dropped_total, with the NATS client's
// drops counted at collection.
type dropCollector Hook

func (c *dropCollector) Describe(ch chan<- *prometheus.Desc) { c.m.dropped.Describe(ch) }

func (c *dropCollector) Collect(ch chan<- prometheus.Metric) {
	h := (*Hook)(c)
	h.subsMu.Lock()
	subs := make([]*nats.Subscription, 0, len(h.subs))
	for s := range h.subs {
		subs = append(subs, s)
	}
	h.subsMu.Unlock()
	for _, s := range subs {
		h.countDrops(s, false)
	}
	h.m.dropped.Collect(ch)
}
