package bridge

import (
	"context"
	"time"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Point-to-point commands for a client ID that has no session on this node
// (a car provisioned but never connected, say) are held in memory for a
// while: if the client connects within Options.HoldUnknown it gets them
// (whatever its session), otherwise each gets an "expired" receipt. The
// hold is bounded per client (OfflineMaxMessages, OfflineMaxBytes) and in
// total (HoldUnknownMax messages, HoldUnknownMaxBytes); past a bound the
// new command gets a "dropped" receipt at once. Held commands do not
// survive a restart (the client never had a session to keep them in).

// heldMsg is one held command.
type heldMsg struct {
	m          *engine.Message // ready to send
	id, topic  string          // message ID and MQTT topic, for receipts
	receiptKey string
	deadline   time.Time
	tr         downTrace
}

type heldQueue struct {
	msgs  []heldMsg
	bytes int
}

// hold keeps a command for target, a client this node does not know, or
// refuses it with a "dropped" receipt when a bound is reached.
func (h *Hook) hold(target string, m heldMsg) {
	reason := ""
	h.dl.mu.Lock()
	q := h.dl.held[target]
	size := len(m.m.Payload)
	switch {
	case q != nil && len(q.msgs) >= h.opts.OfflineMaxMessages:
		reason = "the unknown client's hold is full (messages)"
	case q != nil && q.bytes+size > h.opts.OfflineMaxBytes:
		reason = "the unknown client's hold is full (bytes)"
	case h.dl.heldN >= h.opts.HoldUnknownMax:
		reason = "the hold for unknown clients is full (messages)"
	case h.dl.heldBytes+size > h.opts.HoldUnknownMaxBytes:
		reason = "the hold for unknown clients is full (bytes)"
	default:
		if q == nil {
			q = &heldQueue{}
			h.dl.held[target] = q
		}
		q.msgs = append(q.msgs, m)
		q.bytes += size
		h.dl.heldN++
		h.dl.heldBytes += size
	}
	h.dl.mu.Unlock()
	if reason != "" {
		h.receipt(m.receiptKey, &Receipt{MessageID: m.id, ClientID: target, Outcome: OutcomeDropped, Topic: m.topic, Reason: reason}, m.tr)
		return
	}
	h.m.downlink.WithLabelValues("held").Inc()
	h.traceDeliver(m.tr, target, m.topic, m.m.QoS, 0, false, downHeld, time.Time{})
}

// releaseHeld hands what is held to a client that is connecting (before
// its CONNACK: the engine sends it right after).
func (h *Hook) releaseHeld(client string) {
	h.dl.mu.Lock()
	q := h.dl.held[client]
	if q != nil {
		delete(h.dl.held, client)
		h.dl.heldN -= len(q.msgs)
		h.dl.heldBytes -= q.bytes
	}
	h.dl.mu.Unlock()
	if q == nil {
		return
	}
	now := time.Now()
	for _, m := range q.msgs {
		if !now.Before(m.deadline) {
			h.expireHeld(client, m)
			continue
		}
		if err := h.e.Send(client, m.m); err != nil {
			h.log.Debug().Err(err).Str(logClient, client).Msg("held command publish")
			continue
		}
		h.m.downlink.WithLabelValues("published").Inc()
	}
}

func (h *Hook) expireHeld(client string, m heldMsg) {
	h.receipt(m.receiptKey, &Receipt{MessageID: m.id, ClientID: client, Outcome: OutcomeExpired, Topic: m.topic,
		Reason: "the client did not connect to this node in time"}, m.tr)
}

// sweepHeld gives held commands whose time passed their "expired" receipt,
// every second until ctx ends.
func (h *Hook) sweepHeld(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			type gone struct {
				client string
				m      heldMsg
			}
			var out []gone
			h.dl.mu.Lock()
			for client, q := range h.dl.held {
				kept := q.msgs[:0]
				for _, m := range q.msgs {
					if now.Before(m.deadline) {
						kept = append(kept, m)
						continue
					}
					out = append(out, gone{client, m})
					q.bytes -= len(m.m.Payload)
					h.dl.heldBytes -= len(m.m.Payload)
					h.dl.heldN--
				}
				q.msgs = kept
				if len(kept) == 0 {
					delete(h.dl.held, client)
				}
			}
			h.dl.mu.Unlock()
			for _, g := range out {
				h.expireHeld(g.client, g.m)
			}
		}
	}
}
