package retry

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core/trace"
)

// DefaultSchedule is RocketMQ's redelivery back-off: the delay before the
// n-th redelivery is DefaultSchedule[n-1], and the last level repeats if
// MaxAttempts is larger than the schedule. New copies it; changing this
// variable affects only Services created afterwards.
var DefaultSchedule = []time.Duration{
	10 * time.Second, 30 * time.Second,
	1 * time.Minute, 2 * time.Minute, 3 * time.Minute, 4 * time.Minute, 5 * time.Minute,
	6 * time.Minute, 7 * time.Minute, 8 * time.Minute, 9 * time.Minute, 10 * time.Minute,
	20 * time.Minute, 30 * time.Minute,
	1 * time.Hour, 2 * time.Hour,
}

// Clock is the time a Service schedules by. Deliver-at times are set from
// Now and compared with it; Until turns a wait into real time, so that a
// test clock that runs faster than the wall clock plays the default
// schedule's hours in seconds (*delay.ScaledClock is such a clock).
type Clock interface {
	Now() time.Time
	// Until returns how long to wait, in real time, for the clock to show t
	// (≤ 0 when it already does).
	Until(t time.Time) time.Duration
}

// systemClock is the wall clock.
type systemClock struct{}

func (systemClock) Now() time.Time                  { return time.Now() }
func (systemClock) Until(t time.Time) time.Duration { return time.Until(t) }

// DefaultMaxAttempts is how many times a message is redelivered before it is
// dead-lettered, as in RocketMQ.
const DefaultMaxAttempts = 16

// MaxLevels bounds len(Options.Schedule): each level is one queue of
// ScheduleTopic and one goroutine.
const MaxLevels = 1024

// Options configure a Service. A zero field means its default.
type Options struct {
	// Schedule is the delay before each redelivery; default DefaultSchedule.
	// Every entry must be positive. Its length fixes the queue count of
	// ScheduleTopic, so it must not change while scheduled messages exist.
	Schedule []time.Duration
	// MaxAttempts is how many redeliveries a message gets before SendBack
	// moves it to the group's dead-letter topic; default 16.
	MaxAttempts int
	// PollInterval is how long a scheduler pauses after a failed read or
	// produce, and the longest it idles on an empty queue without an
	// arrival; default 1 s.
	PollInterval time.Duration
	// Logger receives one line per event; default: discard.
	Logger *zerolog.Logger
	// Clock is what deliver-at times are set and compared by; default the
	// wall clock.
	Clock Clock
	// Trace, when set, records the hops of traced messages (those whose
	// original topic Trace.Enabled reports), under the ID of their first
	// original: "retry" when SendBack schedules one, "dead-letter" when one
	// is dead-lettered. Nil records nothing.
	Trace *trace.Recorder
}

func (o Options) withDefaults() Options {
	if o.Schedule == nil {
		o.Schedule = DefaultSchedule
	}
	o.Schedule = slices.Clone(o.Schedule)
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.PollInterval == 0 {
		o.PollInterval = time.Second
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	if o.Clock == nil {
		o.Clock = systemClock{}
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(o.Schedule) == 0 || len(o.Schedule) > MaxLevels {
		bad("schedule has %d levels: want 1 to %d", len(o.Schedule), MaxLevels)
	}
	for i, d := range o.Schedule {
		if d <= 0 {
			bad("schedule level %d is %v: must be positive", i, d)
		}
	}
	if o.MaxAttempts < 1 {
		bad("max attempts %d: at least 1", o.MaxAttempts)
	}
	if o.PollInterval < 0 {
		bad("poll interval %v: must be positive", o.PollInterval)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return nil
}
