package pop

import (
	"strconv"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
)

// Attribute names of the hops a Service records (Options.Trace).
const (
	attrGroup          = "group"
	attrMode           = "mode"
	attrAttempt        = "attempt"
	attrInvisibleUntil = "invisible_until"
	attrTopic          = "topic"
	attrQueue          = "queue"
	attrOffset         = "offset"
	attrOrderly        = "orderly"
)

// modePop is the mode attribute of a delivered hop, beside the group
// package's clustering and broadcast.
const modePop = "pop"

// traceDelivered records the delivered hop of the traced messages of one
// Pop.
func (s *Service) traceDelivered(req Request, out []Popped) {
	rec := s.opts.Trace
	if rec == nil {
		return
	}
	for _, p := range out {
		m := p.Message
		if !rec.Enabled(trace.TopicOf(m)) {
			continue
		}
		attrs := map[string]string{
			attrGroup: req.Group, attrMode: modePop, attrAttempt: strconv.Itoa(p.Attempt),
			attrInvisibleUntil: p.VisibleAt.UTC().Format(time.RFC3339Nano),
			attrTopic:          m.Topic, attrQueue: strconv.Itoa(m.Queue), attrOffset: strconv.FormatInt(m.QueueOffset, 10),
		}
		if req.Orderly {
			attrs[attrOrderly] = "true"
		}
		rec.Record(trace.Event{ID: trace.IDOf(m), Hop: trace.HopDelivered, Actor: req.Group, Attrs: attrs})
	}
}

// traceAcked records the acked hop of the message of h, traced under id.
func (s *Service) traceAcked(h handle, id core.MessageID) {
	s.opts.Trace.Record(trace.Event{ID: id, Hop: trace.HopAcked, Actor: h.group, Attrs: map[string]string{
		attrGroup: h.group, attrTopic: h.topic, attrQueue: strconv.Itoa(h.queue), attrOffset: strconv.FormatInt(h.offset, 10),
	}})
}
