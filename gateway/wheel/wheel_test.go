package wheel

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type timer struct {
	deadline int64 // what the item says its deadline is now
	fired    int64
}

func TestItemsFireAtTheirDeadline(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	w := New[*timer](time.Second, 8, start)
	at := func(s int) int64 { return start.Add(time.Duration(s) * time.Second).UnixNano() }
	a := &timer{deadline: at(2)}
	b := &timer{deadline: at(5)}
	far := &timer{deadline: at(20)} // past one turn of 8 slots
	past := &timer{deadline: at(-3)}
	for _, x := range []*timer{a, b, far, past} {
		w.Add(x, x.deadline)
	}
	require.Equal(t, 4, w.Len())
	fire := func(x *timer, _, now int64) int64 {
		if x.deadline > now {
			return x.deadline // not yet: back in the wheel
		}
		x.fired = now
		return 0
	}
	for s := 0; s <= 25; s++ {
		w.Advance(start.Add(time.Duration(s)*time.Second), fire)
		switch s {
		case 0:
			require.NotZero(t, past.fired, "a past deadline fires at once")
			require.Zero(t, a.fired)
		case 2:
			require.Equal(t, at(2), a.fired)
		case 3:
			// Activity moved b's deadline: it is put back when its old slot comes.
			b.deadline = at(9)
		case 5:
			require.Zero(t, b.fired, "b moved on")
		case 9:
			require.Equal(t, at(9), b.fired)
		case 19:
			require.Zero(t, far.fired, "more than a turn ahead: waits")
		case 20:
			require.Equal(t, at(20), far.fired)
		}
	}
	require.Zero(t, w.Len())
}

func TestAdvanceCatchesUpAfterAPause(t *testing.T) {
	start := time.Unix(5_000, 0)
	w := New[int](100*time.Millisecond, 16, start)
	for i := range 100 {
		w.Add(i, start.Add(time.Duration(i)*50*time.Millisecond).UnixNano())
	}
	n := w.Advance(start.Add(10*time.Second), func(int, int64, int64) int64 { return 0 })
	require.Equal(t, 100, n, "every slot between the last advance and now is run")
	require.Zero(t, w.Len())
}

func BenchmarkAddAdvance(b *testing.B) {
	start := time.Unix(0, 0)
	w := New[int](time.Second, 4096, start)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		w.Add(i, start.Add(time.Duration(i%4000)*time.Second).UnixNano())
		i++
	}
	w.Advance(start.Add(5000*time.Second), func(int, int64, int64) int64 { return 0 })
}
