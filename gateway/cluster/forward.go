package cluster

import (
	"errors"
	"strings"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/nats-io/nats.go"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// isInternalOrigin: a packet the bridge's downlink published (its origin
// under $ferrymq/); every node delivers those itself.
func isInternalOrigin(origin string) bool { return strings.HasPrefix(origin, mqtttopic.Internal) }

// forward queues pk for the other nodes; it never blocks: past the queue's
// bounds the message is dropped and counted.
func (h *Hook) forward(pk packets.Packet) {
	subject, ok := Subject(h.opts.Prefix, pk.TopicName)
	if !ok {
		return // '$' topics stay on their node
	}
	if len(subject) > h.opts.MaxSubjectBytes {
		h.m.drop(dropLong)
		return
	}
	if h.ctx.Err() != nil {
		h.m.drop(dropClosed)
		return
	}
	m := message{
		origin: h.origin, id: h.seq.Add(1), client: pk.Origin,
		qos: pk.FixedHeader.Qos, retain: pk.FixedHeader.Retain,
		format: pk.Properties.PayloadFormat, formatSet: pk.Properties.PayloadFormatFlag,
		contentType: pk.Properties.ContentType, responseTopic: pk.Properties.ResponseTopic,
		correlation: pk.Properties.CorrelationData, user: pk.Properties.User,
		expiry: expiryLeft(pk, time.Now().Unix()),
		served: h.served(pk.TopicName),
	}
	msg := &nats.Msg{Subject: subject, Header: m.header(), Data: pk.Payload}
	if !h.fwd.push(msg, len(subject)+len(pk.Payload)+256) {
		if h.ctx.Err() != nil {
			h.m.drop(dropClosed)
		} else {
			h.m.drop(dropForwardFull)
		}
	}
}

// expiryLeft is the message expiry interval pk has left, in seconds (at
// least 1); 0 for none.
func expiryLeft(pk packets.Packet, now int64) uint32 {
	iv := int64(pk.Properties.MessageExpiryInterval)
	if iv == 0 {
		return 0
	}
	if pk.Created > 0 && now > pk.Created {
		iv -= now - pk.Created
	}
	return uint32(max(iv, 1))
}

// served are the queue groups of this node's shared routes matching topic:
// mochi delivered the message to a member of each here (the hook keeps
// shared groups to connected members, and only those are routes), so no
// other node does.
func (h *Hook) served(topic string) []string {
	var out []string
	h.amu.RLock()
	h.active.match(topic, func(r *route) {
		if r.group != "" {
			out = append(out, r.queue)
		}
	})
	h.amu.RUnlock()
	return out
}

// forwardLoop publishes the queued messages, in order, until Close; what
// is queued at Close is still handed to the connection.
func (h *Hook) forwardLoop() {
	var batch []*nats.Msg
	for {
		<-h.fwd.ready
		var closed bool
		batch, closed = h.fwd.take(batch)
		for i, m := range batch {
			if err := h.nc.PublishMsg(m); err != nil {
				h.m.drop(dropPublish)
				if !errors.Is(err, nats.ErrMaxPayload) {
					h.log.Debug().Err(err).Str("subject", m.Subject).Msg("forward")
				}
			} else {
				h.m.forwarded.Inc()
			}
			batch[i] = nil
		}
		if closed {
			return
		}
	}
}
