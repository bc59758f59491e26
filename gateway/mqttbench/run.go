package mqttbench

import (
	"context"
	"fmt"
)

// Run runs the benchmark o describes and returns what it measured.
//
// Run returns only after every goroutine and connection it started has
// ended. When ctx ends first, it stops, closes everything, and returns
// what it measured so far with ctx's error, except while holding
// connections (idle mode, or connect mode with Hold): there ending ctx is
// how a hold without a duration ends, and the result comes without error.
func Run(ctx context.Context, o Options) (Result, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return Result{}, err
	}
	addr, _ := parseAddr(o.Addr) // validated
	// One file descriptor per connection: raise the soft limit first.
	limit, err := raiseFileLimit()
	if err != nil {
		return Result{}, err
	}
	conns := o.Publishers + o.Subscribers + o.SlowSubscribers
	if o.Mode != ModePubSub {
		conns = o.Conns
	}
	if uint64(conns)+fdReserve > limit {
		return Result{}, fmt.Errorf("%w: %d connections need more than this process's %d file descriptors", ErrInvalidOptions, conns, limit)
	}
	if o.Mode == ModePubSub {
		return runPubSub(ctx, &o, addr)
	}
	return runConns(ctx, &o, addr)
}
