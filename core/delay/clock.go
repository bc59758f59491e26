package delay

import "time"

// Clock is the time the service schedules by. Deliver-at times are compared
// with Now; Until converts a wait into real time, so that a test clock that
// runs faster than the wall clock compresses days into seconds.
type Clock interface {
	Now() time.Time
	// Until returns how long to wait, in real time, for the clock to show t
	// (≤ 0 when it already does).
	Until(t time.Time) time.Duration
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Until returns time.Until(t).
func (SystemClock) Until(t time.Time) time.Duration { return time.Until(t) }

// ScaledClock is a clock that starts at Origin when the wall clock shows
// Start and then runs Factor times faster than it. Tests and benchmarks use
// it to play hours of delays in seconds.
type ScaledClock struct {
	Start  time.Time
	Origin time.Time
	Factor float64
}

// NewScaledClock returns a ScaledClock that shows origin now.
func NewScaledClock(origin time.Time, factor float64) *ScaledClock {
	return &ScaledClock{Start: time.Now(), Origin: origin, Factor: factor}
}

// Now returns the scaled time.
func (c *ScaledClock) Now() time.Time {
	return c.Origin.Add(time.Duration(float64(time.Since(c.Start)) * c.Factor))
}

// Until returns the real time left until the clock shows t.
func (c *ScaledClock) Until(t time.Time) time.Duration {
	return time.Duration(float64(t.Sub(c.Now())) / c.Factor)
}
