package jetstream

import (
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// history is 8 → 16 → 4 queues, then an intent of 6.
func history() *layout {
	begin1 := make([]int64, 16)
	for q := range 8 {
		begin1[q] = int64(10 + q) // queues 8–15 had nothing before epoch 1
	}
	begin2 := make([]int64, 16)
	for q := range 16 {
		begin2[q] = int64(100 + q)
	}
	begin2[3] = begin1[3] // queue 3 took nothing in epoch 1
	begin2[12] = 0        // nor did queue 12, which had nothing before
	return &layout{
		epochs: []epochRec{
			{Queues: 8, Started: 1},
			{Queues: 16, Started: 2, Marker: 50, Begin: begin1},
			{Queues: 4, Started: 3, Marker: 200, Begin: begin2},
		},
		intent: &epochRec{Queues: 6, Started: 4},
	}
}

func TestEpochsRoundTrip(t *testing.T) {
	l := history()
	raw, err := encodeEpochs(l)
	require.NoError(t, err)
	got, err := decodeEpochs([]byte(raw))
	require.NoError(t, err)
	require.Equal(t, l, got)

	md := map[string]string{metaQueues: "4", metaEpochs: raw}
	got, err = parseLayout(md, time.Unix(0, 1))
	require.NoError(t, err)
	require.Equal(t, l, got)
	require.Equal(t, 2, got.cur())
	require.Equal(t, 4, got.queues())
	require.Equal(t, 16, got.maxQueues())

	// A topic never resized: one epoch from its creation, no boundaries.
	created := time.Unix(1700000000, 5)
	got, err = parseLayout(map[string]string{metaQueues: "8"}, created)
	require.NoError(t, err)
	require.Equal(t, &layout{epochs: []epochRec{{Queues: 8, Started: created.UnixNano()}}}, got)
	ce := got.coreEpochs()
	require.Len(t, ce, 1)
	require.Nil(t, ce[0].Begin)
	require.True(t, created.Equal(ce[0].Started))
}

func TestDecodeEpochsRejects(t *testing.T) {
	b16 := "[" + zeros(16) + "]"
	for name, raw := range map[string]string{
		"empty":               ``,
		"not json":            `hello`,
		"no epochs":           `[]`,
		"object":              `{"queues":8}`,
		"unknown field":       `[{"queues":8,"started":1,"colour":"red"}]`,
		"trailing":            `[{"queues":8,"started":1}] []`,
		"zero queues":         `[{"queues":0,"started":1}]`,
		"too many queues":     `[{"queues":1025,"started":1}]`,
		"epoch 0 marker":      `[{"queues":8,"started":1,"marker":3}]`,
		"epoch 0 begin":       `[{"queues":8,"started":1,"begin":[1]}]`,
		"short begin":         `[{"queues":8,"started":1},{"queues":16,"started":2,"marker":5,"begin":[1,2]},{"queues":4,"started":3,"marker":9,"begin":` + b16 + `}]`,
		"marker goes back":    `[{"queues":8,"started":1},{"queues":16,"started":2,"marker":5,"begin":` + b16 + `},{"queues":4,"started":3,"marker":5,"begin":` + b16 + `}]`,
		"negative begin":      `[{"queues":1,"started":1},{"queues":1,"started":2,"marker":5,"begin":[-1]}]`,
		"begin goes back":     `[{"queues":1,"started":1},{"queues":1,"started":2,"marker":5,"begin":[4]},{"queues":1,"started":3,"marker":9,"begin":[3]}]`,
		"huge marker":         `[{"queues":1,"started":1},{"queues":1,"started":2,"marker":18446744073709551615,"begin":[1]}]`,
		"intent with begin":   `[{"queues":1,"started":1},{"queues":2,"started":2,"begin":[1,2]}]`,
		"intent bad count":    `[{"queues":1,"started":1},{"queues":0,"started":2}]`,
		"wrong type":          `[{"queues":"8","started":1}]`,
		"queue count too big": `[{"queues":99999999999999999999,"started":1}]`,
	} {
		_, err := decodeEpochs([]byte(raw))
		require.Error(t, err, name)
		require.True(t, errors.Is(err, errEpochs), "%s: %v", name, err)
	}
	// ferrymq.queues must be the count in force.
	raw, err := encodeEpochs(history())
	require.NoError(t, err)
	_, err = parseLayout(map[string]string{metaQueues: "6", metaEpochs: raw}, time.Unix(0, 1))
	require.ErrorIs(t, err, errEpochs)
	_, err = parseLayout(map[string]string{metaQueues: "x"}, time.Unix(0, 1))
	require.ErrorIs(t, err, errEpochs)
}

func zeros(n int) string {
	s := "0"
	for range n - 1 {
		s += ",0"
	}
	return s
}

func TestEncodeEpochsBounded(t *testing.T) {
	l := &layout{epochs: []epochRec{{Queues: core.MaxQueues, Started: 1}}}
	begin := make([]int64, core.MaxQueues)
	for i := range begin {
		begin[i] = math.MaxInt64 / 2
	}
	for k := 1; ; k++ {
		l = l.withIntent(core.MaxQueues, time.Unix(0, int64(k))).committed(uint64(k), begin)
		if _, err := encodeEpochs(l); err != nil {
			require.ErrorIs(t, err, ErrTooManyEpochs)
			require.Greater(t, k, 3, "a few epochs of the largest topics fit")
			return
		}
	}
}

// TestLayoutSegments: where each queue's messages of each epoch are.
func TestLayoutSegments(t *testing.T) {
	l := history().committedOnly()
	seg := func(q int) [][2]int64 {
		var out [][2]int64
		for _, s := range l.segments("t", q) {
			require.Equal(t, queueSubject("t", q, s.epoch), s.subject)
			out = append(out, [2]int64{int64(s.epoch), s.end})
		}
		return out
	}
	end := int64(math.MaxInt64)
	require.Equal(t, [][2]int64{{0, 10}, {1, 100}, {2, end}}, seg(0))
	require.Equal(t, [][2]int64{{0, 13}, {1, 13}, {2, end}}, seg(3)) // nothing in epoch 1
	require.Equal(t, [][2]int64{{0, 17}, {1, 107}}, seg(7))          // retired by epoch 2
	require.Equal(t, [][2]int64{{1, 108}}, seg(8))                   // only epoch 1 wrote to it
	require.Equal(t, [][2]int64{{1, 0}}, seg(12))
	require.Empty(t, seg(16))

	require.Equal(t, int64(0), l.lastBefore(3, 0))
	require.Equal(t, int64(13), l.lastBefore(3, 1))
	require.Equal(t, int64(13), l.lastBefore(3, 2))
	require.Equal(t, int64(0), l.lastBefore(12, 2))
	require.Equal(t, int64(115), l.lastBefore(15, 2))

	// Epoch 0's messages end by 17, epoch 1's by 115.
	require.Equal(t, int64(17), l.epochLast(0))
	require.Equal(t, int64(115), l.epochLast(1))
	require.Equal(t, 16, l.liveQueues(1))
	require.Equal(t, 16, l.liveQueues(115))
	require.Equal(t, 4, l.liveQueues(116))

	ce := l.coreEpochs()
	require.Len(t, ce, 3)
	require.Nil(t, ce[0].Begin)
	require.Equal(t, l.epochs[2].Begin, ce[2].Begin)
	require.Equal(t, 4, ce[2].Queues)
}

func TestQueueOf(t *testing.T) {
	for subject, want := range map[string][2]int{
		"fmq.t.0":     {0, 0},
		"fmq.t.17":    {17, 0},
		"fmq.t.3.1":   {3, 1},
		"fmq.t.0.12":  {0, 12},
		"fmq.t.1023":  {1023, 0},
		"fmq.t.5.999": {5, 999},
	} {
		q, e, ok := queueOf("t", subject)
		require.True(t, ok, subject)
		require.Equal(t, want, [2]int{q, e}, subject)
		require.Equal(t, subject, queueSubject("t", q, e))
	}
	for _, subject := range []string{"fmq.t", "fmq.t.", "fmq.u.1", "fmq.t.x", "fmq.t.01", "fmq.t.1.0", "fmq.t.1.01",
		"fmq.t.1.2.3", "fmq.t.-1", "fmqe.t.1", "fmq.t.1.", "fmq.t.99999999999", "fmq.tt.1"} {
		_, _, ok := queueOf("t", subject)
		require.False(t, ok, subject)
	}
	require.Equal(t, "fmq.t.*", epochPattern("t", 0))
	require.Equal(t, "fmq.t.*.3", epochPattern("t", 3))
	require.Equal(t, []string{"fmq.t.>"}, epochSubjects("t", 0))
	require.Equal(t, []string{"fmq.t.*.2", "fmqe.t.2"}, epochSubjects("t", 2))
}

// FuzzDecodeEpochs: any value of a stream's ferrymq.epochs decodes to a
// history that encodes back to itself, or is refused with errEpochs; it
// never panics. Seeds in testdata/fuzz/FuzzDecodeEpochs.
func FuzzDecodeEpochs(f *testing.F) {
	raw, err := encodeEpochs(history())
	require.NoError(f, err)
	f.Add([]byte(raw))
	f.Add([]byte(`[{"queues":8,"started":` + strconv.Itoa(1) + `}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := decodeEpochs(b)
		if err != nil {
			require.ErrorIs(t, err, errEpochs)
			return
		}
		again, err := encodeEpochs(l)
		require.NoError(t, err)
		back, err := decodeEpochs([]byte(again))
		require.NoError(t, err)
		require.Equal(t, l, back)
		for q := range l.maxQueues() + 1 {
			for _, s := range l.segments("t", q) {
				require.GreaterOrEqual(t, s.end, int64(0))
			}
		}
	})
}

func TestSubjectMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, subject string
		want             bool
	}{
		{"fmq.t.>", "fmq.t.1", true},
		{"fmq.t.>", "fmq.t.1.2", true},
		{"fmq.t.>", "fmq.t", false},
		{"fmq.t.*", "fmq.t.1", true},
		{"fmq.t.*", "fmq.t.1.2", false},
		{"fmq.t.*.2", "fmq.t.1.2", true},
		{"fmq.t.*.2", "fmq.t.1.3", false},
		{"fmq.t.*.2", "fmq.t.1", false},
		{"fmqe.t.2", "fmqe.t.2", true},
		{"fmq.u.>", "fmq.t.1", false},
	} {
		require.Equal(t, c.want, subjectMatch(c.pattern, c.subject), "%s ~ %s", c.pattern, c.subject)
	}
}
