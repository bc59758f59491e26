package delay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
)

// Defaults.
const (
	// DefaultMaxDelay is how far ahead a message may be scheduled: 40 days.
	DefaultMaxDelay = 40 * 24 * time.Hour
	// DefaultTick is the precision: the hold of the finest level.
	DefaultTick = time.Second
	// DefaultMaxHold is the hold of the coarsest level, 2^16 s (18 h 12 m):
	// a message waits at most this long in one stored copy, so it must stay
	// well below the store's retention (72 h by default).
	DefaultMaxHold = (1 << 16) * time.Second
	// DefaultPastTolerance is how far in the past a deliver-at may lie and
	// still be accepted (delivered at once): clocks of producers and server
	// differ.
	DefaultPastTolerance = time.Minute
	// DefaultCancelKeep is how long after its due time a cancellation is
	// remembered, so that a copy of the message that reappears (a crash
	// replayed a hop) is still dropped.
	DefaultCancelKeep = 7 * 24 * time.Hour
)

// maxLevels bounds the number of levels (and queues of DelayTopic).
const maxLevels = 48

// Options configure a Service. A zero field means its default.
type Options struct {
	// Cancels, when set, keeps cancellations instead of the cancel log in
	// the service's folder: a store shared by the nodes that may run the
	// service in turn (the JetStream engine's bucket). Its entries must live
	// at least MaxDelay + CancelKeep.
	Cancels CancelStore
	// MaxDelay bounds deliver-at − now; default 40 days. Further ahead is
	// ErrDelayTooLong.
	MaxDelay time.Duration
	// Tick is the hold of the finest level and the delivery precision;
	// default 1 s.
	Tick time.Duration
	// MaxHold is the hold of the coarsest level; it is rounded down to Tick
	// times a power of two. Default 2^16 s. Keep it below half the store's
	// retention: a copy older than the retention would be deleted with its
	// segment before it moves on.
	MaxHold time.Duration
	// PastTolerance is how far in the past a deliver-at may lie; such a
	// message is delivered at once. Default 1 minute; further back is
	// ErrDeliverAtPast.
	PastTolerance time.Duration
	// DisableAutoCreate refuses delayed messages for topics that do not
	// exist (core.ErrTopicNotFound at produce time) instead of creating
	// them, to match a store that does not auto-create.
	DisableAutoCreate bool
	// CancelKeep is how long after its due time a cancellation is kept;
	// default 7 days.
	CancelKeep time.Duration
	// PollInterval is how long a level pauses after a failed read or
	// produce, and the longest it waits before looking at the clock again;
	// default 1 s.
	PollInterval time.Duration
	// BatchSize is how many copies a level reads and moves at once; default
	// 256.
	BatchSize int
	// Clock is what deliver-at times are compared with; default the wall
	// clock.
	Clock Clock
	// Logger receives one line per event; default: discard.
	Logger *zerolog.Logger
	// Trace, if set, records when a traced message is stored in its topic
	// (hop "stored", under the ID its producer got).
	Trace *trace.Recorder
}

func (o Options) withDefaults() Options {
	if o.MaxDelay == 0 {
		o.MaxDelay = DefaultMaxDelay
	}
	if o.Tick == 0 {
		o.Tick = DefaultTick
	}
	if o.MaxHold == 0 {
		o.MaxHold = DefaultMaxHold
	}
	if o.PastTolerance == 0 {
		o.PastTolerance = DefaultPastTolerance
	}
	if o.CancelKeep == 0 {
		o.CancelKeep = DefaultCancelKeep
	}
	if o.PollInterval == 0 {
		o.PollInterval = time.Second
	}
	if o.BatchSize == 0 {
		o.BatchSize = 256
	}
	if o.Clock == nil {
		o.Clock = SystemClock{}
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.MaxDelay < 0 {
		bad("max delay %v: must be positive", o.MaxDelay)
	}
	if o.Tick < time.Millisecond {
		bad("tick %v: at least 1 ms", o.Tick)
	}
	if o.MaxHold < o.Tick {
		bad("max hold %v: at least one tick (%v)", o.MaxHold, o.Tick)
	} else if o.Tick > 0 && levelCount(o.Tick, o.MaxHold) > maxLevels {
		bad("max hold %v: at most 2^%d ticks", o.MaxHold, maxLevels-2)
	}
	if o.PastTolerance < 0 || o.CancelKeep < 0 || o.PollInterval < 0 {
		bad("past tolerance, cancel keep and poll interval must be positive")
	}
	if o.BatchSize < 1 || o.BatchSize > 4096 {
		bad("batch size %d: want 1 to 4096", o.BatchSize)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return nil
}

// levelCount is the number of levels for tick and maxHold: level 0 (the
// last sub-tick wait) and one level per power of two from tick up to the
// largest tick·2^k ≤ maxHold.
func levelCount(tick, maxHold time.Duration) int {
	n := 2
	for h := tick; h*2 <= maxHold && n <= maxLevels; h *= 2 {
		n++
	}
	return n
}

// CancelStore keeps cancellations of delayed messages durably.
type CancelStore interface {
	// Load returns every cancellation kept: original message ID → due time.
	Load(ctx context.Context) (map[core.MessageID]time.Time, error)
	// Add stores one durably before it returns.
	Add(ctx context.Context, id core.MessageID, due time.Time) error
}
