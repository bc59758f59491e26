package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/trace"
)

// Defaults.
const (
	// DefaultMaxBodyBytes is Options.MaxBodyBytes's default: 8 MiB, a
	// request that carries a core.MaxBodyBytes (4 MiB) body raw or as JSON
	// body_base64 (5.3 MiB) with its metadata. The message itself is
	// bounded by the broker (413 message_too_large).
	DefaultMaxBodyBytes = 8 << 20
	// DefaultMaxWait is Options.MaxWait's default.
	DefaultMaxWait = 30 * time.Second
	// DefaultMaxBatch is Options.MaxBatch's default.
	DefaultMaxBatch = 1024
)

// Options configure the handler New returns. A zero field means its default.
type Options struct {
	// Broker stores produced messages and checks topics; required.
	Broker core.Broker
	// Pop serves the consume endpoints (GET …/messages, POST …/ack,
	// POST …/invisible). When nil they answer 501 consume_disabled. Start it
	// (pop.Service.Start): without its reviver unacknowledged messages never
	// come back.
	Pop *pop.Service
	// Delay serves GET and DELETE /api/v1/delayed…; nil answers them 501.
	// Broker should then be its Broker, so that produces with a delay are
	// delayed.
	Delay *delay.Service
	// Elsewhere, when set, is asked before the endpoints of Pop (shard:
	// the consumer group, of a handle's for acks) and Delay (shard "")
	// serve a request: a cluster node answers for a shard another node
	// serves (503 not_leader naming it; w for headers such as
	// Retry-After), nil for one it serves — and then Pop or Delay nil
	// answer 501 as without it.
	Elsewhere func(w http.ResponseWriter, shard string) error
	// Logger receives one line per failed request; default: discard.
	Logger *zerolog.Logger
	// MaxBodyBytes bounds a request body; larger ones are answered 413
	// body_too_large without being read further. Default
	// DefaultMaxBodyBytes (8 MiB).
	MaxBodyBytes int64
	// MaxWait caps the ?wait= of a long poll; longer waits are cut to it.
	// Default 30 s. The server's WriteTimeout must be longer.
	MaxWait time.Duration
	// MaxBatch bounds the messages of one produce batch and the handles of
	// one ack request; more are answered 413 batch_too_large. Default 1024.
	MaxBatch int
	// Trace, when set, records the hops of traced messages produced here:
	// "produce" (actor "http", the remote address), then "stored", or
	// "delayed" for one that waits for its deliver-at time, under the ID
	// the producer got. Pop records the consuming hops with its own
	// recorder. Nil records nothing.
	Trace *trace.Recorder
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxWait == 0 {
		o.MaxWait = DefaultMaxWait
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.Broker == nil {
		bad("broker is required")
	}
	if o.MaxBodyBytes < 0 {
		bad("max body bytes %d: must be positive", o.MaxBodyBytes)
	}
	if o.MaxWait < 0 {
		bad("max wait %v: must be positive", o.MaxWait)
	}
	if o.MaxBatch < 0 {
		bad("max batch %d: must be positive", o.MaxBatch)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return nil
}
