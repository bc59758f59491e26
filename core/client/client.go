package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core/wire"
)

// Errors of the client itself; errors from the server arrive as
// *wire.Error, which unwraps to the core's sentinels (errors.Is works).
var (
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("client: closed")
	// ErrConnLost is returned for a request whose connection broke before
	// it was answered; the request may or may not have taken effect.
	ErrConnLost = errors.New("client: connection lost")
)

// Options configure a Client. A zero field means its default.
type Options struct {
	// Addr is the server's core address, host:port — or several, comma
	// separated: each (re)connect tries them in turn from the last one that
	// worked. With the JetStream engine only the node holding the core
	// lease listens on the core port, so listing every node finds it.
	Addr string
	// Token is presented in the handshake when the server requires one.
	Token string
	// ClientID names this client to the server; default host-pid-random.
	ClientID string
	// DialTimeout bounds one connection attempt; default 5 s.
	DialTimeout time.Duration
	// RequestTimeout applies to calls whose context has no deadline;
	// default 30 s (long polls add their wait).
	RequestTimeout time.Duration
	// MaxBackoff caps the pause between reconnection attempts; default 5 s.
	MaxBackoff time.Duration
	// MaxFrame bounds frames from the server; default wire.DefaultMaxFrame.
	// (A request larger than the server's own limit, announced in its
	// hello reply, is refused here with wire.ErrFrameTooLarge, unsent.)
	MaxFrame int
	// MaxInflight bounds unanswered requests; further calls wait. Default
	// 256 (the server's default).
	MaxInflight int
	// Discover asks the server for its cluster's nodes (OpCluster) after
	// each connect and every DiscoverEvery (default 30 s), and adds their
	// core addresses to those Addr lists for reconnecting: one address is
	// enough to find the others when its node goes away.
	Discover      bool
	DiscoverEvery time.Duration
	Logger        *zerolog.Logger
}

func (o Options) withDefaults() Options {
	if o.ClientID == "" {
		h, _ := os.Hostname()
		if h == "" {
			h = "client"
		}
		o.ClientID = fmt.Sprintf("%s-%d-%04x", sanitize(h), os.Getpid(), rand.IntN(1<<16))
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 5 * time.Second
	}
	if o.MaxFrame == 0 {
		o.MaxFrame = wire.DefaultMaxFrame
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = 256
	}
	if o.DiscoverEvery <= 0 {
		o.DiscoverEvery = 30 * time.Second
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	return o
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b)
}

// Client is one connection to a ferrymq core server that reconnects by
// itself with backoff. Requests are pipelined: many may be in flight at once.
// It is safe for concurrent use.
type Client struct {
	opts Options
	log  zerolog.Logger
	slot chan struct{} // in-flight bound

	nextID     atomic.Uint64
	lastAddr   atomic.Int32             // index in Addrs() of the address that answered last
	discovered atomic.Pointer[[]string] // core addresses OpCluster named (Options.Discover)
	reconnects chan struct{}            // a connect happened (Options.Discover looks again)

	mu     sync.Mutex
	sess   *session
	ready  chan struct{} // closed while sess is usable
	closed bool
	// txnProducers are the open transaction producers by group: announced
	// in every hello, and where check-back pushes go (on a peer: its
	// parent's).
	txnProducers map[string]*TransactionProducer
	// parent is, for a peer (route.go), the client that dialed it; peers
	// are the clients of other nodes shards were moved to, by address, and
	// routes the address each such shard is served at.
	parent *Client
	peers  map[string]*Client
	routes map[string]string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Dial connects to the server (the first connection must succeed) and keeps
// the client connected until Close.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	return dial(ctx, opts, nil)
}

// dial is Dial, of a peer of parent if not nil.
func dial(ctx context.Context, opts Options, parent *Client) (*Client, error) {
	opts = opts.withDefaults()
	if opts.Addr == "" {
		return nil, errors.New("client: no server address")
	}
	c := &Client{opts: opts, log: opts.Logger.With().Str("component", "client").Str("server", opts.Addr).Logger(),
		slot: make(chan struct{}, opts.MaxInflight), ready: make(chan struct{}), txnProducers: map[string]*TransactionProducer{},
		reconnects: make(chan struct{}, 1), parent: parent, peers: map[string]*Client{}, routes: map[string]string{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	s, err := c.connect(ctx)
	if err != nil {
		c.cancel()
		return nil, err
	}
	c.install(s)
	c.wg.Add(1)
	go c.maintain()
	if opts.Discover {
		c.wg.Add(1)
		go c.discover()
	}
	return c, nil
}

// ClientID is the ID this client presents.
func (c *Client) ClientID() string { return c.opts.ClientID }

// Close ends the connection; calls in flight fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	s := c.sess
	c.mu.Unlock()
	c.closePeers()
	c.cancel()
	if s != nil {
		s.shutdown(ErrClosed)
	}
	c.wg.Wait()
	return nil
}

func (c *Client) install(s *session) {
	c.mu.Lock()
	c.sess = s
	close(c.ready)
	c.mu.Unlock()
	select {
	case c.reconnects <- struct{}{}:
	default:
	}
}

// discover learns the cluster's core addresses (Options.Discover): at
// once, after each reconnect and every DiscoverEvery, until Close.
func (c *Client) discover() {
	defer c.wg.Done()
	t := time.NewTicker(c.opts.DiscoverEvery)
	defer t.Stop()
	select {
	case <-c.reconnects: // Dial's own connect: looked at below
	default:
	}
	for {
		ctx, cancel := context.WithTimeout(c.ctx, c.opts.RequestTimeout)
		info, err := c.Cluster(ctx)
		cancel()
		if err == nil {
			addrs := info.Addrs()
			if old := c.discovered.Swap(&addrs); old == nil || !slices.Equal(*old, addrs) {
				c.log.Info().Strs("nodes", addrs).Msg("cluster discovered")
			}
		} else if c.ctx.Err() == nil {
			c.log.Debug().Err(err).Msg("cluster not discovered (the server may not know OpCluster)")
		}
		select {
		case <-t.C:
		case <-c.reconnects:
		case <-c.ctx.Done():
			return
		}
	}
}

// Addrs are the addresses the client (re)connects to, in the order it
// tries them from the first: Options.Addr's, then those discovered
// (Options.Discover) that it does not list.
func (c *Client) Addrs() []string {
	var out []string
	for _, a := range strings.Split(c.opts.Addr, ",") {
		out = append(out, strings.TrimSpace(a))
	}
	if d := c.discovered.Load(); d != nil {
		for _, a := range *d {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// maintain reconnects whenever the session ends.
func (c *Client) maintain() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		s := c.sess
		c.mu.Unlock()
		select {
		case <-s.done:
		case <-c.ctx.Done():
			return
		}
		c.mu.Lock()
		c.ready = make(chan struct{})
		c.mu.Unlock()
		c.log.Warn().Err(s.err).Msg("connection lost; reconnecting")
		b := backoff{max: c.opts.MaxBackoff}
		for {
			ns, err := c.connect(c.ctx)
			if err == nil {
				c.install(ns)
				c.log.Info().Msg("reconnected")
				break
			}
			if !b.wait(c.ctx) {
				return
			}
		}
	}
}

// backoff paces reconnection attempts: 50 ms, doubled after each wait up
// to max, each wait up to half again longer at random.
type backoff struct {
	d, max time.Duration
}

// wait sleeps the next pause; false if ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	if b.d == 0 {
		b.d = 50 * time.Millisecond
	}
	t := time.NewTimer(b.d + time.Duration(rand.Int64N(int64(b.d)/2+1)))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	b.d = min(2*b.d, b.max)
	return true
}

// connected reports whether the client has a live session now (false while
// it reconnects).
func (c *Client) connected() bool {
	c.mu.Lock()
	ready, s, closed := c.ready, c.sess, c.closed
	c.mu.Unlock()
	if closed {
		return false
	}
	select {
	case <-ready:
	default:
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// session returns the live session, waiting for a reconnect if needed.
func (c *Client) session(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		ready, s := c.ready, c.sess
		c.mu.Unlock()
		select {
		case <-ready:
			select {
			case <-s.done:
				// dead but not yet replaced: wait for maintain
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-c.ctx.Done():
					return nil, ErrClosed
				case <-time.After(10 * time.Millisecond):
				}
				continue
			default:
				return s, nil
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", ErrConnLost, ctx.Err())
		case <-c.ctx.Done():
			return nil, ErrClosed
		}
	}
}

// result is a response or an error.
type result struct {
	payload []byte
	err     error
}

// call sends a request and waits for its response.
func (c *Client) call(ctx context.Context, op wire.Op, payload []byte) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.RequestTimeout)
		defer cancel()
	}
	ch := make(chan result, 1)
	if err := c.start(ctx, op, payload, 0, func(r result) { ch <- r }); err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		return r.payload, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// start sends a request; done is called exactly once with its outcome (not
// called if start returns an error). flags may ask for no reply, in which
// case done is called once the frame is queued.
func (c *Client) start(ctx context.Context, op wire.Op, payload []byte, flags byte, done func(result)) error {
	_, _, err := c.send(ctx, op, payload, flags, nil, done)
	return err
}

// send is start that also takes more, which, if not nil, gets the answers
// flagged FlagMore that come before the last (a streaming request), on the
// session's reader (it must not block); and returns the session and the
// request's ID, with which the caller may cancel it (session.cancelCall).
func (c *Client) send(ctx context.Context, op wire.Op, payload []byte, flags byte, more, done func(result)) (*session, uint64, error) {
	select {
	case c.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	case <-c.ctx.Done():
		return nil, 0, ErrClosed
	}
	release := func(r result) {
		<-c.slot
		done(r)
	}
	s, err := c.session(ctx)
	if err != nil {
		<-c.slot
		return nil, 0, err
	}
	if n := wire.HeaderLen - 4 + len(payload); s.maxFrame > 0 && n > s.maxFrame {
		// The server would skip it and answer an error: say so without
		// sending megabytes for nothing.
		<-c.slot
		return nil, 0, fmt.Errorf("%w: a %s request of %d bytes, the server's limit %d", wire.ErrFrameTooLarge, op, n, s.maxFrame)
	}
	id := c.nextID.Add(1)
	if flags&wire.FlagNoReply == 0 {
		if !s.register(id, &call{done: release, more: more}) {
			<-c.slot
			return nil, 0, fmt.Errorf("%w: %v", ErrConnLost, s.err)
		}
	}
	f := wire.Frame{Op: op, Flags: flags, ID: id, Payload: payload}
	select {
	case s.out <- f:
	case <-s.done:
		if flags&wire.FlagNoReply != 0 {
			<-c.slot
			return nil, 0, fmt.Errorf("%w: %v", ErrConnLost, s.err)
		}
		return s, id, nil // the session's shutdown answers the registered call
	case <-ctx.Done():
		if flags&wire.FlagNoReply != 0 {
			<-c.slot
			return nil, 0, ctx.Err()
		}
		s.cancelCall(id)
		return nil, 0, ctx.Err()
	}
	if flags&wire.FlagNoReply != 0 {
		release(result{})
	}
	return s, id, nil
}

// callJSON marshals req, calls op and unmarshals the response into resp (if
// not nil).
func (c *Client) callJSON(ctx context.Context, op wire.Op, req, resp any) error {
	return c.callJSONVia(ctx, op, req, resp, c.call)
}

// callJSONVia is callJSON calling through call.
func (c *Client) callJSONVia(ctx context.Context, op wire.Op, req, resp any, call func(context.Context, wire.Op, []byte) ([]byte, error)) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	p, err := call(ctx, op, b)
	if err != nil {
		return err
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(p, resp); err != nil {
		return fmt.Errorf("%w: %s response: %v", wire.ErrBadPayload, op, err)
	}
	return nil
}

// session is one connection's worth of state.
type session struct {
	c    *Client
	nc   net.Conn
	out  chan wire.Frame
	done chan struct{}
	err  error
	// maxFrame is the server's frame limit (its hello reply); 0: unknown.
	maxFrame int

	mu      sync.Mutex
	pending map[uint64]*call
	ended   bool
	once    sync.Once
}

// dial connects to the first address that answers, starting with the one
// that answered last.
func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	addrs := c.Addrs()
	d := net.Dialer{Timeout: c.opts.DialTimeout}
	var errs []error
	start := int(c.lastAddr.Load())
	for i := range addrs {
		k := (start + i) % len(addrs)
		a := addrs[k]
		nc, err := d.DialContext(ctx, "tcp", a)
		if err == nil {
			c.lastAddr.Store(int32(k))
			return nc, nil
		}
		errs = append(errs, fmt.Errorf("dial %s: %w", a, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func (c *Client) connect(ctx context.Context) (*session, error) {
	nc, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	hello, _ := json.Marshal(wire.Hello{Version: wire.Version, Token: c.opts.Token, ClientID: c.opts.ClientID, ProducerGroups: c.root().producerGroups()})
	_ = nc.SetDeadline(time.Now().Add(c.opts.DialTimeout))
	if _, err := nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpHello, ID: 0, Payload: hello})); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("hello: %w", err)
	}
	f, err := wire.ReadFrame(nc, c.opts.MaxFrame)
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("hello: %w", err)
	}
	if f.Flags&wire.FlagError != 0 {
		_ = nc.Close()
		return nil, wire.DecodeError(f.Payload)
	}
	var reply wire.HelloReply
	if err := json.Unmarshal(f.Payload, &reply); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("hello reply: %w", err)
	}
	_ = nc.SetDeadline(time.Time{})
	s := &session{c: c, nc: nc, out: make(chan wire.Frame, c.opts.MaxInflight), done: make(chan struct{}), pending: map[uint64]*call{},
		maxFrame: reply.MaxFrame}
	keepalive := time.Duration(reply.KeepaliveMS) * time.Millisecond
	if keepalive <= 0 {
		keepalive = 30 * time.Second
	}
	c.wg.Add(2) // Close waits for every session's goroutines
	go s.readLoop()
	go s.writeLoop(keepalive)
	return s, nil
}

// call is a request waiting for its answer.
type call struct {
	done func(result) // the last answer, or the error that ends the call
	more func(result) // answers before the last (FlagMore); nil: none expected
}

func (s *session) register(id uint64, cl *call) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return false
	}
	s.pending[id] = cl
	return true
}

// cancelCall forgets a call whose caller gave up; its answer is dropped.
func (s *session) cancelCall(id uint64) {
	s.mu.Lock()
	cl := s.pending[id]
	delete(s.pending, id)
	s.mu.Unlock()
	if cl != nil {
		cl.done(result{err: context.Canceled})
	}
}

func (s *session) readLoop() {
	defer s.c.wg.Done()
	r := bufio.NewReaderSize(s.nc, 64<<10)
	for {
		f, err := wire.ReadFrame(r, s.c.opts.MaxFrame)
		if err != nil {
			s.shutdown(err)
			return
		}
		if f.Flags&wire.FlagResponse == 0 {
			if f.Flags&wire.FlagPush != 0 && f.Op == wire.OpCheckTxn {
				s.c.root().onCheck(f)
			}
			continue
		}
		s.mu.Lock()
		cl := s.pending[f.ID]
		more := cl != nil && cl.more != nil && f.Flags&(wire.FlagMore|wire.FlagError) == wire.FlagMore
		if !more {
			delete(s.pending, f.ID)
		}
		s.mu.Unlock()
		if more {
			cl.more(result{payload: f.Payload})
			continue
		}
		if cl == nil {
			if f.Flags&wire.FlagError != 0 && f.ID == 0 {
				s.shutdown(wire.DecodeError(f.Payload))
				return
			}
			continue
		}
		if f.Flags&wire.FlagError != 0 {
			cl.done(result{err: wire.DecodeError(f.Payload)})
		} else {
			cl.done(result{payload: f.Payload})
		}
	}
}

func (s *session) writeLoop(keepalive time.Duration) {
	defer s.c.wg.Done()
	w := bufio.NewWriterSize(s.nc, 64<<10)
	ping := time.NewTicker(keepalive)
	defer ping.Stop()
	var h [wire.HeaderLen]byte
	write := func(f wire.Frame) bool {
		if _, err := w.Write(wire.AppendHeader(h[:0], f, len(f.Payload))); err != nil {
			return false
		}
		_, err := w.Write(f.Payload)
		return err == nil
	}
	for {
		select {
		case f := <-s.out:
			ok := write(f)
		more:
			for ok && w.Buffered() < 256<<10 {
				select {
				case f = <-s.out:
					ok = write(f)
				default:
					break more
				}
			}
			if ok {
				_ = s.nc.SetWriteDeadline(time.Now().Add(30 * time.Second))
				ok = w.Flush() == nil
			}
			if !ok {
				s.shutdown(errors.New("write failed"))
				return
			}
		case <-ping.C:
			// Keepalive: an unanswered ping (NoReply) keeps the server's
			// idle timer from firing on a quiet connection.
			if !write(wire.Frame{Op: wire.OpPing, Flags: wire.FlagNoReply}) || w.Flush() != nil {
				s.shutdown(errors.New("write failed"))
				return
			}
		case <-s.done:
			return
		}
	}
}

// shutdown ends the session and fails every pending call.
func (s *session) shutdown(cause error) {
	s.once.Do(func() {
		s.mu.Lock()
		s.ended = true
		s.err = cause
		pending := s.pending
		s.pending = nil
		s.mu.Unlock()
		close(s.done)
		_ = s.nc.Close()
		err := cause
		if !errors.Is(cause, ErrClosed) {
			err = fmt.Errorf("%w: %v", ErrConnLost, cause)
		}
		for _, cl := range pending {
			cl.done(result{err: err})
		}
	})
}
