package trace

import (
	"strconv"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// ProduceStart returns the time of the "produce" hop when any of msgs is
// traced, else the zero time (and Produced then records nothing). Taken
// before the produce starts, so that the hop sorts before "stored".
func (r *Recorder) ProduceStart(msgs []*core.Message) time.Time {
	if r == nil {
		return time.Time{}
	}
	for _, m := range msgs {
		if m != nil && r.Enabled(m.Topic) {
			return time.Now()
		}
	}
	return time.Time{}
}

// Produced records, for each traced message of a produce that succeeded,
// hop "produce" (at, by actor from remote) and hop "stored" — or "delayed"
// for one that waits for its deliver-at time (queue −1) — under the ID its
// producer got. at is what ProduceStart returned; zero records nothing.
func (r *Recorder) Produced(actor, remote string, at time.Time, msgs []*core.Message, res []core.SendResult) {
	if r == nil || at.IsZero() {
		return
	}
	for i, sr := range res {
		if i >= len(msgs) || !r.Enabled(sr.Topic) {
			continue
		}
		r.Record(Event{ID: sr.ID, Hop: HopProduce, At: at, Actor: actor, Attrs: map[string]string{"remote": remote}})
		if sr.Queue < 0 {
			r.Record(Event{ID: sr.ID, Hop: HopDelayed, At: sr.StoredAt, Attrs: map[string]string{
				"topic": sr.Topic, "due": msgs[i].DeliverAt.UTC().Format(time.RFC3339Nano),
			}})
			continue
		}
		r.Record(Event{ID: sr.ID, Hop: HopStored, At: sr.StoredAt, Attrs: map[string]string{
			"topic": sr.Topic, "queue": strconv.Itoa(sr.Queue), "offset": strconv.FormatInt(sr.QueueOffset, 10),
			"stored_at": sr.StoredAt.UTC().Format(time.RFC3339Nano),
		}})
	}
}
