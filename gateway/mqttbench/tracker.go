package mqttbench

import (
	"sync"
	"sync/atomic"
	"time"
)

// clockSlack is how far in the future a payload's send time may be and
// still count as this run's: the sender stamps a payload before handing
// it over, so a receipt is never earlier unless the wall clock stepped.
const clockSlack = time.Second

// tracker counts what one receiver (a subscriber, the core consumer) got:
// distinct messages, duplicates, payloads of others, and the latency from
// send to receipt. It is safe for concurrent use.
type tracker struct {
	runStart int64           // unix ns; earlier payloads are foreign
	sent     []*atomic.Int64 // per publisher: sequence numbers in use

	received, duplicates, foreign atomic.Int64

	mu   sync.Mutex
	seen []Seen // per publisher: the sequence numbers received
	hist *Histogram
	last int64 // unix ns of the last new message
}

func newTracker(runStart time.Time, sent []*atomic.Int64) *tracker {
	return &tracker{runStart: runStart.UnixNano(), sent: sent, seen: make([]Seen, len(sent)), hist: NewHistogram()}
}

// observe records one payload received at now (unix ns).
func (t *tracker) observe(payload []byte, now int64) {
	s, err := DecodePayload(payload)
	// A payload of this run names one of its publishers, a sequence number
	// that publisher has used, and a send time within the run.
	if err != nil || int(s.Publisher) >= len(t.sent) || int64(s.Seq) >= t.sent[s.Publisher].Load() ||
		s.SentUnixNano < t.runStart || s.SentUnixNano > now+int64(clockSlack) {
		t.foreign.Add(1)
		return
	}
	t.mu.Lock()
	dup := !t.seen[s.Publisher].Add(uint64(s.Seq))
	if !dup {
		t.hist.Record(time.Duration(max(0, now-s.SentUnixNano)))
		t.last = max(t.last, now)
	}
	t.mu.Unlock()
	if dup {
		t.duplicates.Add(1)
	} else {
		t.received.Add(1)
	}
}

// deliveries sums trackers into one Delivery; expected is what they all
// should have received together, and rates count from start.
func deliveries(ts []*tracker, expected int64, start time.Time) *Delivery {
	d := &Delivery{Expected: expected}
	h := NewHistogram()
	var last int64
	for _, t := range ts {
		d.Received += t.received.Load()
		d.Duplicates += t.duplicates.Load()
		d.Foreign += t.foreign.Load()
		t.mu.Lock()
		h.Merge(t.hist)
		last = max(last, t.last)
		t.mu.Unlock()
	}
	d.Lost = max(0, d.Expected-d.Received)
	if d.Expected > 0 {
		d.LossPct = 100 * float64(d.Lost) / float64(d.Expected)
	}
	if el := time.Duration(last - start.UnixNano()); d.Received > 0 && el > 0 {
		d.PerSec = float64(d.Received) / el.Seconds()
	}
	d.Latency = latencyOf(h)
	return d
}

// receivedBy sums what trackers received so far.
func receivedBy(ts []*tracker) int64 {
	var n int64
	for _, t := range ts {
		n += t.received.Load()
	}
	return n
}
