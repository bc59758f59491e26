package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
)

// Attribute names of the hops the API records (Options.Trace).
const (
	attrRemote   = "remote"
	attrTopic    = "topic"
	attrQueue    = "queue"
	attrOffset   = "offset"
	attrStoredAt = "stored_at"
	attrDue      = "due"
)

// actorHTTP is the actor of the produce hops the API records.
const actorHTTP = "http"

// traceStart returns the time of the produce hop when any of msgs is
// traced, else the zero time (and traceProduced then does nothing).
func (a *api) traceStart(msgs []*core.Message) time.Time {
	rec := a.opts.Trace
	if rec == nil {
		return time.Time{}
	}
	for _, m := range msgs {
		if rec.Enabled(m.Topic) {
			return time.Now()
		}
	}
	return time.Time{}
}

// traceProduced records, for each traced message of a produce that
// succeeded, hop "produce" (at, from the request's remote address) and hop
// "stored" — or "delayed" for one that waits for its deliver-at time
// (queue −1) — under the ID its producer got.
func (a *api) traceProduced(r *http.Request, at time.Time, msgs []*core.Message, res []core.SendResult) {
	if at.IsZero() {
		return
	}
	rec := a.opts.Trace
	for i, sr := range res {
		if i >= len(msgs) || !rec.Enabled(sr.Topic) {
			continue
		}
		rec.Record(trace.Event{ID: sr.ID, Hop: trace.HopProduce, At: at, Actor: actorHTTP, Attrs: map[string]string{attrRemote: r.RemoteAddr}})
		if sr.Queue < 0 {
			rec.Record(trace.Event{ID: sr.ID, Hop: trace.HopDelayed, At: sr.StoredAt, Attrs: map[string]string{
				attrTopic: sr.Topic, attrDue: msgs[i].DeliverAt.UTC().Format(time.RFC3339Nano),
			}})
			continue
		}
		rec.Record(trace.Event{ID: sr.ID, Hop: trace.HopStored, At: sr.StoredAt, Attrs: map[string]string{
			attrTopic: sr.Topic, attrQueue: strconv.Itoa(sr.Queue), attrOffset: strconv.FormatInt(sr.QueueOffset, 10),
			attrStoredAt: sr.StoredAt.UTC().Format(time.RFC3339Nano),
		}})
	}
}
