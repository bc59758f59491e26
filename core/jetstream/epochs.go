package jetstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// A topic's epochs (core/epoch.go) live in its stream's metadata, so every
// node reads the same history and a restart loses nothing. A topic never
// resized has no "ferrymq.epochs" key: one epoch of "ferrymq.queues" queues
// that began when the topic was created. Once resized the key holds a JSON
// array, oldest epoch first, one object per epoch:
//
//	queues   int      the queue count of the epoch (1 to core.MaxQueues)
//	started  int      when the epoch began, unix nanoseconds
//	marker   int      epoch ≥ 1: the stream sequence of the epoch's first
//	                  marker; absent for epoch 0 and for an epoch begun but
//	                  not yet committed
//	begin    [int]    epoch ≥ 1, committed: per queue q below
//	                  max(previous queues, queues), the sequence of q's last
//	                  message written before the epoch (0: none) — the
//	                  queue's next offset when the epoch began, Epoch.Begin
//
// The last entry may be an intent: an epoch ≥ 1 without a marker. These
// names are part of the format; unknown fields are refused.
const metaEpochs = "ferrymq.epochs"

// maxEpochsBytes bounds the encoded history: JetStream refuses stream
// metadata above 128 KiB in all, and the rest of ours is small.
const maxEpochsBytes = 120 << 10

// epochRec is one epoch as the metadata holds it.
type epochRec struct {
	Queues  int     `json:"queues"`
	Started int64   `json:"started"`
	Marker  uint64  `json:"marker,omitempty"`
	Begin   []int64 `json:"begin,omitempty"`
}

// layout is what the engine knows of a topic's epochs: the committed ones
// (their number is their index, the epoch tag of their subjects) and an
// intent — an epoch whose fence is up (its predecessor's subjects refused
// by the stream, its own taken) but whose boundaries are not yet recorded.
// Producers write to the intent's epoch as soon as they know it (pubEpoch);
// readers follow committed epochs only, so what is stored there waits for
// the commit. A layout is never changed once built.
type layout struct {
	epochs []epochRec
	intent *epochRec
}

// cur is the number of the newest committed epoch: the one readers follow
// last.
func (l *layout) cur() int { return len(l.epochs) - 1 }

// queues is the queue count of the newest committed epoch.
func (l *layout) queues() int { return l.epochs[l.cur()].Queues }

// pubEpoch is the epoch producers write to: the intent's, if any (the
// stream takes only its subjects), else the newest committed one.
func (l *layout) pubEpoch() int {
	if l.intent != nil {
		return len(l.epochs)
	}
	return l.cur()
}

// pubQueues is the queue count producers route with: pubEpoch's.
func (l *layout) pubQueues() int {
	if l.intent != nil {
		return l.intent.Queues
	}
	return l.queues()
}

// newer reports whether l knows more than o (nil o: anything is newer).
func (l *layout) newer(o *layout) bool {
	if o == nil {
		return true
	}
	if len(l.epochs) != len(o.epochs) {
		return len(l.epochs) > len(o.epochs)
	}
	return l.intent != nil && o.intent == nil
}

// maxQueues is the most queues any known epoch had: the queue numbers
// that may name a stored message.
func (l *layout) maxQueues() int {
	n := 0
	for _, ep := range l.epochs {
		n = max(n, ep.Queues)
	}
	return n
}

// liveQueues is the number of queue slots that can still hold messages
// when the stream's first sequence is first: the largest queue count of an
// epoch with a message at or after it. The current epoch always counts.
func (l *layout) liveQueues(first uint64) int {
	n := l.queues()
	for k := 0; k < l.cur(); k++ {
		if l.epochLast(k) >= int64(first) {
			n = max(n, l.epochs[k].Queues)
		}
	}
	return n
}

// epochLast bounds the sequences of epoch k's messages (k before the
// current epoch): each queue's last message before epoch k+1.
func (l *layout) epochLast(k int) int64 {
	var last int64
	b := l.epochs[k+1].Begin
	for q := 0; q < l.epochs[k].Queues && q < len(b); q++ {
		last = max(last, b[q])
	}
	return last
}

// segment is where queue q's messages of one epoch are: on subject, at
// offsets below end (MaxInt64 for the current epoch).
type segment struct {
	epoch   int
	subject string
	end     int64
}

// segments lists, oldest first, the epochs that wrote to queue q.
func (l *layout) segments(tok string, q int) []segment {
	var out []segment
	for k, ep := range l.epochs {
		if q >= ep.Queues {
			continue
		}
		end := int64(math.MaxInt64)
		if k < l.cur() {
			end = l.epochs[k+1].Begin[q]
		}
		out = append(out, segment{epoch: k, subject: queueSubject(tok, q, k), end: end})
	}
	return out
}

// lastBefore is the sequence of queue q's last message written before
// epoch k (0: none), from the recorded boundaries.
func (l *layout) lastBefore(q, k int) int64 {
	for ; k > 0; k-- {
		if b := l.epochs[k].Begin; q < len(b) {
			return b[q]
		}
	}
	return 0
}

// coreEpochs is the committed history as core.TopicInfo.Epochs.
func (l *layout) coreEpochs() []core.Epoch {
	out := make([]core.Epoch, len(l.epochs))
	for k, ep := range l.epochs {
		out[k] = core.Epoch{Queues: ep.Queues, Started: time.Unix(0, ep.Started)}
		if k > 0 {
			out[k].Begin = append([]int64(nil), ep.Begin...)
		}
	}
	return out
}

// committedOnly is l without its intent.
func (l *layout) committedOnly() *layout {
	if l.intent == nil {
		return l
	}
	return &layout{epochs: l.epochs}
}

// withIntent returns the layout with an intent of n queues begun at at.
func (l *layout) withIntent(n int, at time.Time) *layout {
	return &layout{epochs: l.epochs, intent: &epochRec{Queues: n, Started: at.UnixNano()}}
}

// committed returns the layout with its intent recorded as an epoch that
// began at marker, with the given boundaries.
func (l *layout) committed(marker uint64, begin []int64) *layout {
	ep := *l.intent
	ep.Marker, ep.Begin = marker, begin
	epochs := append(append(make([]epochRec, 0, len(l.epochs)+1), l.epochs...), ep)
	return &layout{epochs: epochs}
}

// errEpochs wraps every refusal of a topic's epoch metadata.
var errEpochs = errors.New("epoch history")

// parseLayout reads a stream's epoch history; queues and created are its
// "ferrymq.queues" and "ferrymq.created". It refuses anything malformed
// and never panics.
func parseLayout(md map[string]string, created time.Time) (*layout, error) {
	n, err := strconv.Atoi(md[metaQueues])
	if err != nil || n < 1 || n > core.MaxQueues {
		return nil, fmt.Errorf("%w: queue count %q", errEpochs, md[metaQueues])
	}
	raw, ok := md[metaEpochs]
	if !ok {
		return &layout{epochs: []epochRec{{Queues: n, Started: created.UnixNano()}}}, nil
	}
	l, err := decodeEpochs([]byte(raw))
	if err != nil {
		return nil, err
	}
	if l.queues() != n {
		return nil, fmt.Errorf("%w: %d queues in force, metadata says %d", errEpochs, l.queues(), n)
	}
	return l, nil
}

// decodeEpochs decodes and checks the "ferrymq.epochs" value.
func decodeEpochs(raw []byte) (*layout, error) {
	if len(raw) > maxEpochsBytes {
		return nil, fmt.Errorf("%w: %d bytes", errEpochs, len(raw))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var recs []epochRec
	if err := dec.Decode(&recs); err != nil {
		return nil, fmt.Errorf("%w: %w", errEpochs, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data", errEpochs)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w: empty", errEpochs)
	}
	l := &layout{}
	if last := recs[len(recs)-1]; len(recs) > 1 && last.Marker == 0 {
		if last.Begin != nil {
			return nil, fmt.Errorf("%w: epoch %d has boundaries but no marker", errEpochs, len(recs)-1)
		}
		if err := core.ValidateQueueCount(last.Queues); err != nil {
			return nil, fmt.Errorf("%w: epoch %d: %w", errEpochs, len(recs)-1, err)
		}
		l.intent = &last
		recs = recs[:len(recs)-1]
	}
	var prevMarker uint64
	for k, ep := range recs {
		if ep.Queues < 1 || ep.Queues > core.MaxQueues {
			return nil, fmt.Errorf("%w: epoch %d: %d queues", errEpochs, k, ep.Queues)
		}
		if k == 0 {
			if ep.Marker != 0 || ep.Begin != nil {
				return nil, fmt.Errorf("%w: epoch 0 has boundaries", errEpochs)
			}
			continue
		}
		if ep.Marker <= prevMarker || ep.Marker > math.MaxInt64 {
			return nil, fmt.Errorf("%w: epoch %d: marker %d after %d", errEpochs, k, ep.Marker, prevMarker)
		}
		prevMarker = ep.Marker
		if want := max(recs[k-1].Queues, ep.Queues); len(ep.Begin) != want {
			return nil, fmt.Errorf("%w: epoch %d: %d boundaries, want %d", errEpochs, k, len(ep.Begin), want)
		}
		before := &layout{epochs: recs[:k]}
		for q, b := range ep.Begin {
			// A queue's last message before an epoch cannot precede its
			// last message before the previous one.
			if b < 0 || b < before.lastBefore(q, k-1) {
				return nil, fmt.Errorf("%w: epoch %d: queue %d begins at %d", errEpochs, k, q, b)
			}
		}
	}
	l.epochs = recs
	return l, nil
}

// encodeEpochs is the "ferrymq.epochs" value of l (its intent last).
func encodeEpochs(l *layout) (string, error) {
	recs := l.epochs
	if l.intent != nil {
		recs = append(append(make([]epochRec, 0, len(recs)+1), recs...), *l.intent)
	}
	b, err := json.Marshal(recs)
	if err != nil {
		return "", fmt.Errorf("jetstream: encode epochs: %w", err)
	}
	if len(b) > maxEpochsBytes {
		return "", fmt.Errorf("%w: %d bytes of epoch history, at most %d fit in the stream's metadata", ErrTooManyEpochs, len(b), maxEpochsBytes)
	}
	return string(b), nil
}
