package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session/state"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/gateway/mqttbench"
)

// The devices of the torture run. Each publishes to telemetry/<id> (the
// default bridge maps it to core topic telemetry, key = client ID) at a
// paced rate, one message at a time: a QoS 1/2 message is published only
// once the previous one was acknowledged (or given up on at the end of the
// run), a QoS 0 one once it was written. Every payload carries the device
// ID, a per-device sequence number, the QoS and the attempt number.
//
// Four kinds, by index mod 4:
//
//	v3 clean       paho.mqtt.golang, clean session 1: after a lost
//	               connection the application publishes again (attempt+1)
//	v3 persistent  paho.mqtt.golang, clean session 0, one client object
//	               reconnected by hand: the library resends the unacknowledged
//	               publish (DUP) on every reconnect
//	v5 clean       paho.golang, clean start, a new client per connection
//	v5 persistent  paho.golang, session expiry 1 h, one session state shared
//	               by the clients of successive connections: it resends
//
// What counts as acknowledged: v3 — a PUBACK (QoS 1) or PUBCOMP (QoS 2) with
// the message's packet ID read off the wire by the connection wrapper (not
// paho's token, which completes without error when a resend replaces it);
// v5 — paho.golang's Publish returning a PUBACK/PUBCOMP with a success code
// (PUBCOMP 0x92 after a successful PUBREC counts: the PUBREC was the
// durability point).

const (
	// deviceKeepAlive is short: a dead socket a client library missed is
	// noticed when a ping goes unanswered (keepalive + ping timeout), and
	// the device waits for that. (mochi warns below 5 s.)
	deviceKeepAlive   = 5 // seconds
	deviceAckWait     = 20 * time.Second
	deviceDialTimeout = 3 * time.Second
)

type deviceKind struct {
	version    int
	persistent bool
	name       string
}

var deviceKinds = []deviceKind{{4, false, "v3c"}, {4, true, "v3p"}, {5, false, "v5c"}, {5, true, "v5p"}}

// tortureCounters are shared counters of the run.
type tortureCounters struct {
	reconnects  atomic.Int64
	refused     atomic.Int64
	disconnects atomic.Int64
	sleeps      atomic.Int64
}

type tortureDevice struct {
	id       string
	kind     deviceKind
	addr     string
	size     int
	interval time.Duration
	rng      *rand.Rand
	counters *tortureCounters
	log      zerolog.Logger

	mu        sync.Mutex
	gaveUp    bool // publishing ended
	pubs      []pubObs
	cmds      map[int64]int
	misrouted int
	lat       *mqttbench.Histogram

	sleepUntil atomic.Int64 // unix ns: stay offline until then

	connMu sync.Mutex
	conn   *tortureConn // the current connection's socket
	everUp bool
	// sessionsLost counts reconnections of a persistent device that the
	// server answered "session present 0"; present is the last answer.
	sessionsLost int
	present      bool

	// v3
	c3    paho3.Client
	acks  map[uint16]byte
	ackCh chan struct{} // a wire ack arrived

	// v5
	sess5 *state.State // persistent: survives connections
	c5    *paho.Client

	wg sync.WaitGroup // publish calls of v5
}

func newTortureDevice(i int, prefix, addr string, size int, rate float64, seed uint64, counters *tortureCounters, log *zerolog.Logger) *tortureDevice {
	k := deviceKinds[i%len(deviceKinds)]
	id := fmt.Sprintf("%s%s-%02d", prefix, k.name, i)
	d := &tortureDevice{id: id, kind: k, addr: addr, size: size, interval: time.Duration(float64(time.Second) / rate),
		rng: rand.New(rand.NewPCG(seed, 1000+uint64(i))), counters: counters, cmds: map[int64]int{}, lat: mqttbench.NewHistogram(),
		acks: map[uint16]byte{}, ackCh: make(chan struct{}, 1), log: log.With().Str("device", id).Logger()}
	if k.version == 4 {
		d.c3 = paho3.NewClient(d.options3())
	} else if k.persistent {
		d.sess5 = state.NewInMemory()
	}
	return d
}

// obs returns what the device saw.
func (d *tortureDevice) obs() deviceObs {
	d.mu.Lock()
	defer d.mu.Unlock()
	cmds := make(map[int64]int, len(d.cmds))
	for k, v := range d.cmds {
		cmds[k] = v
	}
	d.connMu.Lock()
	lostSessions := d.sessionsLost
	d.connMu.Unlock()
	return deviceObs{ID: d.id, Version: d.kind.version, Persistent: d.kind.persistent,
		Pubs: append([]pubObs(nil), d.pubs...), Commands: cmds, Misrouted: d.misrouted, SessionsLost: lostSessions}
}

// run publishes until load ends, finishing the message in flight until
// drain ends (then it sends on idle), then stays connected (receiving
// commands) until done ends.
func (d *tortureDevice) run(load, drain, done context.Context, idle chan<- struct{}) {
	defer d.close()
	for seq := int64(1); ; seq++ {
		t := time.NewTimer(time.Duration(float64(d.interval) * (0.5 + d.rng.Float64())))
		select {
		case <-t.C:
		case <-load.Done():
			t.Stop()
		}
		if load.Err() != nil {
			break
		}
		qos := byte(0)
		switch x := d.rng.IntN(100); {
		case x >= 55:
			qos = 2
		case x >= 20:
			qos = 1
		}
		if d.kind.version == 4 {
			d.publish3(drain, seq, qos)
		} else {
			d.publish5(drain, seq, qos)
		}
	}
	d.mu.Lock()
	d.gaveUp = true
	d.mu.Unlock()
	idle <- struct{}{} // buffered for every device
	// Stay online for the commands still on their way.
	for done.Err() == nil {
		if d.kind.version == 4 {
			lost := d.ensure3(done)
			select {
			case <-lost:
			case <-done.Done():
			}
		} else {
			c := d.ensure5(done)
			if c == nil {
				break
			}
			select {
			case <-c.Done():
			case <-done.Done():
			}
		}
	}
}

// pending is the message in flight, if any.
func (d *tortureDevice) pending() (pubObs, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := len(d.pubs); n > 0 && d.pubs[n-1].QoS > 0 && !d.pubs[n-1].Acked && !d.gaveUp {
		return d.pubs[n-1], true
	}
	return pubObs{}, false
}

// record adds or updates the record of seq (the last one).
func (d *tortureDevice) record(p pubObs) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := len(d.pubs); n > 0 && d.pubs[n-1].Seq == p.Seq {
		d.pubs[n-1] = p
		return
	}
	d.pubs = append(d.pubs, p)
}

func (d *tortureDevice) payload(seq int64, qos byte, attempt int) []byte {
	b := fmt.Appendf(nil, "tt d=%s s=%d q=%d a=%d ", d.id, seq, qos, attempt)
	for len(b) < d.size {
		b = append(b, 'x')
	}
	return b
}

// parseTorturePayload reads a device payload back.
func parseTorturePayload(b []byte) (dev string, seq int64, qos byte, attempt int, ok bool) {
	s := string(b[:min(len(b), 200)])
	rest, found := strings.CutPrefix(s, "tt ")
	if !found {
		return "", 0, 0, 0, false
	}
	f := strings.Fields(rest)
	if len(f) < 4 {
		return "", 0, 0, 0, false
	}
	get := func(i int, key string) (string, bool) { return strings.CutPrefix(f[i], key+"=") }
	dv, ok1 := get(0, "d")
	ss, ok2 := get(1, "s")
	qs, ok3 := get(2, "q")
	as, ok4 := get(3, "a")
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return "", 0, 0, 0, false
	}
	sq, err1 := strconv.ParseInt(ss, 10, 64)
	q, err2 := strconv.Atoi(qs)
	a, err3 := strconv.Atoi(as)
	if err1 != nil || err2 != nil || err3 != nil || q < 0 || q > 2 {
		return "", 0, 0, 0, false
	}
	return dv, sq, byte(q), a, true
}

// commandPayload is the body of command n for device id.
func commandPayload(n int64, id string) string { return fmt.Sprintf("cmd n=%d d=%s", n, id) }

func parseCommandPayload(b []byte) (n int64, dev string, ok bool) {
	f := strings.Fields(string(b))
	if len(f) != 3 || f[0] != "cmd" {
		return 0, "", false
	}
	ns, ok1 := strings.CutPrefix(f[1], "n=")
	dev, ok2 := strings.CutPrefix(f[2], "d=")
	n, err := strconv.ParseInt(ns, 10, 64)
	return n, dev, ok1 && ok2 && err == nil
}

func (d *tortureDevice) onCommand(payload []byte) {
	n, dev, ok := parseCommandPayload(payload)
	d.mu.Lock()
	defer d.mu.Unlock()
	if !ok || dev != d.id {
		d.misrouted++
		return
	}
	d.cmds[n]++
}

// sleep cuts the connection and keeps the device offline for a while (a
// persistent session is parked meanwhile, its commands queued or expired).
func (d *tortureDevice) sleep(dur time.Duration) bool {
	d.sleepUntil.Store(time.Now().Add(dur).UnixNano())
	return d.abort()
}

// waitAwake waits while the device sleeps.
func (d *tortureDevice) waitAwake(ctx context.Context) {
	if until := time.Unix(0, d.sleepUntil.Load()); time.Now().Before(until) {
		pause(ctx, time.Until(until))
	}
}

// abort cuts the current connection abruptly (RST, no DISCONNECT).
func (d *tortureDevice) abort() bool {
	d.connMu.Lock()
	c := d.conn
	d.connMu.Unlock()
	if c == nil {
		return false
	}
	return c.abort()
}

func (d *tortureDevice) dial(ctx context.Context, parse bool) (*tortureConn, error) {
	dl := net.Dialer{Timeout: deviceDialTimeout}
	c, err := dl.DialContext(ctx, "tcp", d.addr)
	if err != nil {
		return nil, err
	}
	tc := &tortureConn{Conn: c, lost: make(chan struct{})}
	if parse {
		tc.onAck = d.noteAck
	}
	d.connMu.Lock()
	d.conn = tc
	d.connMu.Unlock()
	return tc, nil
}

// --- MQTT 3.1.1 (paho.mqtt.golang) ---

func (d *tortureDevice) options3() *paho3.ClientOptions {
	return paho3.NewClientOptions().AddBroker("tcp://" + d.addr).SetClientID(d.id).SetProtocolVersion(4).
		SetCleanSession(!d.kind.persistent).SetAutoReconnect(false).SetConnectRetry(false).
		SetConnectTimeout(5 * time.Second).SetWriteTimeout(5 * time.Second).
		SetKeepAlive(deviceKeepAlive * time.Second).SetPingTimeout(5 * time.Second).
		SetOrderMatters(true).
		SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { d.onCommand(m.Payload()) }).
		SetCustomOpenConnectionFn(func(_ *url.URL, _ paho3.ClientOptions) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(context.Background(), deviceDialTimeout)
			defer cancel()
			return d.dial(ctx, true)
		})
}

// ensure3 returns the lost channel of a live connection, connecting if
// needed; nil when ctx ended first.
func (d *tortureDevice) ensure3(ctx context.Context) <-chan struct{} {
	d.connMu.Lock()
	c := d.conn
	d.connMu.Unlock()
	if c != nil && !c.isLost() && d.c3.IsConnectionOpen() {
		return c.lost
	}
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		if d.waitAwake(ctx); ctx.Err() != nil {
			break
		}
		// Connect fails while paho still winds the last connection down.
		t0 := time.Now()
		tok := d.c3.Connect()
		ok := tok.WaitTimeout(10 * time.Second)
		d.log.Debug().Bool("answered", ok).AnErr("error", tok.Error()).Dur("took", time.Since(t0)).Msg("connect")
		if ok && tok.Error() == nil {
			d.connected(tok.(*paho3.ConnectToken).SessionPresent())
			d.connMu.Lock()
			defer d.connMu.Unlock()
			return d.conn.lost // dialled by this Connect
		}
		pause(ctx, backoff+time.Duration(d.rng.Int64N(int64(backoff))))
		backoff = min(2*backoff, time.Second)
	}
	return nil
}

func (d *tortureDevice) connected(present bool) {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	if d.everUp {
		d.counters.reconnects.Add(1)
		if d.kind.persistent && !present {
			d.sessionsLost++
		}
	}
	d.everUp, d.present = true, present
}

func (d *tortureDevice) noteAck(typ byte, id uint16, _ byte) {
	d.mu.Lock()
	d.acks[id] = typ
	d.mu.Unlock()
	select {
	case d.ackCh <- struct{}{}:
	default:
	}
}

func (d *tortureDevice) wireAcked(id uint16, want byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.acks[id] == want
}

func (d *tortureDevice) publish3(ctx context.Context, seq int64, qos byte) {
	p := pubObs{Seq: seq, QoS: qos}
	topic := "telemetry/" + d.id
	want := byte(4) // PUBACK
	if qos == 2 {
		want = 7 // PUBCOMP
	}
	for attempt := 1; ctx.Err() == nil; attempt++ {
		lost := d.ensure3(ctx)
		if lost == nil {
			return
		}
		d.mu.Lock()
		clear(d.acks)
		d.mu.Unlock()
		start := time.Now()
		tok := d.c3.Publish(topic, qos, false, d.payload(seq, qos, attempt))
		p.Attempts, p.Sends = attempt, p.Sends+1
		d.record(p)
		if qos == 0 {
			p.Acked = tok.WaitTimeout(5*time.Second) && tok.Error() == nil
			d.record(p)
			return
		}
		id := tok.(*paho3.PublishToken).MessageID()
		tokDone := tok.Done()
		timer := time.NewTimer(deviceAckWait)
	wait:
		for {
			if d.wireAcked(id, want) {
				timer.Stop()
				p.Acked = true
				d.record(p)
				d.mu.Lock()
				d.lat.Record(time.Since(start))
				d.mu.Unlock()
				return
			}
			select {
			case <-d.ackCh:
			case <-tokDone:
				tokDone = nil
				if tok.Error() != nil && !d.kind.persistent {
					break wait // clean session: the connection is gone, publish again
				}
				if tok.Error() != nil && id == 0 {
					break wait // refused before it was stored (not connected)
				}
			case <-lost:
				if !d.kind.persistent {
					break wait
				}
				// Persistent: the library resends it when reconnected.
				if lost = d.ensure3(ctx); lost == nil {
					timer.Stop()
					return
				}
				p.Sends++
				d.record(p)
			case <-timer.C:
				d.abort() // no answer: cut, reconnect, resend
				timer.Reset(deviceAckWait)
			case <-ctx.Done():
				timer.Stop()
				return
			}
		}
		timer.Stop()
	}
}

// --- MQTT 5 (paho.golang) ---

// ensure5 returns a connected client, connecting if needed; nil when ctx
// ended first.
func (d *tortureDevice) ensure5(ctx context.Context) *paho.Client {
	d.connMu.Lock()
	c := d.c5
	d.connMu.Unlock()
	if c != nil {
		select {
		case <-c.Done():
		default:
			return c
		}
	}
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		if d.waitAwake(ctx); ctx.Err() != nil {
			break
		}
		if c, present := d.connect5(ctx); c != nil {
			d.connected(present)
			return c
		}
		pause(ctx, backoff+time.Duration(d.rng.Int64N(int64(backoff))))
		backoff = min(2*backoff, time.Second)
	}
	return nil
}

func (d *tortureDevice) connect5(ctx context.Context) (*paho.Client, bool) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := d.dial(cctx, false)
	if err != nil {
		return nil, false
	}
	cfg := paho.ClientConfig{
		ClientID:      d.id,
		Conn:          conn,
		PacketTimeout: time.Hour, // our own timers decide (deviceAckWait)
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			d.onCommand(pr.Packet.Payload)
			return true, nil
		}},
		OnClientError:      func(error) {},
		OnServerDisconnect: func(*paho.Disconnect) {},
	}
	cp := &paho.Connect{ClientID: d.id, KeepAlive: deviceKeepAlive, CleanStart: true}
	if d.kind.persistent {
		cfg.Session = d.sess5
		cp.CleanStart = false
		expiry := uint32(3600)
		cp.Properties = &paho.ConnectProperties{SessionExpiryInterval: &expiry}
	}
	c := paho.NewClient(cfg)
	t0 := time.Now()
	ca, err := c.Connect(cctx, cp)
	d.log.Debug().Err(err).Dur("took", time.Since(t0)).Msg("connect")
	if err != nil || ca.ReasonCode >= 0x80 {
		_ = conn.Close() // paho.golang returns an error for a refusing CONNACK too
		return nil, false
	}
	d.connMu.Lock()
	d.c5 = c
	d.connMu.Unlock()
	return c, ca.SessionPresent
}

type result5 struct {
	resp *paho.PublishResponse
	err  error
}

func (d *tortureDevice) publish5(ctx context.Context, seq int64, qos byte) {
	p := pubObs{Seq: seq, QoS: qos}
	topic := "telemetry/" + d.id
	for attempt := 1; ctx.Err() == nil; attempt++ {
		c := d.ensure5(ctx)
		if c == nil {
			return
		}
		start := time.Now()
		p.Attempts, p.Sends = attempt, p.Sends+1
		d.record(p)
		res := make(chan result5, 1)
		pctx, cancel := context.WithCancel(ctx)
		pub := &paho.Publish{Topic: topic, QoS: qos, Payload: d.payload(seq, qos, attempt)}
		pc := c // c is replaced below when the connection is lost; this publish stays on its own
		d.wg.Go(func() {
			resp, err := pc.Publish(pctx, pub)
			res <- result5{resp, err}
		})
		timer := time.NewTimer(deviceAckWait)
		lost := c.Done()
		for again := false; !again; {
			select {
			case r := <-res:
				cancel()
				timer.Stop()
				code := byte(0)
				if r.resp != nil {
					code = r.resp.ReasonCode
				}
				switch {
				case qos == 0:
					p.Acked = r.err == nil
					d.record(p)
					return
				case r.err == nil && (code < 0x80 || (qos == 2 && code == 0x92)):
					p.Acked = true
					d.record(p)
					d.mu.Lock()
					d.lat.Record(time.Since(start))
					d.mu.Unlock()
					return
				case r.resp != nil && code >= 0x80:
					d.counters.refused.Add(1)
					pause(ctx, 200*time.Millisecond) // refused (disk full …): try again
				}
				again = true
			case <-lost:
				lost = nil
				if !d.kind.persistent {
					// Clean start: nothing will resend it. (paho.golang
					// v0.23 drops a clean session's pending publishes
					// without answering them: Publish would wait for
					// PacketTimeout.)
					cancel()
					continue
				}
				// The shared session resends it on the next connection,
				// if the server kept the session (if not, paho.golang
				// forgets the publish without answering: publish again).
				if c = d.ensure5(ctx); c == nil {
					cancel() // ctx ended: Publish returns
					continue
				}
				d.connMu.Lock()
				present := d.present
				d.connMu.Unlock()
				if !present {
					cancel()
					continue
				}
				lost = c.Done()
				p.Sends++
				d.record(p)
			case <-timer.C:
				d.abort()
				timer.Reset(deviceAckWait)
			}
		}
		cancel()
	}
}

// close disconnects cleanly (a persistent session stays on the server).
func (d *tortureDevice) close() {
	if d.kind.version == 4 {
		d.c3.Disconnect(100)
	} else {
		d.connMu.Lock()
		c := d.c5
		d.connMu.Unlock()
		if c != nil {
			_ = c.Disconnect(&paho.Disconnect{})
			select {
			case <-c.Done():
			case <-time.After(5 * time.Second):
			}
		}
		if d.sess5 != nil {
			_ = d.sess5.Close()
		}
	}
	d.wg.Wait()
}

// tortureConn is a device's socket: it can be cut abruptly, says when it
// ended, and for MQTT 3.1.1 devices reads the acknowledgements off the
// incoming bytes.
type tortureConn struct {
	net.Conn
	// The lock paho.golang takes around each packet it writes (it writes a
	// packet in several calls, and pings from another goroutine): without
	// it a PINGREQ can land inside a PUBLISH — which the checker caught as
	// a stored message no device published.
	sync.Mutex
	onAck    func(typ byte, id uint16, code byte)
	parser   ackParser
	cut      atomic.Bool
	lost     chan struct{} // closed once reading failed or the socket was closed
	lostOnce sync.Once
}

func (c *tortureConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.onAck != nil {
		c.parser.feed(b[:n], c.onAck)
	}
	if err != nil {
		c.lostOnce.Do(func() { close(c.lost) })
	}
	return n, err
}

func (c *tortureConn) Close() error {
	err := c.Conn.Close()
	c.lostOnce.Do(func() { close(c.lost) })
	return err
}

func (c *tortureConn) isLost() bool {
	select {
	case <-c.lost:
		return true
	default:
		return false
	}
}

// abort cuts the connection abruptly: with SO_LINGER 0 and the read side
// shut, the client library reads EOF, gives the connection up and closes
// the socket, which sends a reset. (Closing the socket under paho.mqtt.golang
// instead would go unnoticed by it until a ping goes unanswered: it takes
// "use of closed network connection" for its own doing.) False if it was
// cut already.
func (c *tortureConn) abort() bool {
	if !c.cut.CompareAndSwap(false, true) {
		return false
	}
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
		if tc.CloseRead() == nil {
			return true
		}
	}
	_ = c.Close()
	return true
}

// ackParser follows the MQTT framing of a byte stream from the server and
// reports every PUBACK, PUBREC and PUBCOMP with its packet ID and (MQTT 5)
// reason code. Only the read goroutine of one connection feeds it.
type ackParser struct {
	stage   int // 0 fixed header, 1 remaining length, 2 body
	typ     byte
	rem     int
	shift   uint
	need    int
	bodyLen int
	head    [3]byte
	hn      int
	broken  bool
}

func (p *ackParser) feed(b []byte, emit func(typ byte, id uint16, code byte)) {
	for len(b) > 0 && !p.broken {
		switch p.stage {
		case 0:
			p.typ, p.rem, p.shift, p.hn, p.stage = b[0]>>4, 0, 0, 0, 1
			b = b[1:]
		case 1:
			c := b[0]
			b = b[1:]
			p.rem |= int(c&0x7f) << p.shift
			p.shift += 7
			if c&0x80 != 0 {
				if p.shift >= 28 {
					p.broken = true // the client drops such a connection anyway
				}
				continue
			}
			p.bodyLen, p.need = p.rem, p.rem
			if p.need == 0 {
				p.done(emit)
			} else {
				p.stage = 2
			}
		case 2:
			k := min(len(b), p.need)
			for i := 0; i < k && p.hn < len(p.head); i++ {
				p.head[p.hn] = b[i]
				p.hn++
			}
			p.need -= k
			b = b[k:]
			if p.need == 0 {
				p.done(emit)
			}
		}
	}
}

func (p *ackParser) done(emit func(typ byte, id uint16, code byte)) {
	p.stage = 0
	if (p.typ == 4 || p.typ == 5 || p.typ == 7) && p.bodyLen >= 2 {
		code := byte(0)
		if p.bodyLen >= 3 {
			code = p.head[2]
		}
		emit(p.typ, uint16(p.head[0])<<8|uint16(p.head[1]), code)
	}
}
