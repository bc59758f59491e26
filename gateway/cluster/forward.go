package cluster

import (
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Routed implements engine.Router: the engine delivered m here, and now
// the other nodes' subscribers get it. It never blocks: m is queued for
// the forwarder, and past the queue's bounds dropped and counted. Not
// forwarded: messages with a Ref (the bridge's downlink deliveries, which
// every node makes itself) and '$' topics. served are the shared groups a
// member of which here took m ("group/filter"): Fmq-Served names their
// queue groups, so that no other node's member takes it too.
func (r *Router) Routed(m *engine.Message, served []string) {
	if m.Ref != "" {
		return
	}
	subject, ok := Subject(r.opts.Prefix, m.Topic)
	if !ok {
		return
	}
	if len(subject) > r.opts.MaxSubjectBytes {
		r.m.drop(dropLong)
		return
	}
	if r.ctx.Err() != nil {
		r.m.drop(dropClosed)
		return
	}
	w := message{
		origin: r.opts.Node, id: r.seq.Add(1), client: m.Origin, qos: m.QoS, retain: m.Retain,
		expiry: expiryLeft(m.Expiry, time.Now().Unix()),
	}
	if p := m.Props; p != nil {
		w.format, w.formatSet, w.contentType, w.responseTopic = p.PayloadFormat, p.PayloadFormatSet, p.ContentType, p.ResponseTopic
		w.correlation, w.user = p.CorrelationData, p.User
	}
	for _, g := range served {
		w.served = append(w.served, r.servedQueue(g))
	}
	msg := &nats.Msg{Subject: subject, Header: w.header(), Data: m.Payload}
	if !r.fwd.push(msg, len(subject)+len(m.Payload)+256) {
		if r.ctx.Err() != nil {
			r.m.drop(dropClosed)
		} else {
			r.m.drop(dropForwardFull)
		}
	}
}

// servedQueue is the queue group of the shared group the engine names
// "group/filter".
func (r *Router) servedQueue(share string) string {
	group, _, _ := strings.Cut(share, "/")
	return shareQueue(r.opts.Prefix, group, "$share/"+share)
}

// expiryLeft is the message expiry interval left at now of a message that
// expires at expiry (unix seconds; 0 never), in seconds: at least 1, 0 for
// none.
func expiryLeft(expiry, now int64) uint32 {
	if expiry == 0 {
		return 0
	}
	return uint32(min(max(expiry-now, 1), 1<<32-1))
}

// forwardLoop publishes the queued messages, in order, until Close; what
// is queued at Close is still handed to the connection.
func (r *Router) forwardLoop() {
	var batch []*nats.Msg
	for {
		<-r.fwd.ready
		var closed bool
		batch, closed = r.fwd.take(batch)
		for i, m := range batch {
			if err := r.nc.PublishMsg(m); err != nil {
				r.m.drop(dropPublish)
				if !errors.Is(err, nats.ErrMaxPayload) {
					r.log.Debug().Err(err).Str(logSubject, m.Subject).Msg("forward")
				}
			} else {
				r.m.forwarded.Inc()
			}
			batch[i] = nil
		}
		if closed {
			return
		}
	}
}
