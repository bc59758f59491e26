package server

import (
	"strconv"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
)

// Attribute names of the hops a Server records (Options.Trace).
const (
	attrRemote   = "remote"
	attrTopic    = "topic"
	attrQueue    = "queue"
	attrOffset   = "offset"
	attrStoredAt = "stored_at"
	attrDue      = "due"
)

// traced reports whether any of msgs is traced.
func traced(rec *trace.Recorder, msgs []*core.Message) bool {
	if rec == nil {
		return false
	}
	for _, m := range msgs {
		if m != nil && rec.Enabled(m.Topic) {
			return true
		}
	}
	return false
}

// traceProduced records, for each traced message of a produce that
// succeeded, hop "produce" (at, by actor from remote) and hop "stored" — or
// "delayed" for one that waits for its deliver-at time (queue −1) — under
// the ID its producer got.
func traceProduced(rec *trace.Recorder, actor, remote string, at time.Time, msgs []*core.Message, res []core.SendResult) {
	for i, r := range res {
		if i >= len(msgs) || !rec.Enabled(r.Topic) {
			continue
		}
		rec.Record(trace.Event{ID: r.ID, Hop: trace.HopProduce, At: at, Actor: actor, Attrs: map[string]string{attrRemote: remote}})
		if r.Queue < 0 {
			rec.Record(trace.Event{ID: r.ID, Hop: trace.HopDelayed, At: r.StoredAt, Attrs: map[string]string{
				attrTopic: r.Topic, attrDue: msgs[i].DeliverAt.UTC().Format(time.RFC3339Nano),
			}})
			continue
		}
		rec.Record(trace.Event{ID: r.ID, Hop: trace.HopStored, At: r.StoredAt, Attrs: map[string]string{
			attrTopic: r.Topic, attrQueue: strconv.Itoa(r.Queue), attrOffset: strconv.FormatInt(r.QueueOffset, 10),
			attrStoredAt: r.StoredAt.UTC().Format(time.RFC3339Nano),
		}})
	}
}
