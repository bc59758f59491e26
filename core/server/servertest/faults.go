package servertest

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/core"
)

// Faults is a broker behind a switch, for Options.ServerBroker: healthy,
// failing every produce as a store that refuses writes would
// (core.ErrStoreFailed), or stalling it — no answer until the switch moves
// (then it fails). Everything else goes to the broker it wraps. It is the
// fault injection of tests that need a node to misbehave; the rest of the
// server stays real.
type Faults struct {
	core.Broker
	mode    atomic.Int32
	mu      sync.Mutex
	stalled []func()
}

// The modes of a Faults.
const (
	Healthy int32 = iota
	FailProduce
	StallProduce
)

// Wrap is the Options.ServerBroker that puts f in front of the server's
// broker.
func (f *Faults) Wrap(b core.Broker) core.Broker {
	f.Broker = b
	return f
}

// Set moves the switch; leaving StallProduce answers what it held (with
// an error). Tests call Set(Healthy) before their servers stop.
func (f *Faults) Set(mode int32) {
	f.mode.Store(mode)
	if mode == StallProduce {
		return
	}
	f.mu.Lock()
	held := f.stalled
	f.stalled = nil
	f.mu.Unlock()
	for _, h := range held {
		h()
	}
}

// ProduceAsync is the path the server's produce requests take.
func (f *Faults) ProduceAsync(msgs []*core.Message, done func([]core.SendResult, error)) {
	switch f.mode.Load() {
	case FailProduce:
		done(nil, fmt.Errorf("injected: %w", core.ErrStoreFailed))
	case StallProduce:
		f.mu.Lock()
		f.stalled = append(f.stalled, func() { done(nil, fmt.Errorf("injected stall: %w", core.ErrStoreFailed)) })
		f.mu.Unlock()
	default:
		f.Broker.ProduceAsync(msgs, done)
	}
}
