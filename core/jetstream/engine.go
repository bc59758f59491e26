package jetstream

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
)

// Options configure an Engine. A zero field means its default.
type Options struct {
	// URLs are the NATS servers to connect to (nats://host:port; several
	// for a cluster). Ignored when Conn is set.
	URLs []string
	// Conn, when set, is used instead of dialling; Close leaves it open.
	Conn *nats.Conn
	// Name is the connection name the servers show; default "ferrymq".
	Name string
	// CredsFile is a NATS credentials file (JWT + NKey seed).
	CredsFile string
	// User and Password, or Token, authenticate without a credentials file.
	User, Password, Token string
	// TLS, when set, is used for the connection (CA, client certificate).
	TLS *tls.Config

	// Replicas of every stream and bucket the engine creates: 1 on a single
	// server, 3 on a cluster (a publish is acknowledged once a majority of
	// the replicas stored it). Default 1.
	Replicas int
	// DefaultQueues is the queue count of auto-created topics; default 8.
	DefaultQueues int
	// DisableAutoCreate makes Produce to an unknown topic fail with
	// core.ErrTopicNotFound.
	DisableAutoCreate bool
	// MaxAge is how long messages are kept (stream max age); default 72 h.
	MaxAge time.Duration
	// MaxBytes bounds each topic's stream (oldest messages go first);
	// default unlimited.
	MaxBytes int64
	// MaxMessageBytes bounds one stored message (its record: body,
	// metadata and the record's header); default
	// core.DefaultMaxMessageBytes (4 MiB + 256 KiB, as the embedded
	// engine's). The server's max_payload caps it: nats-server's default
	// of 1 MB is too small for a core.MaxBodyBytes body, so the servers
	// must set max_payload (8MB in testdata/nats; docs/engines.md), and
	// Open logs a warning when they do not. A topic's stream is created
	// with this as its max_msg_size.
	MaxMessageBytes int
	// Timeout bounds one request to JetStream (publish acknowledgement,
	// stream API call); default 5 s.
	Timeout time.Duration
	// MaxPending bounds publishes awaiting their acknowledgement; past it a
	// produce waits. Default 4,096.
	MaxPending int
	// Bucket is the key-value bucket of committed offsets and deleted-topic
	// fences; default "ferrymq_core".
	Bucket string
	// MirrorOf, when set, makes the engine a read-only standby (failover
	// mode 2, mirror.go): the JetStream domain of the primary cluster,
	// whose topic streams and key index it mirrors into its own domain and
	// serves reads from, while every write fails with core.ErrReadOnly.
	// Its bucket (committed offsets, leases) is its own.
	MirrorOf string
	// MirrorEvery is how often a mirror engine looks for the primary's new
	// topics and changed epochs; default 2 s.
	MirrorEvery time.Duration
	// Logger receives one line per notable event; default: discard.
	Logger *zerolog.Logger
}

func (o *Options) setDefaults() error {
	if o.Conn == nil && len(o.URLs) == 0 {
		return errors.New("jetstream: no NATS URL")
	}
	if o.Name == "" {
		o.Name = "ferrymq"
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.Replicas < 1 || o.Replicas > 5 {
		return fmt.Errorf("jetstream: replicas %d, want 1 to 5", o.Replicas)
	}
	if o.DefaultQueues == 0 {
		o.DefaultQueues = 8
	}
	if o.DefaultQueues < 1 || o.DefaultQueues > 1024 {
		return fmt.Errorf("jetstream: default queues %d, want 1 to 1024", o.DefaultQueues)
	}
	if o.MaxAge == 0 {
		o.MaxAge = 72 * time.Hour
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if o.MaxPending == 0 {
		o.MaxPending = 4096
	}
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = core.DefaultMaxMessageBytes
	}
	if o.MaxMessageBytes < 0 {
		return fmt.Errorf("jetstream: max message bytes %d, want a positive size", o.MaxMessageBytes)
	}
	if o.Bucket == "" {
		o.Bucket = "ferrymq_core"
	}
	if o.MirrorEvery == 0 {
		o.MirrorEvery = 2 * time.Second
	}
	if o.Logger == nil {
		nop := zerolog.Nop()
		o.Logger = &nop
	}
	return nil
}

// Engine is core.Broker on NATS JetStream. See doc.go.
type Engine struct {
	opts   Options
	log    zerolog.Logger
	nc     *nats.Conn
	ownNC  bool
	js     jetstream.JetStream
	meta   jetstream.KeyValue
	get    *getter
	arrive *arrivals
	idx    *indexer
	fence  *fences
	maxMsg int
	holder string // this engine in resize locks

	// republished counts publishes a resize's fence refused that the
	// engine published again with the new epoch.
	republished atomic.Int64

	fenceMu     sync.Mutex
	fenceSeen   map[string]streamSubjects // the fence's view of streams, by name
	subjectsTTL time.Duration             // how long fenceSeen is trusted: subjectsTTL (tests set more)

	mu      sync.RWMutex
	topics  map[string]*topicState // by name
	byHash  map[uint64]string      // topic hash (message IDs) → name
	loading map[string]*load       // topic lookups in flight

	sendMu  sync.RWMutex  // held for reading while a produce enqueues; Close takes it to close acks
	bgMu    sync.Mutex    // orders a goroutine begun in the background (finishLater) with Close
	acks    chan *pending // produce → checker
	checked chan *pending // checker → acker, while a call awaits a message published again
	behind  atomic.Int64  // calls handed to the acker and not yet answered
	closed  atomic.Bool
	closing chan struct{} // closed when Close begins: waits for an epoch give up
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// topicState is what the engine caches of one topic's stream.
type topicState struct {
	name    string
	tok     string
	stream  string
	created time.Time
	rr      atomic.Uint32
	rng     atomic.Pointer[cachedRange] // Read's view of the stream's range
	lay     atomic.Pointer[layout]      // the newest epochs known (reads, decoding)
	// silentUntil (unix ns): the stream did not answer the checker's last
	// question; until then a publish no stream took fails at once instead
	// of asking again (produce.go, refusal).
	silentUntil atomic.Int64
	// finishing is set while a goroutine of this engine finishes a resize
	// whose resizer seems gone (resize.go, finishLater).
	finishing atomic.Bool

	// Publishing (produce.go). Produces publish to pub's publishing epoch;
	// a newer layout waits in next until every message published with pub
	// has been checked by the checker (inflight 0), so that what the fence
	// refused is published again before anything newer. While waiters > 0
	// (a resize until its fence is up and its marker stored, or the checker
	// asking the stream for the new epoch) produces wait too. ready is
	// closed when they may go on.
	mu       sync.Mutex
	pub      *layout
	next     *layout
	waiters  int
	inflight int
	ready    chan struct{}
	drained  chan struct{} // closed when inflight reaches 0 (idle)
	// layChanged is closed when lay changes (learn), for whoever waits.
	layChanged chan struct{}
}

// Open connects to NATS and prepares the engine's bucket and index stream.
// When JetStream does not answer the setup (a cluster still electing its
// leaders) the error is ErrUnavailable and Open may be called again.
func Open(ctx context.Context, opts Options) (*Engine, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, log: opts.Logger.With().Str("component", "jetstream").Logger(),
		topics: map[string]*topicState{}, byHash: map[uint64]string{}, loading: map[string]*load{},
		acks: make(chan *pending, 1024), checked: make(chan *pending, 1024), closing: make(chan struct{}),
		fenceSeen: map[string]streamSubjects{}, subjectsTTL: subjectsTTL,
		holder: opts.Name + "/" + randomID()}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	nc := opts.Conn
	if nc == nil {
		var err error
		if nc, err = e.dial(); err != nil {
			e.cancel()
			return nil, err
		}
		e.ownNC = true
	}
	e.nc = nc
	ok := false
	defer func() {
		if !ok {
			e.cancel()
			if e.ownNC {
				nc.Close()
			}
		}
	}()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(opts.MaxPending),
		jetstream.WithPublishAsyncTimeout(opts.Timeout), jetstream.WithDefaultTimeout(opts.Timeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	e.js = js
	e.maxMsg = opts.MaxMessageBytes
	if payload := int(nc.MaxPayload()); payload < e.maxMsg {
		e.log.Warn().Int("max_payload", payload).Int("max_message_bytes", e.maxMsg).
			Msg("the NATS server's max_payload is below the message limit: larger messages are refused; set max_payload: 8MB on every server")
		e.maxMsg = payload
	}
	if err := e.setup(ctx); err != nil {
		return nil, err
	}
	if e.get, err = newGetter(nc, opts.Timeout); err != nil {
		return nil, err
	}
	if e.arrive, err = newArrivals(nc, e.ctx, &e.wg); err != nil {
		e.get.close()
		return nil, err
	}
	e.idx = newIndexer(js, e.log)
	e.fence = newFences(nc, e.log, e.takes)
	if opts.MirrorOf != "" {
		if err := e.startMirroring(ctx); err != nil {
			e.get.close()
			return nil, err
		}
	}
	e.wg.Add(4)
	go e.checker()
	go e.acker()
	go func() {
		defer e.wg.Done()
		e.idx.run()
	}()
	go func() {
		defer e.wg.Done()
		e.fence.run(e.ctx.Done())
	}()
	ok = true
	e.log.Info().Str("servers", strings.Join(nc.Servers(), ",")).Int("replicas", opts.Replicas).Msg("jetstream engine open")
	return e, nil
}

func (e *Engine) dial() (*nats.Conn, error) {
	o := e.opts
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.Timeout(o.Timeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			e.log.Warn().Err(err).Msg("nats disconnected")
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			e.log.Info().Str("server", c.ConnectedUrlRedacted()).Msg("nats reconnected")
		}),
	}
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.User != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.Token != "" {
		opts = append(opts, nats.Token(o.Token))
	}
	if o.TLS != nil {
		opts = append(opts, nats.Secure(o.TLS))
	}
	nc, err := nats.Connect(strings.Join(o.URLs, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("jetstream: connect to %s: %w", strings.Join(o.URLs, ","), err)
	}
	return nc, nil
}

// setup creates (or binds) the engine's bucket and index stream.
func (e *Engine) setup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 4*e.opts.Timeout)
	defer cancel()
	kv, err := e.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      e.opts.Bucket,
		Description: "ferrymq committed offsets and deleted-topic fences",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    e.opts.Replicas,
	})
	if err != nil {
		return e.setupErr("bucket "+e.opts.Bucket, err)
	}
	e.meta = kv
	keys := jetstream.StreamConfig{
		Name:        keysStream,
		Description: "ferrymq index keys of messages (besides their sharding key)",
		Subjects:    []string{keysPrefix + ">"},
		Storage:     jetstream.FileStorage,
		Replicas:    e.opts.Replicas,
		MaxAge:      e.opts.MaxAge,
		AllowDirect: true,
		Discard:     jetstream.DiscardOld,
	}
	if e.opts.MirrorOf != "" {
		keys.Subjects, keys.Mirror = nil, &jetstream.StreamSource{Name: keysStream, Domain: e.opts.MirrorOf}
		keys.Description = "ferrymq index keys, mirrored from domain " + e.opts.MirrorOf
	}
	_, err = e.js.CreateOrUpdateStream(ctx, keys)
	if err != nil {
		return e.setupErr("stream "+keysStream, err)
	}
	return nil
}

// setupErr wraps a failed setup call as unavailable does, unless
// JetStream answered with a refusal (a configuration to fix, JetStream not
// enabled): so a caller may retry a cluster that is still electing its
// leaders — a node's start does — and fail at once on the rest.
func (e *Engine) setupErr(what string, err error) error {
	var api *jetstream.APIError
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.As(err, &api) && api.Code < 500 {
		return fmt.Errorf("jetstream: %s: %w", what, err)
	}
	return e.unavailable(what, err)
}

// Conn is the engine's NATS connection (shared by the session store).
func (e *Engine) Conn() *nats.Conn { return e.nc }

// JetStream is the engine's JetStream context.
func (e *Engine) JetStream() jetstream.JetStream { return e.js }

// Ready reports whether NATS is connected and JetStream answers.
func (e *Engine) Ready(ctx context.Context) error {
	if e.closed.Load() {
		return core.ErrClosed
	}
	if st := e.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("%w: connection %s", ErrUnavailable, st)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := e.js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// Close stops the engine: no new produce is taken, those in flight get
// their acknowledgement (or error), then the connection closes if the
// engine dialled it.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(e.closing)
	e.bgMu.Lock() // a goroutine begun in the background is counted in wg by now
	e.bgMu.Unlock()
	e.sendMu.Lock()
	close(e.acks)
	e.sendMu.Unlock()
	e.fence.close()
	e.cancel()
	e.wg.Wait()
	e.get.close()
	if e.ownNC {
		e.nc.Close()
	}
	e.log.Info().Msg("jetstream engine closed")
	return nil
}

// randomID names this engine among others with the same Name.
func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

var _ core.Broker = (*Engine)(nil)
