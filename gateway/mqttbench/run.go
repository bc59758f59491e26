package mqttbench

import "context"

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
	if o.Mode == ModePubSub {
		return runPubSub(ctx, &o, addr)
	}
	return runConns(ctx, &o, addr)
}
