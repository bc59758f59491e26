package mqttbench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHistogramBuckets(t *testing.T) {
	for v := int64(0); v < 1<<20; v += 1 + v/1000 {
		i := histBucket(v)
		low, width := histRange(i)
		require.True(t, low <= v && v < low+width, "v=%d bucket %d [%d, %d)", v, i, low, low+width)
		if v >= 2*histSub {
			require.LessOrEqual(t, float64(width)/float64(low), 1.0/histSub, "v=%d", v)
		}
	}
	huge := int64(1<<63 - 1)
	require.Equal(t, histBuckets-1, histBucket(huge))
	low, width := histRange(histBuckets - 1)
	require.Equal(t, huge, low+(width-1))
	require.Equal(t, 0, histBucket(-5))
}

func TestHistogramQuantiles(t *testing.T) {
	t.Run("uniform", func(t *testing.T) {
		// 1 µs … 100 ms in steps of 1 µs: the q-quantile is q·100 ms.
		h := NewHistogram()
		for i := 1; i <= 100_000; i++ {
			h.Record(time.Duration(i) * time.Microsecond)
		}
		require.EqualValues(t, 100_000, h.Count())
		for _, c := range []struct {
			q    float64
			want time.Duration
		}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {0.999, 99_900 * time.Microsecond}, {1, 100 * time.Millisecond}} {
			got := h.Quantile(c.q)
			require.InEpsilon(t, float64(c.want), float64(got), 0.004, "q=%v: %v", c.q, got)
		}
		require.InEpsilon(t, float64(time.Microsecond), float64(h.Quantile(0.000001)), 0.004, "the minimum")
	})
	t.Run("exact below 256ns", func(t *testing.T) {
		h := NewHistogram()
		for i := 1; i <= 200; i++ {
			h.Record(time.Duration(i))
		}
		require.Equal(t, time.Duration(100), h.Quantile(0.5))
		require.Equal(t, time.Duration(198), h.Quantile(0.99))
		require.Equal(t, time.Duration(200), h.Quantile(0.999))
	})
	t.Run("tail", func(t *testing.T) {
		// 990 fast values and 10 slow ones: p99 is fast, p99.9 slow.
		h, other := NewHistogram(), NewHistogram()
		for range 990 {
			h.Record(300 * time.Microsecond)
		}
		for range 10 {
			other.Record(40 * time.Millisecond)
		}
		h.Merge(other)
		require.EqualValues(t, 1000, h.Count())
		require.InEpsilon(t, float64(300*time.Microsecond), float64(h.Quantile(0.5)), 0.004)
		require.InEpsilon(t, float64(300*time.Microsecond), float64(h.Quantile(0.99)), 0.004)
		require.InEpsilon(t, float64(40*time.Millisecond), float64(h.Quantile(0.999)), 0.004)
		require.Equal(t, 40*time.Millisecond, h.Quantile(1), "kept within the recorded max")
	})
	t.Run("empty", func(t *testing.T) {
		require.Zero(t, NewHistogram().Quantile(0.99))
	})
}
