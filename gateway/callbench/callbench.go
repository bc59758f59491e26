// Package callbench measures synchronous calls to devices (RRPC) end to
// end: Devices MQTT 5 clients (paho.golang) connect to the gateway and
// answer every request on its Response Topic; backends call them over the
// core port (the Go client) at a fixed Rate, open loop — each call is
// timed from when it was due, not from when it was sent, so a server that
// falls behind shows in the latencies instead of slowing the load. `ferrymq
// bench rpc` runs it.
package callbench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/wire"
	"github.com/ferrymq/ferrymq/gateway/devicesim"
	"github.com/ferrymq/ferrymq/gateway/mqttbench"
)

// Targets: how the calls are made.
const (
	// TargetFerryMQ calls through ferrymq's core port (Client.Call): the
	// gateway delivers the request and takes the answer.
	TargetFerryMQ = "ferrymq"
	// TargetMQTT does what a backend without RRPC does: MQTT 5
	// request/response through any broker. Backends are MQTT clients that
	// publish each request (QoS 1) to rpcbench/req/{device} with a
	// Response Topic rpcbench/resp/{backend}/{n} and Correlation Data, and
	// subscribe to rpcbench/resp/{backend}/#; devices subscribe to their
	// request topic and answer. Nothing tells a backend a device is
	// offline: it waits for the timeout.
	TargetMQTT = "mqtt"
)

// Options configure a run; zero fields get the defaults in brackets.
type Options struct {
	// Target is TargetFerryMQ [] or TargetMQTT.
	Target string
	// MQTT is the gateway's MQTT TCP address the devices connect to.
	MQTT string
	// Core is the core address the calls are made through, and Token its
	// token.
	Core  string
	Token string
	// Devices connected and called in turn [1,000].
	Devices int
	// Rate of calls per second [1,000].
	Rate int
	// Duration of the measured calls [30 s]; Warmup before it [2 s].
	Duration time.Duration
	Warmup   time.Duration
	// Timeout of each call [5 s].
	Timeout time.Duration
	// Size of each request's payload in bytes [64].
	Size int
	// Conns is the number of core connections the calls share [4].
	Conns int
	// Prefix begins the devices' client IDs ["rpcbench-"].
	Prefix string
	// Progress, when set, is called every second with the calls so far.
	Progress func(done, answered int64, elapsed time.Duration)
}

func (o *Options) defaults() {
	o.Devices = cmpOr(o.Devices, 1000)
	o.Rate = cmpOr(o.Rate, 1000)
	o.Duration = cmpOr(o.Duration, 30*time.Second)
	o.Warmup = cmpOr(o.Warmup, 2*time.Second)
	o.Timeout = cmpOr(o.Timeout, 5*time.Second)
	o.Size = cmpOr(o.Size, 64)
	o.Conns = cmpOr(o.Conns, 4)
	if o.Prefix == "" {
		o.Prefix = "rpcbench-"
	}
	o.Target = cmpOr(o.Target, TargetFerryMQ)
}

func cmpOr[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// Result is what a run measured (the warm-up excluded).
type Result struct {
	Devices      int           `json:"devices"`
	Rate         int           `json:"rate"`
	Calls        int64         `json:"calls"`
	Answered     int64         `json:"answered"`
	Timeouts     int64         `json:"timeouts"`
	NotConnected int64         `json:"not_connected"`
	Errors       int64         `json:"errors"`
	Elapsed      time.Duration `json:"elapsed_ns"`
	// PerSecond is answered calls per second of the measured part.
	PerSecond float64 `json:"per_second"`
	// Quantiles of answered calls, from when each was due.
	P50 time.Duration `json:"p50_ns"`
	P90 time.Duration `json:"p90_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
	// FirstError is one error met, for the report.
	FirstError string `json:"first_error,omitempty"`
}

// Run connects the devices, calls them for Warmup + Duration and returns
// what the measured part saw. The devices and connections are closed when
// it returns.
func Run(ctx context.Context, o Options) (Result, error) {
	o.defaults()
	if o.Target != TargetFerryMQ && o.Target != TargetMQTT {
		return Result{}, fmt.Errorf("callbench: target %q: want %s or %s", o.Target, TargetFerryMQ, TargetMQTT)
	}
	devs, err := connectDevices(ctx, o)
	defer closeDevices(devs)
	if err != nil {
		return Result{}, err
	}
	if o.Target == TargetMQTT {
		backends, err := connectBackends(ctx, o)
		defer closeBackends(backends)
		if err != nil {
			return Result{}, err
		}
		callers := make([]caller, len(backends))
		for i, b := range backends {
			callers[i] = b.call
		}
		return call(ctx, o, callers)
	}
	clients := make([]*client.Client, o.Conns)
	for i := range clients {
		if clients[i], err = client.Dial(ctx, client.Options{Addr: o.Core, Token: o.Token, ClientID: o.Prefix + "caller-" + strconv.Itoa(i)}); err != nil {
			for _, c := range clients[:i] {
				_ = c.Close()
			}
			return Result{}, fmt.Errorf("callbench: dial the core: %w", err)
		}
	}
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	callers := make([]caller, len(clients))
	for i, c := range clients {
		callers[i] = func(ctx context.Context, dev string, payload []byte) error {
			_, err := c.Call(ctx, dev, payload)
			return err
		}
	}
	return call(ctx, o, callers)
}

// caller makes one call to device dev, returning when it was answered.
type caller func(ctx context.Context, dev string, payload []byte) error

// tally is the calls' outcomes; hist is guarded by mu.
type tally struct {
	mu                                      sync.Mutex
	hist                                    *mqttbench.Histogram
	calls, answered, timeouts, absent, errs atomic.Int64
	first                                   atomic.Pointer[string]
}

// call makes calls at o.Rate until the run ends, then waits for those in
// flight.
func call(ctx context.Context, o Options, callers []caller) (Result, error) {
	payload := make([]byte, o.Size)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	interval := time.Second / time.Duration(o.Rate)
	var warm, measured tally
	warm.hist, measured.hist = mqttbench.NewHistogram(), mqttbench.NewHistogram()
	start := time.Now()
	measureFrom := start.Add(o.Warmup)
	end := measureFrom.Add(o.Duration)
	var wg sync.WaitGroup
	stopProgress := progress(o, &measured, measureFrom)
	defer stopProgress()
	for k := int64(0); ; k++ {
		due := start.Add(time.Duration(k) * interval)
		if !due.Before(end) || ctx.Err() != nil {
			break
		}
		if d := time.Until(due); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		t := &warm
		if !due.Before(measureFrom) {
			t = &measured
		}
		c := callers[k%int64(len(callers))]
		dev := o.Prefix + strconv.Itoa(int(k%int64(o.Devices)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, o.Timeout)
			defer cancel()
			t.record(due, c(cctx, dev, payload))
		}()
	}
	wg.Wait()
	el := time.Since(measureFrom)
	if el > o.Duration {
		el = o.Duration // the tail waited for is not time the load ran
	}
	r := Result{Devices: o.Devices, Rate: o.Rate, Calls: measured.calls.Load(), Answered: measured.answered.Load(),
		Timeouts: measured.timeouts.Load(), NotConnected: measured.absent.Load(), Errors: measured.errs.Load(), Elapsed: el,
		P50: measured.hist.Quantile(0.50), P90: measured.hist.Quantile(0.90), P99: measured.hist.Quantile(0.99), Max: measured.hist.Quantile(1)}
	r.PerSecond = float64(r.Answered) / el.Seconds()
	if f := measured.first.Load(); f != nil {
		r.FirstError = *f
	}
	return r, ctx.Err()
}

// record counts a call due at due that ended with err.
func (t *tally) record(due time.Time, err error) {
	t.calls.Add(1)
	switch {
	case err == nil:
		lat := time.Since(due)
		t.answered.Add(1)
		t.mu.Lock()
		t.hist.Record(lat)
		t.mu.Unlock()
		return
	case errors.Is(err, wire.ErrDeviceTimeout) || errors.Is(err, context.DeadlineExceeded):
		t.timeouts.Add(1)
	case errors.Is(err, wire.ErrDeviceNotConnected):
		t.absent.Add(1)
	default:
		t.errs.Add(1)
	}
	s := err.Error()
	t.first.CompareAndSwap(nil, &s)
}

// progress reports the measured calls every second until stopped.
func progress(o Options, t *tally, from time.Time) (stop func()) {
	if o.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				o.Progress(t.calls.Load(), t.answered.Load(), time.Since(from))
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// connectDevices connects o.Devices devices answering every request with
// its payload (gateway/devicesim), 64 at a time.
func connectDevices(ctx context.Context, o Options) ([]*devicesim.Device, error) {
	devs := make([]*devicesim.Device, o.Devices)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i := range devs {
		g.Go(func() error {
			id := o.Prefix + strconv.Itoa(i)
			so := devicesim.Options{Addr: o.MQTT, ClientID: id, Answer: "{payload}", KeepAlive: 60}
			if o.Target == TargetMQTT {
				so.AnswerAll, so.Subscribe = true, []string{requestTopic(id)}
			}
			d, err := devicesim.Connect(gctx, so)
			devs[i] = d
			if err != nil {
				return fmt.Errorf("callbench: device %s: %w", id, err)
			}
			return nil
		})
	}
	err := g.Wait()
	return devs, err
}

// closeDevices disconnects the devices once their answers are out.
func closeDevices(devs []*devicesim.Device) {
	var wg sync.WaitGroup
	for _, d := range devs {
		if d == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = d.Close()
		}()
	}
	wg.Wait()
}
