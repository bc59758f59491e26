package engine

import (
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ferrymq/ferrymq/gateway/eventloop"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Work a connection's turn has to do (conn.work bits).
const (
	wRead   uint8 = 1 << iota // the socket has data (or its read was paused and may go on)
	wAcks                     // uplink publishes completed: write their acks in order
	wFlush                    // packets were queued for writing
	wKill                     // something asked for the connection to end (conn.kill*)
	wGone                     // the transport closed under us
	wResume                   // a pacing wait may have ended
)

// Connection states.
const (
	stAwaitConnect uint8 = iota
	stConnected
	stClosed
)

// readBudget bounds what one turn reads before it gives other connections
// their turn.
const readBudget = 256 << 10

var errWouldBlock = errors.New("engine: would block")

// conn is one client connection. Its packets are handled in turns on the
// engine's pool: a turn is scheduled when the socket has data, an uplink
// publish completed, packets were queued for it, or it is to end, and only
// one turn of a connection runs at a time — so everything marked "turn"
// below is owned by the running turn and needs no lock.
//
// Lock order: Engine.mu, then session.mu, then conn.upMu, then conn.wmu;
// conn.mu is a leaf.
type conn struct {
	// Fields are grouped by who touches them and ordered so that nothing
	// pads: a conn is the engine's largest per-device allocation and is kept
	// within the 512-byte size class (TestConnFitsItsSizeClass).
	e      *Engine
	t      transport
	sock   *eventloop.Socket
	ln     *listener
	opened int64 // unix ns

	cl Client // the hooks' view, once connected (client points here); cl.remote is known from the accept on

	// guarded by mu
	inbox []byte   // bytes read from the socket, not yet handled
	rdErr error    // why the socket failed (eof)
	kreq  *killReq // the first kill request, until the turn takes it

	// turn
	partial  []byte // bytes of an incomplete packet (nil when there is none)
	client   *Client
	sess     *session
	aliases  []string    // inbound topic aliases, index alias-1 (MQTT 5)
	outAlias *outAliases // topic aliases we set for the client (MQTT 5, if it allows them); under wmu
	release  func()
	resumeAt atomic.Int64 // unix ns a pacing wait ends, 0 for none (the wheel reads it)
	maxOut   uint32       // the client's Maximum Packet Size; 0 none
	recvMax  uint16       // the client's Receive Maximum (our sends in flight)

	// guarded by mu
	sched    bool // a turn is queued or running
	work     uint8
	rdBusy   bool // a goroutine is reading the socket
	rdAgain  bool // the socket became readable again meanwhile
	rdPause  bool // paused: leave bytes in the socket
	rdWanted bool // the poller left bytes in the socket
	eof      bool // the peer closed (or the socket failed: rdErr)

	// turn
	state        uint8
	version      byte
	paused       bool // reading stopped: too many publishes in flight, or a pacing wait
	noProblem    bool // the client asked for no reason strings (MQTT 5 Request Problem Information 0)
	cleanEnd     bool // the client sent DISCONNECT (no will unless 0x04)
	willToo      bool // DISCONNECT 0x04: publish the will anyway
	released     bool // Limits.Admit's release was called
	proxyPending bool // PROXY protocol: the header is still to come
	lingerShut   bool // lingering close (net.go)
	// guarded by wmu
	terminal bool // a packet that ends the connection was queued: nothing more [MQTT-3.14.4-1]
	holdOut  bool // CONNACK not queued yet: what the session gets meanwhile waits (connect.go)

	mu    sync.Mutex // guards sched, work, the kill request and the read side
	upMu  sync.Mutex // guards up and upPending
	wlock sync.Mutex // serializes writes to the transport (writeOut)
	wmu   sync.Mutex // guards the write side

	// Lingering close (net.go): the turn's, but read by the wheel's tick.
	lingering   atomic.Bool
	lingerUntil atomic.Int64
	lingerRead  int

	takenOver   atomic.Bool // another connection took the session: no will, presence says so
	established atomic.Bool // CONNACK accepted (for the wheel, which must not read turn state)
	closed      atomic.Bool

	up        []*upSlot // uplink publishes in the order received, until their ack is written
	upPending int       // QoS 1/2 publishes counted against our Receive Maximum

	// guarded by wmu
	out          []byte // encoded packets not yet handed to the transport
	outPkts      int32
	backlogPkts  int32 // handed to the transport, not yet taken by the socket, in packets (approximately, see noteWritten)
	backlogBytes int   // the same in bytes
	stuckSince   int64 // unix ns the backlog began; 0 without one

	lastRead atomic.Int64 // unix ns of the last bytes read
	kaNanos  atomic.Int64 // 1.5 × keepalive in ns; 0 none [MQTT-3.1.2-24]
	wheelAt  atomic.Int64 // deadline of c's live entry in the wheel; 0 none
	// expiresAt is when the client's credential expires (Identity.Expires).
	expiresAt atomic.Int64
}

// killReq is a request to end a connection (conn.kill), rare enough to live
// outside the conn.
type killReq struct {
	code ReasonCode
	why  string
	err  error
}

func newConn(e *Engine, t transport, ln *listener, remote string) *conn {
	now := time.Now().UnixNano()
	c := &conn{e: e, t: t, ln: ln, opened: now}
	c.cl.remote = remote
	c.lastRead.Store(now)
	return c
}

// schedule asks for a turn doing w.
func (c *conn) schedule(w uint8) {
	c.mu.Lock()
	c.work |= w
	if c.sched {
		c.mu.Unlock()
		return
	}
	c.sched = true
	c.mu.Unlock()
	c.e.pool.submit(c)
}

// kill asks the connection to end with code (sent in a DISCONNECT to an
// MQTT 5 client past CONNACK); the first request wins.
func (c *conn) kill(code ReasonCode, why string, err error) {
	c.mu.Lock()
	if c.kreq == nil {
		c.kreq = &killReq{code: code, why: why, err: err}
	}
	c.mu.Unlock()
	c.schedule(wKill)
}

// run is one turn.
func (c *conn) run() {
	defer func() {
		if r := recover(); r != nil {
			c.e.m.panics.Add(1)
			c.e.log.Error().Str(logClient, c.id()).Str(logRemote, c.cl.remote).Str("panic", fmt.Sprint(r)).
				Bytes("stack", firstLines(debug.Stack(), 14)).Msg("recovered panic in a connection; closed it")
			c.end(MalformedPacket, reasonMalformed, fmt.Errorf("panic: %v", r))
			c.mu.Lock()
			c.sched = false
			c.mu.Unlock()
		}
	}()
	for {
		c.mu.Lock()
		w := c.work
		c.work = 0
		if w == 0 || (c.state == stClosed && !c.lingering.Load()) {
			c.sched = false
			c.mu.Unlock()
			return
		}
		kr := c.kreq
		c.mu.Unlock()

		if c.lingering.Load() {
			c.drainLingering(w&wGone != 0)
			if c.lingering.Load() {
				c.lingerStep()
			}
			continue
		}
		if w&wKill != 0 && kr != nil {
			c.end(kr.code, kr.why, kr.err)
			continue
		}
		if w&wAcks != 0 {
			c.drainAcks()
		}
		if w&wResume != 0 {
			if at := c.resumeAt.Load(); at > 0 && time.Now().UnixNano() >= at {
				c.resumeAt.Store(0)
				if c.upPending < int(c.e.opts.ReceiveMaximum) {
					c.resume()
				}
			}
		}
		if w&(wRead|wGone|wResume) != 0 {
			c.processInbox()
		}
		if w&wGone != 0 && c.state != stClosed && !c.heldInput() {
			c.end(Success, reasonLost, c.readErr())
		}
		c.flush()
	}
}

// The read side. The event loop's poller reads the socket when it becomes
// readable (onReadable) into the connection's inbox, and schedules a turn,
// which decodes and handles what is there. A paused connection is not
// read: its bytes stay in the socket (TCP backpressure) until the turn
// resumes it and reads itself. rdBusy makes sure only one goroutine reads
// the socket at a time. A paused connection whose client closed still
// handles what it sent once it resumes (heldInput), then ends.

// inboxMax bounds what the poller reads ahead of the turn.
const inboxMax = 256 << 10

// onReadable is the event loop's call.
func (c *conn) onReadable() {
	c.mu.Lock()
	if c.rdBusy || c.rdPause || len(c.inbox) >= inboxMax {
		if c.rdBusy {
			c.rdAgain = true
		} else {
			c.rdWanted = true
		}
		c.mu.Unlock()
		return
	}
	c.rdBusy = true
	c.mu.Unlock()
	c.readSocket()
}

// readSocket reads until the socket has nothing more, the peer closed, or
// the inbox is full; the caller holds rdBusy, which it releases.
func (c *conn) readSocket() {
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	for {
		n, err := c.sock.Read(buf)
		c.mu.Lock()
		if n > 0 {
			if c.inbox == nil {
				c.inbox = getInbox()
			}
			c.inbox = append(c.inbox, buf[:n]...)
		}
		stop := false
		switch {
		case err == nil && n > 0:
			switch {
			case len(c.inbox) >= inboxMax || c.rdPause:
				stop, c.rdWanted = true, true
			case n < len(buf) && !c.rdAgain && !c.sock.Hup():
				// A short read drained the socket: every later arrival raises
				// a new edge, so no read to EAGAIN is needed — unless the peer
				// hung up, whose end (0) is still to be read.
				stop = true
			}
		case err == nil: // n == 0: the peer closed
			c.eof, stop = true, true
		case errors.Is(err, syscall.EINTR):
		case errors.Is(err, syscall.EAGAIN):
			if c.rdAgain {
				c.rdAgain = false
			} else {
				stop = true
			}
		default:
			c.eof, stop = true, true
			if c.rdErr == nil {
				c.rdErr = err
			}
		}
		if stop {
			c.rdBusy = false
			c.work |= wRead
			submit := !c.sched
			c.sched = true
			c.mu.Unlock()
			if submit {
				c.e.pool.submit(c)
			}
			return
		}
		c.mu.Unlock()
	}
}

// processInbox handles what the poller read, then — if the connection is
// not paused and the poller left bytes in the socket — reads on itself.
func (c *conn) processInbox() {
	for rounds := 0; rounds < 4 && c.state != stClosed; rounds++ {
		c.mu.Lock()
		raw := c.inbox
		c.inbox = nil
		eof := c.eof
		readMore := false
		if !c.paused && c.rdWanted && !c.rdBusy && !eof {
			c.rdWanted, c.rdBusy, readMore = false, true, true
		}
		c.mu.Unlock()
		if raw != nil {
			c.lastRead.Store(time.Now().UnixNano())
			c.e.m.bytesIn.Add(uint64(len(raw)))
			c.handleRaw(raw)
			putInbox(raw)
		} else if len(c.partial) > 0 && !c.paused {
			// Resumed with whole packets left from before the pause (the
			// socket may have nothing more to wake us).
			c.consume(nil)
		}
		if c.state == stClosed {
			return
		}
		if eof && raw == nil {
			if !c.heldInput() {
				c.end(Success, reasonLost, c.readErr())
			}
			return
		}
		if !readMore {
			if !eof {
				return
			}
			continue
		}
		c.readSocket()
	}
}

// handleRaw runs socket bytes through the PROXY header, the transport's
// decoding (TLS, WebSocket) and MQTT framing.
func (c *conn) handleRaw(raw []byte) {
	data := raw
	if c.proxyPending {
		if data = c.proxyHeader(data); data == nil {
			return
		}
	}
	plain, err := c.t.decode(data)
	if len(plain) > 0 && !c.consume(plain) {
		return
	}
	switch {
	case err == nil:
	case errors.Is(err, errWSClosed):
		c.end(Success, reasonLost, err)
	default:
		c.e.m.protocolErrors.Add(1)
		c.end(Success, reasonProtocol, err)
	}
}

// pause stops handling (and reading) this connection's input until resume.
func (c *conn) pause() {
	c.paused = true
	c.mu.Lock()
	c.rdPause = true
	c.mu.Unlock()
}

// resume undoes pause: what is left in c.partial is handled by the next
// turn, which reads the socket again if the poller left bytes there.
func (c *conn) resume() {
	c.paused = false
	c.mu.Lock()
	c.rdPause = false
	c.work |= wRead
	c.mu.Unlock()
}

// heldInput: the connection is paused (receive maximum, pacing) with
// packets the client sent before it closed still to handle; the turn that
// resumes it handles them, then ends it.
func (c *conn) heldInput() bool { return c.paused && len(c.partial) > 0 }

func (c *conn) readErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rdErr != nil {
		return c.rdErr
	}
	return io.EOF
}

var readBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

var inboxes = sync.Pool{New: func() any { b := make([]byte, 0, 32<<10); return &b }}

func getInbox() []byte { return (*inboxes.Get().(*[]byte))[:0] }

func putInbox(b []byte) {
	if cap(b) <= 256<<10 {
		b = b[:0]
		inboxes.Put(&b)
	}
}

// consume frames data (after what is left in c.partial) into packets and
// handles each; it keeps an incomplete packet's bytes in c.partial. It
// returns false once the connection ended.
func (c *conn) consume(data []byte) bool {
	b := data
	if c.partial != nil {
		c.partial = append(c.partial, data...)
		b = c.partial
	}
	for len(b) > 0 && c.state != stClosed {
		if c.paused {
			break
		}
		hdr, size, err := frame(b, c.e.opts.MaxPacketBytes)
		if err != nil {
			c.protocolFailure(err)
			return false
		}
		if hdr == 0 {
			if size > 0 && len(b) < size && cap(c.partial) < size {
				// A large packet is coming: make room for it once (its size
				// is bounded by MaxPacketBytes).
				np := make([]byte, len(b), size)
				copy(np, b)
				c.partial = np
				return true
			}
			break
		}
		if err := c.handle(b[0], b[hdr:size]); err != nil {
			c.protocolFailure(err)
			return false
		}
		b = b[size:]
	}
	switch {
	case c.state == stClosed:
		c.partial = nil
		return false
	case len(b) == 0:
		c.partial = nil
	case c.partial == nil || &b[0] != &c.partial[0]:
		c.partial = append(make([]byte, 0, max(len(b), 64)), b...)
	}
	return true
}

// frame reads a packet's fixed header: hdr is its length (0: incomplete)
// and size the whole packet's (when known). A remaining length past four
// bytes (3.1.1 §2.2.3, MQTT 5 §1.5.5), or longer than it needs to be
// [MQTT-1.5.5-1], is malformed; past maxBytes the packet is too large.
func frame(b []byte, maxBytes int) (hdr, size int, err error) {
	n, mul := 0, 1
	for i := 1; ; i++ {
		if i >= len(b) {
			return 0, 0, nil
		}
		if i > 4 {
			return 0, 0, malformed("§1.5.5", "remaining length longer than four bytes")
		}
		d := b[i]
		n += int(d&0x7F) * mul
		if d == 0 && i > 1 {
			return 0, 0, malformed("[MQTT-1.5.5-1]", "remaining length not in the fewest bytes")
		}
		if d&0x80 == 0 {
			hdr = i + 1
			break
		}
		mul *= 128
	}
	if hdr+n > maxBytes {
		return 0, 0, &protocolError{code: PacketTooLarge, msg: fmt.Sprintf("packet of %d bytes, limit %d", hdr+n, maxBytes)}
	}
	if len(b) < hdr+n {
		return 0, hdr + n, nil
	}
	return hdr, hdr + n, nil
}

// protocolFailure ends the connection for a packet that broke a rule.
// Nothing is sent before a CONNACK (the server's first packet is CONNACK
// [MQTT-3.2.0-1]; 3.1.1 closes without one where no return code applies
// [MQTT-3.2.2-6]); an MQTT 5 client past
// it is told the reason first [MQTT-4.13.1-1]; MQTT 3 has no server
// DISCONNECT: the connection is closed [MQTT-4.8.0-1].
func (c *conn) protocolFailure(err error) {
	code := MalformedPacket
	var pe *protocolError
	if errors.As(err, &pe) {
		code = pe.code
	}
	reason := reasonMalformed
	if code == ProtocolError || code == TopicAliasInvalid || code == ReceiveMaximumExceeded {
		reason = reasonProtocol
	}
	c.e.m.protocolErrors.Add(1)
	c.end(code, reason, err)
}

func (c *conn) id() string {
	if c.client != nil {
		return c.client.id
	}
	return ""
}

// queuePacket encodes pk (a control packet) for writing.
func (c *conn) queuePacket(pk *packets.Packet) {
	if b, ok := c.encodePacket(pk); ok {
		c.queueBytes(b, pk.FixedHeader.Type == packets.Disconnect || (pk.FixedHeader.Type == packets.Connack && pk.ReasonCode >= 0x80))
	}
}

// encodePacket encodes a control packet for c (its version, its Maximum
// Packet Size, whether it wants problem information).
func (c *conn) encodePacket(pk *packets.Packet) ([]byte, bool) {
	pk.ProtocolVersion = c.version
	if c.version == 5 && c.maxOut > 0 {
		pk.Mods.MaxSize = c.maxOut
	}
	pk.Mods.DisallowProblemInfo = c.noProblem
	var bb encodeBuf
	if err := encodeControl(&bb, pk); err != nil {
		c.e.log.Error().Err(err).Str(logClient, c.id()).Msg("encode packet")
		return nil, false
	}
	return bb.b, true
}

// holdWrites keeps what is queued from the transport until releaseWrites
// puts the CONNACK before it: the session is the connection's before the
// Presence hook has run and the CONNACK is encoded, and a message
// delivered to it meanwhile must not go out first [MQTT-3.2.0-1].
func (c *conn) holdWrites() {
	c.wmu.Lock()
	c.holdOut = true
	c.wmu.Unlock()
}

// releaseWrites queues ack (an encoded CONNACK) before everything queued
// since holdWrites, and lets it all go.
func (c *conn) releaseWrites(ack []byte) {
	c.wmu.Lock()
	c.holdOut = false
	if len(ack) == 0 || len(c.out) == 0 {
		c.wmu.Unlock()
		if len(ack) > 0 {
			c.queueBytes(ack, false)
		}
		return
	}
	out := append(append(getOutBuf(), ack...), c.out...)
	putOutBuf(c.out)
	c.out = out
	c.outPkts++
	c.wmu.Unlock()
	c.schedule(wFlush)
}

// queueBytes appends an encoded packet to the write side; terminal marks
// the last packet the connection will ever send.
func (c *conn) queueBytes(b []byte, terminal bool) bool {
	c.wmu.Lock()
	if c.terminal {
		c.wmu.Unlock()
		return false
	}
	first := len(c.out) == 0
	if c.out == nil {
		c.out = getOutBuf()
	}
	c.out = append(c.out, b...)
	c.outPkts++
	c.terminal = terminal
	c.wmu.Unlock()
	if first {
		c.schedule(wFlush)
	}
	return true
}

// pendingWrites returns the packets queued and not yet taken by the
// socket.
func (c *conn) pendingWrites() (pkts, bytes int) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return int(c.outPkts) + int(c.backlogPkts), len(c.out) + c.backlogBytes
}

// writesFull: the write queue is at MaxPendingWrites or MaxPendingBytes.
func (c *conn) writesFull() bool {
	pkts, bytes := c.pendingWrites()
	return pkts >= c.e.opts.MaxPendingWrites || bytes >= c.e.opts.MaxPendingBytes
}

// flush hands what is queued to the transport in one write.
func (c *conn) flush() {
	if err := c.writeOut(); err != nil && len(c.partial) == 0 {
		// (With input left — a client that closed while paused cannot take
		// our acks — what it sent is still handled first; the transport's
		// close, or the write timeout, ends the connection then.)
		c.end(Success, reasonLost, err)
	}
}

// flushBytes is how much a connection's write buffer holds before the
// goroutine that fills it writes it out itself rather than leaving it to
// the connection's next turn: a subscriber receiving from many publishers
// is written while they publish, not only when its own turn comes.
const flushBytes = 16 << 10

// writeOut hands what is queued to the transport in one write. wlock keeps
// the writes of several goroutines in the order their buffers were taken.
func (c *conn) writeOut() error {
	c.wlock.Lock()
	defer c.wlock.Unlock()
	c.wmu.Lock()
	if len(c.out) == 0 || c.holdOut {
		c.wmu.Unlock()
		return nil
	}
	out := c.out
	c.out = nil
	c.backlogBytes += len(out)
	c.backlogPkts += c.outPkts
	c.outPkts = 0
	if c.stuckSince == 0 {
		c.stuckSince = time.Now().UnixNano()
	}
	c.wmu.Unlock()
	c.e.m.bytesOut.Add(uint64(len(out)))
	if err := c.t.write(out); err != nil {
		return err
	}
	c.watch()
	putOutBuf(out)
	return nil
}

// noteWritten is told how many bytes the socket took; the packet count of
// the backlog shrinks in proportion (packet boundaries are not tracked
// past the transport).
func (c *conn) noteWritten(n int) {
	c.wmu.Lock()
	if n >= c.backlogBytes {
		c.backlogBytes, c.backlogPkts, c.stuckSince = 0, 0, 0
	} else {
		left := c.backlogBytes - n
		c.backlogPkts = int32((int64(c.backlogPkts)*int64(left) + int64(c.backlogBytes) - 1) / int64(c.backlogBytes))
		c.backlogBytes = left
		c.stuckSince = time.Now().UnixNano()
	}
	c.wmu.Unlock()
}

// watch makes sure the engine's timing wheel looks at c by its next
// deadline (keepalive, connect timeout, write timeout, pacing, linger;
// conn.deadline). c has at most one live entry: an earlier deadline
// replaces it, and the replaced one is dropped when it fires.
func (c *conn) watch() {
	d := c.deadline(time.Now().UnixNano())
	if d == 0 {
		return
	}
	for {
		cur := c.wheelAt.Load()
		if cur != 0 && cur <= d {
			return // the live entry comes first and looks again
		}
		if c.wheelAt.CompareAndSwap(cur, d) {
			c.e.wheel.Add(c, d)
			return
		}
	}
}

// deadline is the next moment the wheel must look at c, or 0 for never.
func (c *conn) deadline(now int64) int64 {
	if c.lingering.Load() {
		return c.lingerUntil.Load()
	}
	if c.closed.Load() {
		return 0
	}
	d := int64(0)
	earliest := func(t int64) {
		if t > 0 && (d == 0 || t < d) {
			d = t
		}
	}
	if !c.established.Load() {
		earliest(c.opened + int64(c.e.opts.ConnectTimeout))
	}
	if ka := c.kaNanos.Load(); ka > 0 {
		earliest(c.lastRead.Load() + ka)
	}
	c.wmu.Lock()
	if c.stuckSince > 0 {
		earliest(c.stuckSince + int64(c.e.opts.WriteTimeout))
	}
	c.wmu.Unlock()
	if at := c.resumeAt.Load(); at > 0 {
		earliest(at)
	}
	earliest(c.expiresAt.Load())
	return d
}

// tick is the wheel's call for c at now; it returns when to look again.
func (c *conn) tick(added, now int64) int64 {
	if c.wheelAt.Load() != added {
		return 0 // replaced by an earlier entry
	}
	next := func(d int64) int64 {
		if d != 0 && d <= now {
			d = now + int64(250*time.Millisecond)
		}
		if !c.wheelAt.CompareAndSwap(added, d) {
			return 0
		}
		return d
	}
	if c.lingering.Load() {
		if now >= c.lingerUntil.Load() {
			c.schedule(wKill) // the turn finishes the linger
			return next(now + int64(250*time.Millisecond))
		}
		c.schedule(wRead)
		return next(c.lingerUntil.Load())
	}
	if c.closed.Load() {
		return next(0)
	}
	if !c.established.Load() && now >= c.opened+int64(c.e.opts.ConnectTimeout) {
		c.kill(Success, reasonConnectTimeout, errors.New("no CONNECT within the connect timeout"))
		return next(0)
	}
	if ka := c.kaNanos.Load(); ka > 0 && now >= c.lastRead.Load()+ka {
		// Nothing for 1.5 × the keepalive: 3.1.1 [MQTT-3.1.2-24], MQTT 5
		// [MQTT-3.1.2-22] (told 0x8D first).
		c.kill(KeepAliveTimeout, reasonKeepalive, errors.New("keepalive timeout"))
		return next(0)
	}
	if at := c.expiresAt.Load(); at > 0 && now >= at {
		c.kill(MaximumConnectTime, reasonKicked, errors.New("credential expired"))
		return next(0)
	}
	c.wmu.Lock()
	stuck := c.stuckSince > 0 && now >= c.stuckSince+int64(c.e.opts.WriteTimeout)
	c.wmu.Unlock()
	if stuck {
		c.kill(Success, reasonLost, errors.New("write timeout: the client does not read"))
		return next(0)
	}
	if at := c.resumeAt.Load(); at > 0 && now >= at {
		c.schedule(wResume) // a pacing wait ended
	}
	return next(c.deadline(now))
}

// Reasons, as presence events and metrics name them.
const (
	reasonNormal         = "normal"
	reasonKeepalive      = "keepalive_timeout"
	reasonLost           = "connection_lost"
	reasonShutdown       = "server_shutdown"
	reasonProtocol       = "protocol_error"
	reasonMalformed      = "malformed_packet"
	reasonKicked         = "kicked"
	reasonTakenOver      = "taken_over"
	reasonConnectTimeout = "connect_timeout"
	reasonRefused        = "refused"
	reasonCore           = "core_refused"
	reasonStore          = "session_store" // its session's messages could not be loaded
)

func firstLines(b []byte, n int) []byte {
	for i, ch := range b {
		if ch == '\n' {
			if n--; n == 0 {
				return b[:i]
			}
		}
	}
	return b
}

// proxyHeader takes the PROXY protocol header off the start of the
// stream: it returns what follows it (nil while it is incomplete, or after
// a bad one ended the connection). The Limits hook decides the socket now
// that its client is known.
func (c *conn) proxyHeader(data []byte) []byte {
	b := data
	if c.partial != nil {
		c.partial = append(c.partial, data...)
		b = c.partial
	}
	n, src, err := parseProxy(b)
	if err != nil {
		c.e.m.protocolErrors.Add(1)
		c.end(Success, reasonProtocol, err)
		return nil
	}
	if n == 0 {
		if c.partial == nil {
			c.partial = append(make([]byte, 0, 128), b...)
		}
		return nil
	}
	c.proxyPending = false
	if src != "" {
		c.cl.remote = src
	}
	if lim := c.e.opts.Hooks.Limits; lim != nil {
		r, err := lim.Admit(c.cl.remote)
		if err != nil {
			c.e.m.admissionRefused.Add(1)
			c.end(Success, reasonRefused, err)
			return nil
		}
		c.release = r
	}
	rest := append([]byte(nil), b[n:]...)
	c.partial = nil
	if len(rest) == 0 {
		return nil
	}
	return rest
}
