package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// The faults of the torture run: SIGKILL and restart of the server, a
// nearly full disk, devices cut off, malformed packets, a subscriber that
// reads very slowly, and the RSS sampler that watches the server.

type tortureChaos struct {
	srv       *tortureServer
	disk      *tortureDisk
	devices   []*tortureDevice
	counters  *tortureCounters
	log       zerolog.Logger
	killEvery time.Duration
	fullEvery time.Duration // 0: one window, in the middle of the run
	fullHold  time.Duration
	duration  time.Duration
	mqttAddr  string
	abort     context.CancelFunc // ends the run when the server cannot be restarted

	diskFull atomic.Int64

	refMu    sync.Mutex
	refusing []timeSpan // the store refused writes (disk filled … restarted)

	metMu   sync.Mutex
	metrics map[int]map[string]float64 // pid → the last values scraped

	mu            sync.Mutex
	malformed     map[string]int
	malformedShut int
	rss           []rssSample

	slowBytes atomic.Int64
	slowDrops atomic.Int64
}

// jitter is d ± 20 %.
func jitter(rng *rand.Rand, d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rng.Float64()))
}

// killLoop SIGKILLs the server every killEvery (± 20 %) and starts it again
// at once; once in the middle of the run (or every fullEvery) the disk is
// filled for fullHold, and the server is killed and restarted 3 s after it
// was freed (a store that failed a write refuses writes until reopened).
// Both happen on this goroutine, so the server is never killed while the
// disk is full: it must find room to recover.
func (c *tortureChaos) killLoop(ctx context.Context, rng *rand.Rand) {
	never := time.Now().Add(1000 * time.Hour)
	nextFull := time.Now().Add(c.duration / 2)
	if c.fullEvery > 0 {
		nextFull = time.Now().Add(c.fullEvery)
	}
	if !c.disk.mounted || c.fullHold <= 0 {
		nextFull = never
	}
	nextKill := never
	if c.killEvery > 0 {
		nextKill = time.Now().Add(jitter(rng, c.killEvery))
	}
	for ctx.Err() == nil {
		if nextFull.Before(nextKill) {
			if pause(ctx, time.Until(nextFull)); ctx.Err() != nil {
				return
			}
			c.fillWindow(ctx)
			nextFull = never
			if c.fullEvery > 0 {
				nextFull = time.Now().Add(c.fullEvery)
			}
			// After a failed write the store refuses writes until it is
			// reopened (core/store/doc.go): the operator restarts it.
			if soon := time.Now().Add(3 * time.Second); c.killEvery > 0 && soon.Before(nextKill) {
				nextKill = soon
			}
			continue
		}
		if pause(ctx, time.Until(nextKill)); ctx.Err() != nil {
			return
		}
		c.log.Info().Int("pid", c.srv.running()).Msg("SIGKILL")
		c.srv.kill()
		c.restart(ctx)
		c.endRefusal()
		nextKill = time.Now().Add(jitter(rng, c.killEvery))
	}
}

// restart starts the server, trying a few times; the run ends if it cannot.
func (c *tortureChaos) restart(ctx context.Context) {
	for i := range 3 {
		err := c.srv.start(context.WithoutCancel(ctx))
		if err == nil {
			return
		}
		c.log.Error().Err(err).Int("try", i+1).Msg("restart failed")
	}
	c.log.Error().Msg("the server does not start again: ending the run")
	c.abort()
}

// fillWindow takes the disk to nearly full for fullHold, then frees it.
func (c *tortureChaos) fillWindow(ctx context.Context) {
	c.refMu.Lock()
	c.refusing = append(c.refusing, timeSpan{From: time.Now()})
	c.refMu.Unlock()
	n, err := c.disk.fill(64 << 10)
	if err != nil {
		c.log.Warn().Err(err).Msg("disk filler")
	}
	c.diskFull.Add(1)
	c.log.Info().Int64("filler_bytes", n).Msg("disk nearly full")
	pause(ctx, c.fullHold)
	if err := c.disk.unfill(); err != nil {
		c.log.Warn().Err(err).Msg("disk filler remove")
	}
	c.log.Info().Msg("disk freed")
}

// endRefusal closes the span of refused writes, if one is open: the server
// was restarted.
func (c *tortureChaos) endRefusal() {
	c.refMu.Lock()
	defer c.refMu.Unlock()
	if n := len(c.refusing); n > 0 && c.refusing[n-1].To.IsZero() {
		c.refusing[n-1].To = time.Now()
	}
}

func (c *tortureChaos) refusalOpen() bool {
	c.refMu.Lock()
	defer c.refMu.Unlock()
	n := len(c.refusing)
	return n > 0 && c.refusing[n-1].To.IsZero()
}

// refusals are the spans of refused writes; an open one ends now.
func (c *tortureChaos) refusals() []timeSpan {
	c.refMu.Lock()
	defer c.refMu.Unlock()
	out := append([]timeSpan(nil), c.refusing...)
	if n := len(out); n > 0 && out[n-1].To.IsZero() {
		out[n-1].To = time.Now()
	}
	return out
}

// disconnectLoop cuts a random device's connection every `every` (± 20 %);
// one time in three the device then sleeps (stays offline) for 2–6 s.
func (c *tortureChaos) disconnectLoop(ctx context.Context, rng *rand.Rand, every time.Duration) {
	if every <= 0 || len(c.devices) == 0 {
		return
	}
	for ctx.Err() == nil {
		if pause(ctx, jitter(rng, every)); ctx.Err() != nil {
			return
		}
		d := c.devices[rng.IntN(len(c.devices))]
		cut := false
		if rng.IntN(3) == 0 {
			cut = d.sleep(time.Duration(2000+rng.IntN(4000)) * time.Millisecond)
			c.counters.sleeps.Add(1)
		} else {
			cut = d.abort()
		}
		if cut {
			c.counters.disconnects.Add(1)
		}
	}
}

// Malformed input, each on its own raw connection; the server must close
// it and keep serving everyone else.

func appendRemaining(b []byte, n int) []byte {
	for {
		c := byte(n % 128)
		n /= 128
		if n > 0 {
			c |= 0x80
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

func appendMQTTString(b []byte, s string) []byte {
	return append(append(b, byte(len(s)>>8), byte(len(s))), s...)
}

// rawConnect is a CONNECT (clean session, keepalive 60 s) of protocol
// level 4 (3.1.1) or 5, naming the protocol name.
func rawConnect(level byte, name, clientID string) []byte {
	var vh []byte
	vh = appendMQTTString(vh, name)
	vh = append(vh, level, 0x02, 0, 60)
	if level == 5 {
		vh = append(vh, 0) // no properties
	}
	vh = appendMQTTString(vh, clientID)
	return append(appendRemaining([]byte{0x10}, len(vh)), vh...)
}

// malformedKinds are the injections, by name: the bytes, and whether the
// socket's write side is closed after them.
var malformedKinds = []struct {
	name     string
	bytes    func(rng *rand.Rand, id string) []byte
	closeOut bool
}{
	{"garbage", func(rng *rand.Rand, _ string) []byte {
		b := make([]byte, 16+rng.IntN(240))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		b[0] = 0xF0 | b[0]&0x0F // packet type 15 (AUTH) first: never a CONNECT
		return b
	}, false},
	{"not-connect-first", func(*rand.Rand, string) []byte { return []byte{0xC0, 0x00} }, false},
	{"oversized", func(_ *rand.Rand, id string) []byte {
		return append(rawConnect(4, "MQTT", id), 0x30, 0xFF, 0xFF, 0xFF, 0x7F) // a 256 MiB PUBLISH
	}, false},
	{"varint-5-bytes", func(_ *rand.Rand, id string) []byte {
		return append(rawConnect(4, "MQTT", id), 0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01)
	}, false},
	{"truncated", func(_ *rand.Rand, id string) []byte {
		return append(rawConnect(4, "MQTT", id), 0x32, 100, 0, 5, 't', 'e', 'l', 'e', 'm', 0, 1) // 100 declared, 9 sent
	}, true},
	{"type-0", func(_ *rand.Rand, id string) []byte { return append(rawConnect(4, "MQTT", id), 0x00, 0x00) }, false},
	{"v5-subscribe-no-options", func(_ *rand.Rand, id string) []byte {
		body := appendMQTTString([]byte{0, 1, 0}, "a/bc") // packet id 1, no properties, a filter, and no options byte
		sub := append(appendRemaining([]byte{0x82}, len(body)), body...)
		return append(rawConnect(5, "MQTT", id), sub...)
	}, false},
	{"bad-protocol-name", func(_ *rand.Rand, id string) []byte { return rawConnect(4, "MQTX", id) }, false},
	{"wildcard-topic-name", func(_ *rand.Rand, id string) []byte {
		pub := []byte{0x32, 0}
		body := appendMQTTString(nil, "telemetry/+/x")
		body = append(body, 0, 1, 'x')
		pub[1] = byte(len(body))
		return append(append(rawConnect(4, "MQTT", id), pub[:2]...), body...)
	}, false},
	{"subscribe-bad-flags", func(_ *rand.Rand, id string) []byte {
		sub := []byte{0x80, 8, 0, 1} // flags must be 0b0010
		sub = appendMQTTString(sub, "a/b")
		return append(append(rawConnect(4, "MQTT", id), sub...), 0)
	}, false},
}

// malformedLoop injects one malformed input every `every`.
func (c *tortureChaos) malformedLoop(ctx context.Context, rng *rand.Rand, every time.Duration) {
	if every <= 0 {
		return
	}
	c.mu.Lock()
	c.malformed = map[string]int{}
	c.mu.Unlock()
	for n := 0; ctx.Err() == nil; n++ {
		if pause(ctx, jitter(rng, every)); ctx.Err() != nil {
			return
		}
		k := malformedKinds[rng.IntN(len(malformedKinds))]
		d := net.Dialer{Timeout: time.Second}
		conn, err := d.DialContext(ctx, "tcp", c.mqttAddr)
		if err != nil {
			continue // the server is restarting
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, werr := conn.Write(k.bytes(rng, "tt-bad-"+itoa(int64(n))))
		if k.closeOut {
			_ = conn.(*net.TCPConn).CloseWrite()
		}
		// The server must close it: read until EOF or a reset.
		_, rerr := io.Copy(io.Discard, conn)
		_ = conn.Close()
		var ne net.Error
		shut := werr != nil || rerr == nil || !(errors.As(rerr, &ne) && ne.Timeout())
		c.mu.Lock()
		c.malformed[k.name]++
		if shut {
			c.malformedShut++
		}
		c.mu.Unlock()
	}
}

// slowSubscriber is an MQTT 3.1.1 subscriber to every device topic on a
// socket with a 4 KiB receive buffer that reads 256 bytes every 100 ms
// (2.5 KB/s, far below the load): the server must drop messages for it, or
// it, without slowing anyone else. It reconnects when dropped.
func (c *tortureChaos) slowSubscriber(ctx context.Context) {
	for ctx.Err() == nil {
		d := net.Dialer{Timeout: time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			})
		}}
		conn, err := d.DialContext(ctx, "tcp", c.mqttAddr)
		if err != nil {
			pause(ctx, 500*time.Millisecond)
			continue
		}
		sub := []byte{0x82, 0, 0, 1}
		sub = append(appendMQTTString(sub, "telemetry/#"), 0)
		sub[1] = byte(len(sub) - 2)
		hello := append(rawConnect(4, "MQTT", "tt-slow-subscriber"), sub...)
		stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
		if _, err := conn.Write(hello); err == nil {
			buf := make([]byte, 256)
			for ctx.Err() == nil {
				_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
				n, err := conn.Read(buf)
				c.slowBytes.Add(int64(n))
				if err != nil {
					if ctx.Err() == nil {
						c.slowDrops.Add(1)
					}
					break
				}
				pause(ctx, 100*time.Millisecond)
			}
		}
		stop()
		_ = conn.Close()
		pause(ctx, 500*time.Millisecond)
	}
}

// sampleRSS reads the server's memory every 250 ms.
func (c *tortureChaos) sampleRSS(ctx context.Context) {
	every(ctx, 250*time.Millisecond, func() {
		if pid := c.srv.running(); pid != 0 {
			if s, err := readRSS(pid); err == nil {
				c.mu.Lock()
				c.rss = append(c.rss, s)
				c.mu.Unlock()
			}
		}
	})
}

// scrapedMetrics are the server counters the report sums over the
// server's lives (the last value scraped from each process).
var scrapedMetrics = []string{
	"ferrymq_downlink_receipt_failures_total",
	"ferrymq_presence_event_failures_total",
	"ferrymq_mqtt_panics_recovered_total",
	"ferrymq_bridge_uplink_failures_total",
	"ferrymq_bridge_qos2_duplicates_total",
	"ferrymq_bridge_qos2_unsure_resends_total",
	"ferrymq_downlink_messages_total",
	"ferrymq_mqtt_connections_refused_total",
	"ferrymq_mqtt_messages_dropped_total",
}

// scrapeMetrics reads the server's /metrics every second.
func (c *tortureChaos) scrapeMetrics(ctx context.Context, url string) {
	hc := &http.Client{Timeout: 2 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	every(ctx, time.Second, func() {
		pid := c.srv.running()
		if pid == 0 {
			return
		}
		res, err := hc.Do(req)
		if err != nil {
			return
		}
		vals := map[string]float64{}
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			l := sc.Text()
			for _, name := range scrapedMetrics {
				if !strings.HasPrefix(l, name) {
					continue
				}
				series, v, ok := strings.Cut(l, " ")
				if f, err := strconv.ParseFloat(v, 64); ok && err == nil && f != 0 {
					vals[series] = f
				}
			}
		}
		_ = res.Body.Close()
		c.metMu.Lock()
		if c.metrics == nil {
			c.metrics = map[int]map[string]float64{}
		}
		c.metrics[pid] = vals
		c.metMu.Unlock()
	})
}

func (c *tortureChaos) metricTotals() map[string]float64 {
	c.metMu.Lock()
	defer c.metMu.Unlock()
	out := map[string]float64{}
	for _, vals := range c.metrics {
		for k, v := range vals {
			out[k] += v
		}
	}
	return out
}

func (c *tortureChaos) samples() []rssSample {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]rssSample(nil), c.rss...)
}

func (c *tortureChaos) malformedCounts() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.malformed))
	for k, v := range c.malformed {
		m[k] = v
	}
	return m, c.malformedShut
}
