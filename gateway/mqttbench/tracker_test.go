package mqttbench

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTrackerCounts(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	sent := []*atomic.Int64{new(atomic.Int64), new(atomic.Int64)}
	sent[0].Store(200)
	sent[1].Store(3)
	tr := newTracker(start, sent)
	payload := func(pub, seq uint32, at time.Time) []byte {
		b := make([]byte, 32)
		EncodePayload(b, Stamp{Publisher: pub, Seq: seq, SentUnixNano: at.UnixNano()})
		return b
	}
	now := start.Add(time.Second).UnixNano()
	at := start.Add(time.Second - 2*time.Millisecond) // 2 ms before now

	// Out of order and across bitset words; every one new.
	for _, seq := range []uint32{199, 0, 64, 63, 128, 1} {
		tr.observe(payload(0, seq, at), now)
	}
	tr.observe(payload(1, 2, at), now)
	// Copies.
	tr.observe(payload(0, 64, at), now)
	tr.observe(payload(0, 64, at), now)
	tr.observe(payload(1, 2, at), now)
	// Not of this run.
	for _, b := range [][]byte{
		[]byte("not a bench payload"),
		payload(0, 1, at)[:PayloadHeaderBytes-1],
		payload(2, 0, at),                                  // no such publisher
		payload(1, 3, at),                                  // publisher 1 has sent 0 … 2 only
		payload(0, 5, start.Add(-time.Nanosecond)),         // sent before the run
		payload(0, 6, start.Add(time.Second+clockSlack+1)), // from the future
	} {
		tr.observe(b, now)
	}

	require.EqualValues(t, 7, tr.received.Load())
	require.EqualValues(t, 3, tr.duplicates.Load())
	require.EqualValues(t, 6, tr.foreign.Load())

	d := deliveries([]*tracker{tr}, 10, start)
	require.Equal(t, int64(10), d.Expected)
	require.Equal(t, int64(7), d.Received)
	require.Equal(t, int64(3), d.Lost)
	require.InDelta(t, 30.0, d.LossPct, 1e-9)
	require.InDelta(t, 7.0, d.PerSec, 1e-9, "7 messages in the second from start to the last receipt")
	require.Equal(t, uint64(7), d.Latency.N)
	require.InEpsilon(t, float64(2*time.Millisecond), float64(d.Latency.P50), 0.004)
}

func TestDeliveriesSumsReceivers(t *testing.T) {
	start := time.Now()
	sent := []*atomic.Int64{new(atomic.Int64)}
	sent[0].Store(5)
	a, b := newTracker(start, sent), newTracker(start, sent)
	for seq := range uint32(5) {
		p := make([]byte, PayloadHeaderBytes)
		EncodePayload(p, Stamp{Seq: seq, SentUnixNano: start.UnixNano()})
		a.observe(p, start.UnixNano()+int64(time.Millisecond))
		if seq < 3 {
			b.observe(p, start.UnixNano()+int64(time.Millisecond))
		}
	}
	d := deliveries([]*tracker{a, b}, 10, start)
	require.Equal(t, int64(10), d.Expected, "each receiver expects every message")
	require.Equal(t, int64(8), d.Received)
	require.Equal(t, int64(2), d.Lost)
	require.Zero(t, receivedBy(nil))
	require.Equal(t, int64(8), receivedBy([]*tracker{a, b}))
}

func TestErrorSet(t *testing.T) {
	var s errorSet
	s.add(nil)
	for i := range maxDistinctErrors + 3 {
		s.add(errorString(string(rune('a' + i))))
	}
	s.add(errorString("a"))
	l := s.list()
	require.Len(t, l, maxDistinctErrors+1)
	require.Equal(t, ErrorCount{Err: "a", Count: 2}, l[0])
	require.Equal(t, ErrorCount{Err: "other errors", Count: 3}, l[maxDistinctErrors])
}

type errorString string

func (e errorString) Error() string { return string(e) }

func TestSeen(t *testing.T) {
	var s Seen
	require.True(t, s.Add(0))
	require.True(t, s.Add(200))
	require.False(t, s.Add(200), "a second time")
	require.True(t, s.Has(0))
	require.True(t, s.Has(200))
	require.False(t, s.Has(1))
	require.False(t, s.Has(1<<20), "past the end")
}
