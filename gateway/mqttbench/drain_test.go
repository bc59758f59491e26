package mqttbench

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDrain(t *testing.T) {
	never := func() bool { return false }
	t.Run("all arrived", func(t *testing.T) {
		r := &pubsub{o: &Options{Drain: time.Hour}, quiet: time.Hour}
		r.drain(t.Context(), func() bool { return true }, func() int64 { return 0 })
		require.Empty(t, r.errs.list())
	})
	t.Run("quiet", func(t *testing.T) {
		// Nothing arrives: the drain ends after the quiet time, not at Drain.
		r := &pubsub{o: &Options{Drain: time.Hour}, quiet: 50 * time.Millisecond}
		r.drain(t.Context(), never, func() int64 { return 7 })
		require.Empty(t, r.errs.list())
	})
	t.Run("cut short", func(t *testing.T) {
		// Messages keep arriving when Drain ends: the loss is overstated.
		var n atomic.Int64
		r := &pubsub{o: &Options{Drain: 100 * time.Millisecond}, quiet: time.Hour}
		r.drain(t.Context(), never, func() int64 { return n.Add(1) })
		errs := r.errs.list()
		require.Len(t, errs, 1)
		require.Contains(t, errs[0].Err, "still arriving after 100ms")
	})
}
