package txn

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// Defaults, as in RocketMQ's transactional messages (transactionTimeout
// 6 s, transactionCheckInterval 30 s, transactionCheckMax 15).
const (
	// DefaultFirstCheck is Options.FirstCheck's default.
	DefaultFirstCheck = 6 * time.Second
	// DefaultCheckInterval is Options.CheckInterval's default.
	DefaultCheckInterval = 30 * time.Second
	// DefaultMaxChecks is Options.MaxChecks's default.
	DefaultMaxChecks = 15
	// DefaultMaxPending is Options.MaxPending's default.
	DefaultMaxPending = 100_000
	// DefaultPollInterval is Options.PollInterval's default.
	DefaultPollInterval = time.Second
)

// Options configure a Service. A zero field means its default.
type Options struct {
	// FirstCheck is how long after a half was stored its producer group is
	// first asked for the outcome; default 6 s.
	FirstCheck time.Duration
	// CheckInterval is the time between later checks; default 30 s.
	CheckInterval time.Duration
	// MaxChecks is how many checks a half gets; when the next one falls due
	// without an answer the half is discarded (never delivered) and an
	// error line logged; default 15.
	MaxChecks int
	// MaxPending bounds the unresolved halves; SendHalf beyond it fails
	// with ErrTooManyPending. Default 100,000. Each takes about 100 bytes of
	// memory (no bodies are kept).
	MaxPending int
	// PollInterval is how long the checker waits before trying a check
	// again after a failure, and the longest it idles; default 1 s.
	PollInterval time.Duration
	// Logger receives one line per event; default: discard.
	Logger *zerolog.Logger
	// Now is the clock for check times; default time.Now. Check times are
	// reckoned from the broker's store times, so it should be the broker's
	// clock.
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.FirstCheck == 0 {
		o.FirstCheck = DefaultFirstCheck
	}
	if o.CheckInterval == 0 {
		o.CheckInterval = DefaultCheckInterval
	}
	if o.MaxChecks == 0 {
		o.MaxChecks = DefaultMaxChecks
	}
	if o.MaxPending == 0 {
		o.MaxPending = DefaultMaxPending
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
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
	if o.FirstCheck < 0 {
		bad("first check %v: must be positive", o.FirstCheck)
	}
	if o.CheckInterval < 0 {
		bad("check interval %v: must be positive", o.CheckInterval)
	}
	if o.MaxChecks < 1 {
		bad("max checks %d: at least 1", o.MaxChecks)
	}
	if o.MaxPending < 1 {
		bad("max pending %d: at least 1", o.MaxPending)
	}
	if o.PollInterval < 0 {
		bad("poll interval %v: must be positive", o.PollInterval)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return nil
}
