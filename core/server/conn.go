package server

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core/wire"
)

// conn is one client connection. Goroutines: serve (the reader), the
// writer, and opts.Handlers handlers; nothing else runs per connection.
type conn struct {
	s   *Server
	nc  net.Conn
	log zerolog.Logger
	// clientID is what the client named itself in OpHello; set before the
	// connection's other goroutines start.
	clientID string

	ctx    context.Context
	cancel context.CancelFunc

	// inflight is a semaphore of unanswered requests; a slot is freed when
	// the writer has written the response. Because of it, out and work never
	// hold more than MaxInflight frames and sends to them never block.
	inflight chan struct{}
	out      chan outFrame
	work     chan wire.Frame

	draining atomic.Bool
	wg       sync.WaitGroup // writer and handlers

	// push holds server-initiated frames (check-backs); the writer sends
	// them between responses. Sends never block: a full queue refuses.
	push chan wire.Frame

	mu     sync.Mutex // orders starting goroutines against close
	closed bool
	// producerOf holds the unregister funcs of the transactional producer
	// groups this connection serves check-backs for.
	producerOf map[string]func()
}

// Errors of check-back pushes.
var (
	errConnGone      = errors.New("connection closed")
	errPushQueueFull = errors.New("push queue full")
)

type outFrame struct {
	f       wire.Frame
	release bool // frees an in-flight slot once written
	recycle bool // the payload is the writer's once written (recycleAnswer)
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, log: s.log.With().Str("remote", nc.RemoteAddr().String()).Logger(),
		inflight: make(chan struct{}, s.opts.MaxInflight),
		out:      make(chan outFrame, s.opts.MaxInflight+1),
		work:     make(chan wire.Frame, s.opts.MaxInflight),
		push:     make(chan wire.Frame, maxPushes), producerOf: map[string]func(){}}
	c.ctx, c.cancel = context.WithCancel(s.ctx)
	return c
}

// serve runs the connection until it ends.
func (c *conn) serve() {
	defer c.close()
	if !c.handshake() {
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.wg.Add(1 + c.s.opts.Handlers)
	c.mu.Unlock()
	go c.writeLoop()
	for i := 0; i < c.s.opts.Handlers; i++ {
		go c.handleLoop()
	}
	r := bufio.NewReaderSize(c.nc, 64<<10)
	idle := 3 * c.s.opts.Keepalive
	var deadlineSet time.Time
	for {
		// Moving the deadline costs a timer update; once a second is
		// plenty for a timeout counted in tens of seconds.
		if now := time.Now(); now.Sub(deadlineSet) > time.Second {
			_ = c.nc.SetReadDeadline(now.Add(idle))
			deadlineSet = now
		}
		f, err := wire.ReadFrame(r, c.s.opts.MaxFrame)
		var large *wire.LargeFrameError
		if errors.As(err, &large) {
			// The frame's length is known: skip its payload and answer the
			// request, and the connection goes on.
			if err := large.Skip(r); err != nil {
				c.readFailed(err)
				return
			}
			c.log.Debug().Int("bytes", large.Len).Int("limit", large.Max).Str("op", f.Op.String()).Msg("frame over the limit skipped")
			if f.Flags&(wire.FlagResponse|wire.FlagNoReply) != 0 {
				continue
			}
		} else if err != nil {
			c.readFailed(err)
			return
		}
		if f.Flags&wire.FlagResponse != 0 {
			continue // answers to server pushes: none are sent yet
		}
		select {
		case c.inflight <- struct{}{}:
		case <-c.ctx.Done():
			return
		}
		if large != nil {
			c.fail(f, fmt.Errorf("%w; the request was skipped (core.max_frame_bytes)", large))
			continue
		}
		if c.draining.Load() {
			c.fail(f, &wire.Error{Code: wire.CodeShuttingDown, Message: "server shutting down"})
			continue
		}
		switch {
		case f.Op == wire.OpPing:
			c.reply(f, nil)
		case f.Op == wire.OpProduce:
			c.produce(f)
		case !f.Op.Known() || f.Op == wire.OpHello || f.Op == wire.OpCheckTxn:
			c.fail(f, &wire.Error{Code: wire.CodeUnknownOp, Message: "unknown or unexpected op " + f.Op.String()})
		default:
			c.work <- f
		}
	}
}

// readFailed answers what can be answered about a broken stream; the
// connection is closed after it in any case.
func (c *conn) readFailed(err error) {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), c.ctx.Err() != nil:
	case errors.Is(err, wire.ErrFrameTooLarge), errors.Is(err, wire.ErrBadFrame):
		c.log.Debug().Err(err).Msg("bad frame; closing")
		c.writeNow(wire.Frame{Flags: wire.FlagResponse | wire.FlagError, Payload: wire.EncodeError(wire.CodeOf(err), err.Error())})
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			c.log.Debug().Msg("connection idle; closing")
			return
		}
		c.log.Debug().Err(err).Msg("read failed; closing")
	}
}

// handshake reads and answers OpHello.
func (c *conn) handshake() bool {
	_ = c.nc.SetReadDeadline(time.Now().Add(c.s.opts.HandshakeTimeout))
	f, err := wire.ReadFrame(c.nc, 64<<10)
	if err != nil {
		c.readFailed(err)
		return false
	}
	refuse := func(code wire.Code, msg string) bool {
		c.log.Info().Str("reason", msg).Msg("handshake refused")
		c.writeNow(wire.Frame{Op: f.Op, Flags: wire.FlagResponse | wire.FlagError, ID: f.ID, Payload: wire.EncodeError(code, msg)})
		return false
	}
	if f.Op != wire.OpHello {
		return refuse(wire.CodeHandshake, "the first frame must be hello")
	}
	var h wire.Hello
	if err := json.Unmarshal(f.Payload, &h); err != nil {
		return refuse(wire.CodeBadRequest, "hello does not decode: "+err.Error())
	}
	if h.Version != wire.Version {
		return refuse(wire.CodeVersion, "unsupported protocol version")
	}
	if tok := c.s.opts.Token; tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(h.Token)) != 1 {
		return refuse(wire.CodeUnauthorized, "bad token")
	}
	if len(h.ProducerGroups) > 0 {
		// Where the transactions are served elsewhere (Options.Placement),
		// the producer's transactional requests are answered CodeMoved and
		// its client registers there.
		if svc, err := c.s.services(c.ctx, ""); err == nil {
			if err := c.registerProducers(svc.Txn, h.ProducerGroups); err != nil {
				return refuse(wire.CodeOf(err), err.Error())
			}
		}
	}
	reply, _ := json.Marshal(wire.HelloReply{Version: wire.Version, Server: c.s.opts.Version,
		MaxFrame: c.s.opts.MaxFrame, KeepaliveMS: c.s.opts.Keepalive.Milliseconds()})
	if h.ClientID != "" {
		c.log = c.log.With().Str("client", h.ClientID).Logger()
		c.clientID = h.ClientID
	}
	return c.writeNow(wire.Frame{Op: wire.OpHello, Flags: wire.FlagResponse, ID: f.ID, Payload: reply})
}

// writeNow writes a frame directly (before the writer runs, or as the last
// word on a broken stream).
func (c *conn) writeNow(f wire.Frame) bool {
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.opts.WriteTimeout))
	_, err := c.nc.Write(wire.AppendFrame(nil, f))
	return err == nil
}

// reply queues the response to request f.
func (c *conn) reply(f wire.Frame, payload []byte) { c.replyWith(f, payload, false) }

// replyWith queues the response to request f; recycle hands the payload
// to the writer, which recycles it once written (answerBuf).
func (c *conn) replyWith(f wire.Frame, payload []byte, recycle bool) {
	if f.Flags&wire.FlagNoReply != 0 {
		<-c.inflight
		return
	}
	if err := c.fits(payload); err != nil {
		c.fail(f, err)
		return
	}
	c.out <- outFrame{f: wire.Frame{Op: f.Op, Flags: wire.FlagResponse, ID: f.ID, Payload: payload}, release: true, recycle: recycle}
}

// fits refuses an answer larger than the frame limit the server announced
// (the client would drop the connection for it): the request gets an error
// naming the sizes instead. Answers that carry messages are bounded below
// it (a read, a pop: 4 MiB unless one message is larger), so this takes
// a lookup by key or a query of many large messages.
func (c *conn) fits(payload []byte) error {
	if n := wire.HeaderLen - 4 + len(payload); n > c.s.opts.MaxFrame {
		return fmt.Errorf("%w: an answer of %d bytes, limit %d (core.max_frame_bytes); ask for fewer messages", wire.ErrFrameTooLarge, n, c.s.opts.MaxFrame)
	}
	return nil
}

// reserve takes an in-flight slot for a further answer to a streaming
// request, if one is free: each queued response holds one, so out never
// holds more than MaxInflight frames and sends to it never block.
func (c *conn) reserve() bool {
	select {
	case c.inflight <- struct{}{}:
		return true
	default:
		return false
	}
}

// replyMore queues an answer to request f that more answers follow, in the
// slot reserve took; recycle as in replyWith.
func (c *conn) replyMore(f wire.Frame, payload []byte, recycle bool) {
	if err := c.fits(payload); err != nil {
		c.fail(f, err) // ends the stream for the client
		return
	}
	c.out <- outFrame{f: wire.Frame{Op: f.Op, Flags: wire.FlagResponse | wire.FlagMore, ID: f.ID, Payload: payload}, release: true, recycle: recycle}
}

// bigPayload is the size from which writeLoop writes a payload from where
// it is instead of copying it into its batch.
const bigPayload = 64 << 10

// fail queues an error response to request f.
func (c *conn) fail(f wire.Frame, err error) {
	code := wire.CodeOf(err)
	if code == wire.CodeInternal {
		c.log.Error().Err(err).Str("op", f.Op.String()).Msg("request failed")
	}
	msg := err.Error()
	if we, ok := err.(*wire.Error); ok {
		msg = we.Message // as it was made (a CodeMoved's names a node), not wrapped again
	}
	c.out <- outFrame{f: wire.Frame{Op: f.Op, Flags: wire.FlagResponse | wire.FlagError, ID: f.ID,
		Payload: wire.EncodeError(code, msg)}, release: true}
}

// writeLoop batches queued frames into few write calls. Large payloads (a
// backlog's pull answers) are not copied into the batch: the batch is
// written with them by one writev.
func (c *conn) writeLoop() {
	defer c.wg.Done()
	buf := make([]byte, 0, 64<<10)
	var bufs net.Buffers
	var written [][]byte // payloads to recycle once written
	for {
		var of outFrame
		select {
		case of = <-c.out:
		case pf := <-c.push:
			of = outFrame{f: pf}
		case <-c.ctx.Done():
			return
		}
		buf, bufs, written = buf[:0], bufs[:0], written[:0]
		mark, big := 0, 0 // buf[:mark] is in bufs; big: bytes of payloads not copied
		add := func(f wire.Frame, recycle bool) {
			if len(f.Payload) < bigPayload {
				buf = wire.AppendFrame(buf, f)
				if recycle {
					recycleAnswer(f.Payload)
				}
				return
			}
			buf = wire.AppendHeader(buf, f, len(f.Payload))
			bufs = append(bufs, buf[mark:], f.Payload)
			mark, big = len(buf), big+len(f.Payload)
			if recycle {
				written = append(written, f.Payload)
			}
		}
		add(of.f, of.recycle)
		released := 0
		if of.release {
			released++
		}
	more:
		for len(buf)+big < 256<<10 {
			select {
			case of = <-c.out:
				add(of.f, of.recycle)
				if of.release {
					released++
				}
			case pf := <-c.push:
				add(pf, false)
			default:
				break more
			}
		}
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.opts.WriteTimeout))
		var err error
		if len(bufs) == 0 {
			_, err = c.nc.Write(buf)
		} else {
			if mark < len(buf) {
				bufs = append(bufs, buf[mark:])
			}
			w := bufs // WriteTo consumes its receiver
			_, err = w.WriteTo(c.nc)
			clear(bufs) // keep no payload alive
			for _, p := range written {
				recycleAnswer(p)
			}
			clear(written)
		}
		if err != nil {
			c.log.Debug().Err(err).Msg("write failed; closing")
			c.cancel()
			_ = c.nc.Close()
			return
		}
		for ; released > 0; released-- {
			<-c.inflight
		}
		if cap(buf) > 1<<20 {
			buf = make([]byte, 0, 64<<10)
		}
	}
}

func (c *conn) handleLoop() {
	defer c.wg.Done()
	for {
		select {
		case f := <-c.work:
			c.handle(f)
		case <-c.ctx.Done():
			return
		}
	}
}

// drain makes the connection answer new requests with CodeShuttingDown.
func (c *conn) drain() { c.draining.Store(true) }

// waitIdle waits until no request is in flight, or ctx ends.
func (c *conn) waitIdle(ctx context.Context) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for len(c.inflight) > 0 {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		case <-c.ctx.Done():
			return
		}
	}
}

// close ends the connection and waits for its goroutines.
func (c *conn) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.unregisterProducers()
	c.cancel()
	_ = c.nc.Close()
	c.wg.Wait()
}
