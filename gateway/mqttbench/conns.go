package mqttbench

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// fdReserve is the file descriptors kept free of connections for
// everything else of the process.
const fdReserve = 64

// HoldingLine is printed (with the count) to Options.Progress, on a line
// of its own, once all connections of an idle run (or a connect run with
// Hold) are up: a script can wait for it and then measure the broker.
const HoldingLine = "holding %d connections"

// conns is one connect or idle run.
type conns struct {
	o    *Options
	d    *leanDialer
	errs errorSet

	connected, failed atomic.Int64
	dropped           atomic.Int64 // held connections a PINGREQ could not be written to
}

// runConns opens Conns lean connections on Workers goroutines (at Rate
// per second if set), then holds them (idle mode, or Hold > 0) and
// finally disconnects them.
func runConns(ctx context.Context, o *Options, addr brokerAddr) (res Result, err error) {
	r := &conns{o: o, d: &leanDialer{addr: addr.hostport, scheme: addr.scheme, wsPath: addr.path, tls: o.TLS,
		prefix: o.ClientPrefix, keepAlive: uint16(o.KeepAlive / time.Second), clean: !o.PersistentSession,
		username: o.Username, password: o.Password, subscribe: o.Subscribe, subQoS: o.SubQoS,
		timeout: o.ConnectTimeout, source: o.Source, perSource: o.ConnsPerSource}}
	res = Result{Mode: o.Mode, Label: o.Label, Addr: o.Addr, Version: 3, Started: time.Now()}
	defer func() { res.Errors = r.errs.list() }()
	cs := &Conns{Asked: o.Conns, Sources: r.d.sources(o.Conns), Subscribe: o.Subscribe, SubQoS: o.SubQoS}
	res.Conns = cs

	held := make([]net.Conn, o.Conns)
	defer func() { r.closeAll(held) }()
	pr := startProgress(o.Progress, o.ProgressInterval, r.connectLine())
	start := time.Now()
	h := r.open(ctx, held, start)
	pr.stop()
	res.Seconds = time.Since(start).Seconds()
	cs.Connected, cs.Failed = r.connected.Load(), r.failed.Load()
	if res.Seconds > 0 {
		cs.PerSec = float64(cs.Connected) / res.Seconds
	}
	cs.Latency = latencyOf(h)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if o.Mode == ModeConnect && o.Hold == 0 {
		return res, nil
	}

	cs.Held = int(cs.Connected)
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, HoldingLine+"\n", cs.Held)
	}
	begin := time.Now()
	r.hold(ctx, held)
	cs.HeldSeconds = time.Since(begin).Seconds()
	cs.Alive = r.countAlive(held)
	return res, nil // ending ctx ends the hold: not an error
}

// open opens len(held) connections into held and returns their CONNECT
// to CONNACK latencies. It returns early when ctx ends.
func (r *conns) open(ctx context.Context, held []net.Conn, start time.Time) *Histogram {
	o := r.o
	var next atomic.Int64
	hists := make([]*Histogram, min(o.Workers, len(held)))
	var wg sync.WaitGroup
	for w := range hists {
		hists[w] = NewHistogram()
		wg.Go(func() {
			var pace *time.Timer
			if o.Rate > 0 {
				pace = time.NewTimer(time.Hour)
				defer pace.Stop()
			}
			for i := int(next.Add(1) - 1); i < len(held) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if pace != nil {
					if wait := time.Until(start.Add(time.Duration(float64(i) / o.Rate * 1e9))); wait > 0 {
						pace.Reset(wait)
						select {
						case <-pace.C:
						case <-ctx.Done():
							return
						}
					}
				}
				conn, lat, err := r.d.connect(ctx, i)
				if err != nil {
					if ctx.Err() == nil {
						r.failed.Add(1)
						r.errs.add(err)
					}
					continue
				}
				held[i] = conn
				hists[w].Record(lat)
				r.connected.Add(1)
			}
		})
	}
	wg.Wait()
	h := NewHistogram()
	for _, wh := range hists {
		h.Merge(wh)
	}
	return h
}

// hold keeps the connections open for Hold (until ctx ends if 0) and,
// with a keepalive, writes a PINGREQ to each every KeepAlive/2 from this
// one goroutine.
func (r *conns) hold(ctx context.Context, held []net.Conn) {
	var end <-chan time.Time
	if r.o.Hold > 0 {
		t := time.NewTimer(r.o.Hold)
		defer t.Stop()
		end = t.C
	}
	var ping <-chan time.Time
	if r.o.KeepAlive > 0 {
		t := time.NewTicker(r.o.KeepAlive / 2)
		defer t.Stop()
		ping = t.C
	}
	pr := startProgress(r.o.Progress, r.o.ProgressInterval, func(el time.Duration, _ bool) string {
		return fmt.Sprintf("hold   %6.1fs  held %7d  dropped %7d", el.Seconds(), r.connected.Load()-r.dropped.Load(), r.dropped.Load())
	})
	defer pr.stop()
	for {
		select {
		case <-ping:
			r.ping(held)
		case <-end:
			return
		case <-ctx.Done():
			return
		}
	}
}

// ping writes a PINGREQ to every held connection; one that cannot take it
// is closed and counted as dropped.
func (r *conns) ping(held []net.Conn) {
	for i, c := range held {
		if c == nil {
			continue
		}
		if err := c.SetWriteDeadline(time.Now().Add(time.Second)); err == nil {
			_, err = c.Write(pingreq)
			if err == nil {
				continue
			}
			r.errs.add(fmt.Errorf("write PINGREQ: %w", err))
		}
		r.dropped.Add(1)
		_ = c.Close()
		held[i] = nil
	}
}

// countAlive counts the held connections the server has not closed.
func (r *conns) countAlive(held []net.Conn) int {
	n := 0
	for _, c := range held {
		if c != nil && alive(c) {
			n++
		}
	}
	return n
}

// closeAll sends DISCONNECT on every connection and closes it.
func (r *conns) closeAll(held []net.Conn) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(r.o.Workers, len(held)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(held); i = int(next.Add(1) - 1) {
				if c := held[i]; c != nil {
					_ = c.SetWriteDeadline(time.Now().Add(time.Second))
					_, _ = c.Write(disconnect)
					_ = c.Close()
					held[i] = nil
				}
			}
		})
	}
	wg.Wait()
}

// connectLine reports connections made, their rate over the last
// interval, and failures.
func (r *conns) connectLine() func(el time.Duration, final bool) string {
	var last int64
	var lastEl time.Duration
	return func(el time.Duration, final bool) string {
		n := r.connected.Load()
		dt := (el - lastEl).Seconds()
		if final {
			dt, last = el.Seconds(), 0
		}
		rate := float64(n-last) / max(dt, 1e-9)
		last, lastEl = n, el
		return fmt.Sprintf("%-7s%6.1fs  connected %7d %7.0f/s  failed %7d", r.o.Mode, el.Seconds(), n, rate, r.failed.Load())
	}
}
