package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The breaker's state machine on a clock the test moves (the only thing
// faked here: time): it opens at the failure ratio once the window holds
// MinCalls, lets one probe through after the pause, doubles the pause on a
// failed probe up to the maximum, closes on a good one, and forgets
// failures older than the window.
func TestBreaker(t *testing.T) {
	now := time.Unix(1000, 0)
	b := newBreaker(BreakerOptions{Window: 10 * time.Second, MinCalls: 4, FailureRatio: 0.5, OpenFor: time.Second, MaxOpenFor: 3 * time.Second},
		func() time.Time { return now })
	allow := func() (bool, bool) {
		ok, probe, _ := b.allow()
		return ok, probe
	}

	// 3 failures: under MinCalls, still closed.
	for range 3 {
		require.Nil(t, b.record(false, false))
	}
	ok, _ := allow()
	require.True(t, ok)
	// Failures older than the window are forgotten.
	now = now.Add(11 * time.Second)
	require.Nil(t, b.record(true, false))
	require.Nil(t, b.record(true, false))
	require.Nil(t, b.record(true, false))
	require.Nil(t, b.record(false, false), "1 of 4 failed")
	require.Nil(t, b.record(false, false), "2 of 5")
	tr := b.record(false, false) // 3 of 6: at the ratio
	require.Equal(t, &transition{BreakerClosed, BreakerOpen}, tr)

	// Open: nothing through until the pause ends.
	ok, _ = allow()
	require.False(t, ok)
	now = now.Add(999 * time.Millisecond)
	ok, _ = allow()
	require.False(t, ok)
	now = now.Add(time.Millisecond)
	ok, probe, tr := b.allow()
	require.True(t, ok)
	require.True(t, probe)
	require.Equal(t, &transition{BreakerOpen, BreakerHalfOpen}, tr)
	ok, _ = allow()
	require.False(t, ok, "one probe at a time")

	// A failed probe: open again for twice the pause.
	require.Equal(t, &transition{BreakerHalfOpen, BreakerOpen}, b.record(false, true))
	now = now.Add(1999 * time.Millisecond)
	ok, _ = allow()
	require.False(t, ok)
	now = now.Add(time.Millisecond)
	ok, probe = allow()
	require.True(t, ok && probe)
	require.Equal(t, &transition{BreakerHalfOpen, BreakerOpen}, b.record(false, true))
	now = now.Add(3 * time.Second) // capped at MaxOpenFor, not 4 s
	ok, probe = allow()
	require.True(t, ok && probe)

	// Outcomes of calls that were not the probe change nothing meanwhile.
	require.Nil(t, b.record(true, false))
	st, _, _ := b.snapshot()
	require.Equal(t, BreakerHalfOpen, st)

	// A good probe closes it, with a clean window and the first pause.
	require.Equal(t, &transition{BreakerHalfOpen, BreakerClosed}, b.record(true, true))
	st, calls, fails := b.snapshot()
	require.Equal(t, BreakerClosed, st)
	require.Zero(t, calls)
	require.Zero(t, fails)
	for range 4 {
		b.record(false, false)
	}
	st, _, _ = b.snapshot()
	require.Equal(t, BreakerOpen, st)
	now = now.Add(time.Second)
	ok, probe = allow()
	require.True(t, ok && probe, "the pause is back to OpenFor")
}
