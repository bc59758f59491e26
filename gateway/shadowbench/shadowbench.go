// Package shadowbench is the load generator behind `ferrymq bench shadow`:
// device shadow updates against a running server, from both sides at
// once. Devices (MQTT 3.1.1, eclipse/paho.mqtt.golang) publish reported
// updates to $shadow/<id>/update at QoS 1, one at a time each, and wait
// for the accepted answer; backends (the core wire protocol, the Go
// client) update desired, one at a time each. It counts accepted and
// rejected updates and measures request → answer latency per side.
//
// Run owns every goroutine and connection it starts and ends them before
// it returns.
package shadowbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/gateway/mqttbench"
)

// Options say what to run.
type Options struct {
	// MQTT is the gateway's MQTT address (host:port); Core its core port.
	MQTT, Core string
	// Token is the core port's token, if it needs one.
	Token string
	// Username and Password, if set, authenticate the devices.
	Username, Password string
	// Devices connect over MQTT, each reporting in a loop; Backends dial
	// the core port, each updating desired of the devices in turn. Either
	// may be 0, not both.
	Devices, Backends int
	// Prefix names the devices: <Prefix>0, <Prefix>1, …
	Prefix string
	// Warmup runs before the measured window; Duration is the window.
	Warmup, Duration time.Duration
	// Progress, if set, gets a line a second.
	Progress io.Writer
}

// Side is one side's result.
type Side struct {
	Accepted  int64   `json:"accepted"`
	Rejected  int64   `json:"rejected"`
	PerSecond float64 `json:"updates_per_sec"`
	P50us     int64   `json:"p50_us"`
	P99us     int64   `json:"p99_us"`
	MaxUs     int64   `json:"max_us"`
}

// Result is a run's measured window.
type Result struct {
	Devices   int     `json:"devices"`
	Backends  int     `json:"backends"`
	Window    float64 `json:"window_s"`
	PerSecond float64 `json:"updates_per_sec"`
	Reported  Side    `json:"reported"`
	Desired   Side    `json:"desired"`
}

// side counts one side's answers in the measured window.
type side struct {
	mu       sync.Mutex
	hist     *mqttbench.Histogram
	accepted atomic.Int64
	rejected atomic.Int64
}

func newSide() *side { return &side{hist: mqttbench.NewHistogram()} }

func (s *side) record(measuring bool, ok bool, d time.Duration) {
	if !measuring {
		return
	}
	if !ok {
		s.rejected.Add(1)
		return
	}
	s.accepted.Add(1)
	s.mu.Lock()
	s.hist.Record(d)
	s.mu.Unlock()
}

func (s *side) result(window time.Duration) Side {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.accepted.Load()
	return Side{Accepted: a, Rejected: s.rejected.Load(), PerSecond: float64(a) / window.Seconds(),
		P50us: s.hist.Quantile(0.5).Microseconds(), P99us: s.hist.Quantile(0.99).Microseconds(), MaxUs: s.hist.Quantile(1).Microseconds()}
}

// Run connects the devices and backends, runs the warmup and the window,
// and returns the window's result.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Devices < 0 || o.Backends < 0 || o.Devices+o.Backends == 0 {
		return Result{}, errors.New("shadowbench: want devices or backends")
	}
	if o.Duration <= 0 {
		return Result{}, errors.New("shadowbench: want a duration")
	}
	if o.Prefix == "" {
		o.Prefix = "shadow-bench-"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var measuring atomic.Bool
	reported, desired := newSide(), newSide()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	for i := range o.Devices {
		id := o.Prefix + strconv.Itoa(i)
		c, answers, err := connectDevice(o, id)
		if err != nil {
			return Result{}, err
		}
		wg.Go(func() {
			defer c.Disconnect(0)
			deviceLoop(ctx, c, id, answers, reported, &measuring)
		})
	}
	for b := range o.Backends {
		c, err := client.Dial(ctx, client.Options{Addr: o.Core, Token: o.Token, RequestTimeout: 10 * time.Second})
		if err != nil {
			return Result{}, fmt.Errorf("shadowbench: core %s: %w", o.Core, err)
		}
		wg.Go(func() {
			defer c.Close()
			backendLoop(ctx, c, o, b, desired, &measuring)
		})
	}
	if !sleep(ctx, o.Warmup) {
		return Result{}, ctx.Err()
	}
	measuring.Store(true)
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	end := time.After(o.Duration)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-end:
			done = true
		case <-tick.C:
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "%4.0fs  reported %d  desired %d  rejected %d\n", time.Since(start).Seconds(),
					reported.accepted.Load(), desired.accepted.Load(), reported.rejected.Load()+desired.rejected.Load())
			}
		}
	}
	measuring.Store(false)
	window := time.Since(start)
	r := Result{Devices: o.Devices, Backends: o.Backends, Window: window.Seconds(),
		Reported: reported.result(window), Desired: desired.result(window)}
	r.PerSecond = r.Reported.PerSecond + r.Desired.PerSecond
	return r, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// answer is an accepted (ok) or rejected answer to a device.
type answer struct{ ok bool }

func connectDevice(o Options, id string) (paho3.Client, chan answer, error) {
	answers := make(chan answer, 4)
	acc, rej := "$shadow/"+id+"/update/accepted", "$shadow/"+id+"/update/rejected"
	po := paho3.NewClientOptions().AddBroker("tcp://" + o.MQTT).SetClientID(id).SetCleanSession(true).
		SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).SetUsername(o.Username).SetPassword(o.Password).
		SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) {
			switch m.Topic() {
			case acc:
				answers <- answer{ok: true}
			case rej:
				answers <- answer{}
			}
		})
	c := paho3.NewClient(po)
	tok := c.Connect()
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return nil, nil, fmt.Errorf("shadowbench: device %s: connect: %v", id, tok.Error())
	}
	return c, answers, nil
}

// deviceLoop reports, waits for the answer, and again.
func deviceLoop(ctx context.Context, c paho3.Client, id string, answers chan answer, s *side, measuring *atomic.Bool) {
	topic := "$shadow/" + id + "/update"
	for i := 0; ctx.Err() == nil; i++ {
		start := time.Now()
		c.Publish(topic, 1, false, `{"state":{"reported":{"temp":`+strconv.Itoa(i%40)+`,"seq":`+strconv.Itoa(i)+`,"fw":"1.4.2"}}}`)
		select {
		case <-ctx.Done():
			return
		case a := <-answers:
			s.record(measuring.Load(), a.ok, time.Since(start))
		case <-time.After(10 * time.Second):
			return // the server stopped answering
		}
	}
}

// backendLoop updates desired of the devices in turn.
func backendLoop(ctx context.Context, c *client.Client, o Options, b int, s *side, measuring *atomic.Bool) {
	n := max(o.Devices, 1)
	for i := 0; ctx.Err() == nil; i++ {
		id := o.Prefix + strconv.Itoa((b+i)%n)
		start := time.Now()
		_, err := c.UpdateShadow(ctx, id, json.RawMessage(`{"temp":`+strconv.Itoa(i%40)+`}`), 0)
		if ctx.Err() != nil {
			return
		}
		s.record(measuring.Load(), err == nil, time.Since(start))
	}
}
