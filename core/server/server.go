package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/core/wire"
)

// Options configure a Server. A zero field means its default.
type Options struct {
	// Addr is the TCP address to listen on; default ":10911".
	Addr   string
	Broker core.Broker
	Groups *group.Coordinator
	Retry  *retry.Service
	Pop    *pop.Service
	// Delay, when set, serves cancel and list of delayed messages; Broker
	// should then be its Broker, so that produces with a deliver-at time are
	// delayed.
	Delay *delay.Service
	// Txn, when set, serves transactional messages and pushes check-backs
	// to connected producers.
	Txn *txn.Service
	// Token, when set, must be presented in OpHello.
	Token string
	// MaxFrame bounds a frame; default wire.DefaultMaxFrame (8 MiB).
	MaxFrame int
	// MaxInflight bounds unanswered requests per connection; default 256.
	MaxInflight int
	// Handlers is the number of handler goroutines per connection; default 4.
	Handlers int
	// MaxConns bounds connections; default 10,000.
	MaxConns int
	// HandshakeTimeout bounds the wait for OpHello; default 10 s.
	HandshakeTimeout time.Duration
	// Keepalive is announced to clients; a connection silent for three of
	// them is closed. Default 30 s.
	Keepalive time.Duration
	// WriteTimeout closes a connection whose client does not read; default 30 s.
	WriteTimeout time.Duration
	// MaxWait caps a long poll; default 30 s.
	MaxWait time.Duration
	// Placement, when set, says which node serves a shard: a consumer
	// group's operations (heartbeat, group pull, commit, release, leave,
	// send back, dead letter, POP, ack, change invisible time, lag, reset;
	// shard: the group's name) and the node-wide services' (group listing,
	// delayed messages, transactions; shard ""). A request of a shard
	// served elsewhere is answered with wire.CodeMoved naming that node,
	// and the client sends it there. Nil: every shard is served here. With
	// Placement set, Groups, Retry and Pop may be nil until SetServices.
	Placement func(ctx context.Context, shard string) (Route, error)
	// Cluster, when set, answers OpCluster (discovery): the nodes a client
	// may connect to. Without it the server names itself alone, at its
	// listening address.
	Cluster func(context.Context) (wire.ClusterInfo, error)
	// Calls, when set, answers OpCall: synchronous calls to devices.
	// Nil: CodeNotEnabled.
	Calls Caller
	// Shadows, when set, serves device shadows (shadow.go); nil answers
	// their ops wire.CodeNotEnabled.
	Shadows Shadows
	// Version is reported in OpHello; default "ferrymq".
	Version string
	// Trace, when set, records the hops of traced messages produced over
	// the wire (OpProduce): "produce" by the connection's client ID, then
	// "stored", or "delayed" for one that waits for its deliver-at time,
	// under the ID its producer got. The services in Groups, Retry and Pop
	// record their hops with their own recorders. Nil records nothing.
	Trace  *trace.Recorder
	Logger *zerolog.Logger
}

func (o Options) withDefaults() Options {
	if o.Addr == "" {
		o.Addr = ":10911"
	}
	if o.MaxFrame == 0 {
		o.MaxFrame = wire.DefaultMaxFrame
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = 256
	}
	if o.Handlers == 0 {
		o.Handlers = 4
	}
	if o.MaxConns == 0 {
		o.MaxConns = 10_000
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.Keepalive == 0 {
		o.Keepalive = 30 * time.Second
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.MaxWait == 0 {
		o.MaxWait = 30 * time.Second
	}
	if o.Version == "" {
		o.Version = "ferrymq"
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	switch {
	case o.Broker == nil:
		errs = append(errs, errors.New("broker is required"))
	case o.Placement == nil && (o.Groups == nil || o.Retry == nil || o.Pop == nil):
		errs = append(errs, errors.New("groups, retry and pop are required (or a placement, and SetServices)"))
	}
	if o.MaxFrame < 1<<16 || o.MaxInflight < 1 || o.Handlers < 1 || o.MaxConns < 1 {
		errs = append(errs, errors.New("max frame (≥ 64 KiB), max in-flight, handlers and max conns must be positive"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("server: invalid options: %w", errors.Join(errs...))
	}
	return nil
}

// Services are the stateful services a server hands the requests of
// consumer groups, POP, delayed messages and transactions to. Delay and
// Txn may be nil (not enabled).
type Services struct {
	Groups *group.Coordinator
	Retry  *retry.Service
	Pop    *pop.Service
	Delay  *delay.Service
	Txn    *txn.Service
}

// Route is where a shard is served (Options.Placement).
type Route struct {
	// Here: this server serves it.
	Here bool
	// Node and Addr name the node that does and its core address.
	Node, Addr string
}

// Server is a core wire-protocol server.
type Server struct {
	opts Options
	log  zerolog.Logger
	ln   net.Listener
	hold *holder
	svc  atomic.Pointer[Services] // nil: none here (Placement set, before SetServices)

	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	conns    map[*conn]struct{}
	draining bool

	wg sync.WaitGroup // accept loop, holder, connections
}

// New returns a server; Start it.
func New(opts Options) (*Server, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger.With().Str("component", "core-server").Logger(), conns: map[*conn]struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.hold = newHolder(s.ctx, opts.Broker, &s.wg)
	if opts.Groups != nil {
		s.svc.Store(&Services{Groups: opts.Groups, Retry: opts.Retry, Pop: opts.Pop, Delay: opts.Delay, Txn: opts.Txn})
	}
	return s, nil
}

// SetServices hands the stateful services' requests to svc from now on
// (nil: none; with a Placement that says a shard is served here, its
// requests are then refused as retryable, core.ErrClosed). Connections
// registered as transactional producers with the services before are
// closed: their clients reconnect and register again where the
// transactions are now served.
func (s *Server) SetServices(svc *Services) {
	old := s.svc.Swap(svc)
	if old == nil || old.Txn == nil || (svc != nil && svc.Txn == old.Txn) {
		return
	}
	s.mu.Lock()
	var drop []*conn
	for c := range s.conns {
		if c.registered() {
			drop = append(drop, c)
		}
	}
	s.mu.Unlock()
	for _, c := range drop {
		c.log.Info().Msg("transactions moved: closing a producer's connection so that it registers again")
		_ = c.nc.Close() // its reader ends and closes the rest
	}
}

// services returns the services serving shard here, or the error that
// answers the request: wire.CodeMoved naming the node that serves it, or
// core.ErrClosed while the services are not running here yet.
func (s *Server) services(ctx context.Context, shard string) (*Services, error) {
	if p := s.opts.Placement; p != nil {
		r, err := p(ctx, shard)
		if err != nil {
			return nil, err
		}
		if !r.Here {
			if r.Addr == "" {
				return nil, fmt.Errorf("%w: no node serves %q now (retry shortly)", core.ErrClosed, shard)
			}
			return nil, wire.MovedError(shard, r.Node, r.Addr)
		}
	}
	svc := s.svc.Load()
	if svc == nil {
		return nil, fmt.Errorf("%w: the services are starting on this node (retry shortly)", core.ErrClosed)
	}
	return svc, nil
}

// Start listens on Addr and serves in the background.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.opts.Addr, err)
	}
	s.ln = ln
	s.wg.Add(1)
	go s.acceptLoop()
	s.log.Info().Str("addr", ln.Addr().String()).Msg("core server listening")
	return nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn().Err(err).Msg("accept")
			select {
			case <-time.After(50 * time.Millisecond):
			case <-s.ctx.Done():
				return
			}
			continue
		}
		s.mu.Lock()
		if s.draining || len(s.conns) >= s.opts.MaxConns {
			draining := s.draining
			s.mu.Unlock()
			code, msg := wire.CodeOverloaded, "too many connections"
			if draining {
				code, msg = wire.CodeShuttingDown, "server shutting down"
			}
			_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpHello, Flags: wire.FlagResponse | wire.FlagError, Payload: wire.EncodeError(code, msg)}))
			_ = nc.Close()
			continue
		}
		c := newConn(s, nc)
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Shutdown stops accepting, lets in-flight requests finish until ctx ends,
// closes every connection and waits for every goroutine.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	if s.ln != nil {
		_ = s.ln.Close()
	}
	for _, c := range conns {
		c.drain()
	}
	s.hold.drain() // long polls answer now instead of holding shutdown up
	done := make(chan struct{})
	go func() {
		for _, c := range conns {
			c.waitIdle(ctx)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	s.cancel() // ends the holder's goroutines, and every connection
	for _, c := range conns {
		c.close()
	}
	s.wg.Wait()
	<-done
	return nil
}
