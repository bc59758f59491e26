package pop

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core/trace"
)

// Defaults and limits, as in RocketMQ.
const (
	// DefaultInvisible is Options.DefaultInvisible's default.
	DefaultInvisible = 60 * time.Second
	// DefaultMinInvisible is Options.MinInvisible's default.
	DefaultMinInvisible = 10 * time.Second
	// DefaultMaxInvisible is Options.MaxInvisible's default.
	DefaultMaxInvisible = 12 * time.Hour
	// DefaultMaxPop is Options.MaxPop's default.
	DefaultMaxPop = 32
	// MaxPopLimit bounds Options.MaxPop.
	MaxPopLimit = 1024
	// DefaultMaxInflight is Options.MaxInflight's default.
	DefaultMaxInflight = 2048
	// MaxInflightLimit bounds Options.MaxInflight.
	MaxInflightLimit = 1 << 16
)

// Options configure a Service. A zero field means its default.
type Options struct {
	// DefaultInvisible is the invisible time of a Pop that asks for none;
	// default 60 s.
	DefaultInvisible time.Duration
	// MinInvisible and MaxInvisible bound the invisible time a Pop or
	// ChangeInvisibleTime may ask for; defaults 10 s and 12 h.
	MinInvisible time.Duration
	MaxInvisible time.Duration
	// MaxPop bounds the messages one Pop returns; default 32, at most 1024.
	MaxPop int
	// MaxInflight bounds, per (group, topic, queue), the span from the
	// oldest message not yet done to the next one to hand out, and so the
	// memory a queue's in-flight state takes; default 2048. A queue at the
	// bound hands out nothing more until its oldest message is acknowledged
	// or expires.
	MaxInflight int
	// RetryInterval is how long the reviver waits before trying again to
	// send back an expired message after a failure; default 1 s.
	RetryInterval time.Duration
	// Logger receives one line per event; default: discard.
	Logger *zerolog.Logger
	// Now is the clock for invisibility deadlines; default time.Now.
	Now func() time.Time
	// Trace, when set, records the hops of traced messages (those whose
	// topic, or original topic for a retried message, Trace.Enabled
	// reports): "delivered" when Pop hands one out, "acked" when its handle
	// acknowledges it. Expiries are recorded by the retry service, as its
	// own hops. Nil records nothing.
	Trace *trace.Recorder
}

func (o Options) withDefaults() Options {
	if o.DefaultInvisible == 0 {
		o.DefaultInvisible = DefaultInvisible
	}
	if o.MinInvisible == 0 {
		o.MinInvisible = DefaultMinInvisible
	}
	if o.MaxInvisible == 0 {
		o.MaxInvisible = DefaultMaxInvisible
	}
	if o.MaxPop == 0 {
		o.MaxPop = DefaultMaxPop
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = DefaultMaxInflight
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = time.Second
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.MinInvisible < 0 || o.MinInvisible > o.MaxInvisible {
		bad("invisible time bounds [%v, %v]: want 0 < min ≤ max", o.MinInvisible, o.MaxInvisible)
	}
	if o.DefaultInvisible < o.MinInvisible || o.DefaultInvisible > o.MaxInvisible {
		bad("default invisible time %v outside [%v, %v]", o.DefaultInvisible, o.MinInvisible, o.MaxInvisible)
	}
	if o.MaxPop < 1 || o.MaxPop > MaxPopLimit {
		bad("max pop %d: want 1 to %d", o.MaxPop, MaxPopLimit)
	}
	if o.MaxInflight < 1 || o.MaxInflight > MaxInflightLimit {
		bad("max inflight %d: want 1 to %d", o.MaxInflight, MaxInflightLimit)
	}
	if o.RetryInterval < 0 {
		bad("retry interval %v: must be positive", o.RetryInterval)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return nil
}
