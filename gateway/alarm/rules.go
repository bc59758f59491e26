package alarm

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Values are a reader's figures now, by subject.
type Values map[string]float64

// Reader reads figures for a rule.
type Reader func(ctx context.Context) (Values, error)

// Describe words a reading for people; nil: a generic sentence.
type Describe func(subject string, value, threshold float64) string

func describe(d Describe, kind Kind, subject string, v, threshold float64) string {
	if d != nil {
		return d(subject, v, threshold)
	}
	return fmt.Sprintf("%s %s: %g (threshold %g)", kind, subject, v, threshold)
}

// Condition is active for every subject read reports (subject → what is
// wrong); the others are inactive. Value 1, threshold 0.
func Condition(kind Kind, read func(ctx context.Context) (map[string]string, error)) Probe {
	var known map[string]bool
	return ProbeFunc(func(ctx context.Context, _ time.Time) ([]Reading, error) {
		now, err := read(ctx)
		if err != nil {
			return nil, err
		}
		var out []Reading
		for s, msg := range now {
			out = append(out, Reading{Kind: kind, Subject: s, Active: true, Value: 1, Message: msg})
		}
		for s := range known {
			if _, ok := now[s]; !ok {
				out = append(out, Reading{Kind: kind, Subject: s})
			}
		}
		known = map[string]bool{}
		for s := range now {
			known[s] = true
		}
		return out, nil
	})
}

// Above is active while a subject's value is above threshold.
func Above(kind Kind, threshold float64, read Reader, d Describe) Probe {
	return ProbeFunc(func(ctx context.Context, _ time.Time) ([]Reading, error) {
		vs, err := read(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]Reading, 0, len(vs))
		for s, v := range vs {
			out = append(out, Reading{Kind: kind, Subject: s, Active: v > threshold, Value: v, Threshold: threshold,
				Message: describe(d, kind, s, v, threshold)})
		}
		return out, nil
	})
}

// sample is a value at a time.
type sample struct {
	t time.Time
	v float64
}

// history keeps each subject's samples of the last period (and the one
// just before it, so the oldest kept is at least period old once there is
// that much history).
type history struct {
	period time.Duration
	subj   map[string][]sample
}

func newHistory(period time.Duration) *history {
	return &history{period: period, subj: map[string][]sample{}}
}

// add records vs at now and forgets subjects vs no longer has.
func (h *history) add(now time.Time, vs Values) {
	for s := range h.subj {
		if _, ok := vs[s]; !ok {
			delete(h.subj, s)
		}
	}
	for s, v := range vs {
		ss := append(h.subj[s], sample{now, v})
		cut := 0
		for cut+1 < len(ss) && now.Sub(ss[cut+1].t) >= h.period {
			cut++
		}
		h.subj[s] = append(ss[:0], ss[cut:]...)
	}
}

// Growing is active while a subject's value grew through the whole period:
// the history covers the period, no sample is below the one before, and
// the last is above the first. Value is the value now, Threshold the value
// at the period's start.
func Growing(kind Kind, period time.Duration, read Reader, d Describe) Probe {
	h := newHistory(period)
	return ProbeFunc(func(ctx context.Context, now time.Time) ([]Reading, error) {
		vs, err := read(ctx)
		if err != nil {
			return nil, err
		}
		h.add(now, vs)
		out := make([]Reading, 0, len(vs))
		for s, ss := range h.subj {
			first, last := ss[0], ss[len(ss)-1]
			growing := now.Sub(first.t) >= period && last.v > first.v
			for i := 1; growing && i < len(ss); i++ {
				growing = ss[i].v >= ss[i-1].v
			}
			out = append(out, Reading{Kind: kind, Subject: s, Active: growing, Value: last.v, Threshold: first.v,
				Message: describe(d, kind, s, last.v, first.v)})
		}
		return out, nil
	})
}

// Rate is active while a counter grows faster than bound per second,
// measured over window (or over the history there is, once it spans two
// evaluations). Value is the rate.
func Rate(kind Kind, bound float64, window time.Duration, read Reader, d Describe) Probe {
	h := newHistory(window)
	return ProbeFunc(func(ctx context.Context, now time.Time) ([]Reading, error) {
		vs, err := read(ctx)
		if err != nil {
			return nil, err
		}
		h.add(now, vs)
		var out []Reading
		for s, ss := range h.subj {
			first, last := ss[0], ss[len(ss)-1]
			dt := last.t.Sub(first.t).Seconds()
			if len(ss) < 2 || dt <= 0 {
				continue
			}
			rate := math.Max(0, last.v-first.v) / dt
			out = append(out, Reading{Kind: kind, Subject: s, Active: rate > bound, Value: rate, Threshold: bound,
				Message: describe(d, kind, s, rate, bound)})
		}
		return out, nil
	})
}

// Arrivals watches counters that only grow (messages in a dead-letter
// topic, hops dropped): a subject's alarm is active from an evaluation
// that finds its counter grew until quiet has passed without growth. The
// first evaluation's readings are baselines (what arrived before the node
// started does not raise); a subject that appears later starts from 0 (a
// dead-letter topic created by its first message). Value is what arrived
// since the alarm's stretch began.
func Arrivals(kind Kind, quiet time.Duration, read Reader, d Describe) Probe {
	type state struct {
		last, base float64 // base: the counter when the stretch began
		grew       time.Time
	}
	st := map[string]*state{}
	first := true
	return ProbeFunc(func(ctx context.Context, now time.Time) ([]Reading, error) {
		vs, err := read(ctx)
		if err != nil {
			return nil, err
		}
		var out []Reading
		for s, v := range vs {
			x, ok := st[s]
			if !ok && first {
				st[s] = &state{last: v, base: v}
				continue
			}
			if !ok {
				x = &state{}
				st[s] = x
			}
			if v < x.last { // the counter restarted (a topic deleted and created again)
				x.last, x.base = v, v
			}
			active := !x.grew.IsZero() && now.Sub(x.grew) < quiet
			if v > x.last {
				if !active {
					x.base = x.last
				}
				x.grew, active = now, true
			}
			x.last = v
			out = append(out, Reading{Kind: kind, Subject: s, Active: active, Value: v - x.base,
				Message: describe(d, kind, s, v-x.base, 0)})
		}
		for s := range st {
			if _, ok := vs[s]; !ok {
				delete(st, s)
			}
		}
		first = false
		return out, nil
	})
}

// Deadline is active while a subject's time is less than within away (or
// past). Value is the days left (negative once past), Threshold within in
// days.
func Deadline(kind Kind, within time.Duration, read func(ctx context.Context) (map[string]time.Time, error), d Describe) Probe {
	return ProbeFunc(func(ctx context.Context, now time.Time) ([]Reading, error) {
		ts, err := read(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]Reading, 0, len(ts))
		limit := within.Hours() / 24
		for s, t := range ts {
			left := t.Sub(now).Hours() / 24
			out = append(out, Reading{Kind: kind, Subject: s, Active: t.Sub(now) < within, Value: left, Threshold: limit,
				Message: describe(d, kind, s, left, limit)})
		}
		return out, nil
	})
}

// Histogram is a latency histogram as a reader sees it: Bounds are the
// buckets' upper bounds (seconds), Counts per bucket (not cumulative), one
// more than Bounds for what is beyond them.
type Histogram struct {
	Bounds []float64
	Counts []int64
}

// QuantileAbove is active while the q quantile of what a histogram
// counted over window is above bound (seconds), once the window holds at
// least minCount observations; the quantile is a bucket's upper bound.
// subject names the reading.
func QuantileAbove(kind Kind, subject string, q, bound float64, window time.Duration, minCount int64,
	read func(ctx context.Context) (Histogram, error), d Describe) Probe {
	type snap struct {
		t      time.Time
		counts []int64
	}
	var snaps []snap
	return ProbeFunc(func(ctx context.Context, now time.Time) ([]Reading, error) {
		h, err := read(ctx)
		if err != nil {
			return nil, err
		}
		if len(h.Counts) != len(h.Bounds)+1 {
			return nil, fmt.Errorf("histogram with %d bounds and %d counts", len(h.Bounds), len(h.Counts))
		}
		snaps = append(snaps, snap{now, h.Counts})
		cut := 0
		for cut+1 < len(snaps) && now.Sub(snaps[cut+1].t) >= window {
			cut++
		}
		snaps = append(snaps[:0], snaps[cut:]...)
		if len(snaps) < 2 {
			return nil, nil
		}
		first := snaps[0].counts
		delta := make([]int64, len(h.Counts))
		var n int64
		for i := range delta {
			delta[i] = h.Counts[i] - first[i]
			n += delta[i]
		}
		if n < minCount {
			return []Reading{{Kind: kind, Subject: subject, Threshold: bound}}, nil
		}
		want := int64(math.Ceil(q * float64(n)))
		v, seen := math.Inf(1), int64(0)
		for i, c := range delta {
			seen += c
			if seen >= want {
				if i < len(h.Bounds) {
					v = h.Bounds[i]
				}
				break
			}
		}
		if math.IsInf(v, 1) && len(h.Bounds) > 0 {
			v = h.Bounds[len(h.Bounds)-1] * 2 // beyond the last bound: JSON has no infinity
		}
		return []Reading{{Kind: kind, Subject: subject, Active: v > bound, Value: v, Threshold: bound,
			Message: describe(d, kind, subject, v, bound)}}, nil
	})
}
