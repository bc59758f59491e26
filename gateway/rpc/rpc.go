package rpc

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Limits and defaults.
const (
	// MinTimeout and MaxTimeout bound a call's timeout; DefaultTimeout is
	// what a call asking for none gets.
	MinTimeout     = time.Second
	MaxTimeout     = 60 * time.Second
	DefaultTimeout = 5 * time.Second
	// DefaultMaxPayload bounds a request's payload (and a relayed answer's).
	DefaultMaxPayload = 256 << 10
	// DefaultAskWindow is how long a call asked of the other nodes waits
	// for one to say it has the device, when not every live node answered.
	DefaultAskWindow = time.Second
	// DefaultPrefix begins the NATS subjects of calls between nodes.
	DefaultPrefix = "fmqrpc"
	// TraceTopic is the name under which calls are traced (besides "every
	// topic").
	TraceTopic = "$rpc"
	// IDKindCall marks a call's ID among core.MessageIDs.
	IDKindCall = 3
	// maxClientID bounds a callable client ID (MQTT allows 65,535 bytes;
	// no device needs more than this).
	maxClientID = 1024
)

// Hops of a call's trace.
const (
	HopCall    = "rpc.call"    // a backend's call reached a node
	HopRequest = "rpc.request" // the request was handed to the device's connection
	HopAnswer  = "rpc.answer"  // the device answered
	HopTimeout = "rpc.timeout" // the device did not answer in time
)

// Options configure a Service.
type Options struct {
	// Conn, when set, reaches the devices connected to the other nodes of
	// the cluster (engine nats). Nil: this node only.
	Conn *nats.Conn
	// Node names this node; it must be unique among the live nodes.
	Node string
	// Prefix begins the NATS subjects; DefaultPrefix when empty.
	Prefix string
	// Peers counts the other live nodes, so that a call to a device no
	// node has fails as soon as they all said so. Nil, or an error: the
	// call waits AskWindow for a node to say it has the device.
	Peers func(ctx context.Context) (int, error)
	// AskWindow: DefaultAskWindow when 0.
	AskWindow time.Duration
	// MaxPayload bounds a request's payload; DefaultMaxPayload when 0.
	MaxPayload int
	// Trace records calls' hops (see the package doc); nil records none.
	Trace  *trace.Recorder
	Logger *zerolog.Logger
}

// Answer is a device's answer to a call.
type Answer struct {
	// ID is the call's ID: its trace is recorded under it.
	ID      core.MessageID
	Payload []byte
	// Node is the gateway node the device is connected to.
	Node string
	// Took is the time from the call reaching this node to the answer.
	Took time.Duration
}

// result ends a pending call.
type result struct {
	payload []byte
	node    string
	err     error
}

// pending is a call whose request was handed to a device connected here,
// waiting for its answer.
type pending struct {
	client string
	timer  *time.Timer
	done   func(result)
}

// Service makes calls to devices and takes their answers off the bridge.
// Safe for concurrent use. Attach the engine before its clients can
// answer, Start it to serve the other nodes, Close it after the engine.
type Service struct {
	opts Options
	log  zerolog.Logger
	m    *metrics
	e    atomic.Pointer[engine.Engine]
	boot [7]byte
	seq  atomic.Uint64

	mu      sync.Mutex
	pending map[core.MessageID]*pending // calls delivered to devices connected here
	asks    map[core.MessageID]*ask     // calls this node asked the others about
	closed  bool
	subs    []*nats.Subscription
}

// New returns a Service; it answers nothing until Attach.
func New(o Options) (*Service, error) {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.AskWindow <= 0 {
		o.AskWindow = DefaultAskWindow
	}
	if o.MaxPayload <= 0 {
		o.MaxPayload = DefaultMaxPayload
	}
	if o.Conn != nil && o.Node == "" {
		return nil, fmt.Errorf("%w: a node name is required between nodes", ErrBadRequest)
	}
	s := &Service{opts: o, m: newMetrics(), pending: map[core.MessageID]*pending{}, asks: map[core.MessageID]*ask{}}
	if o.Logger != nil {
		s.log = o.Logger.With().Str("component", "rpc").Logger()
	} else {
		s.log = zerolog.Nop()
	}
	if _, err := rand.Read(s.boot[:]); err != nil {
		return nil, fmt.Errorf("rpc: call IDs: %w", err)
	}
	return s, nil
}

// Attach gives the service the engine whose clients it calls.
func (s *Service) Attach(e *engine.Engine) { s.e.Store(e) }

// newID returns a call ID unique to this process: kind, 7 random bytes
// drawn at start, an 8-byte sequence.
func (s *Service) newID() core.MessageID {
	var id core.MessageID
	id[0] = IDKindCall
	copy(id[1:8], s.boot[:])
	binary.BigEndian.PutUint64(id[8:], s.seq.Add(1))
	return id
}

// Call sends payload to clientID's device and waits for its answer, at
// most timeout (0: DefaultTimeout; else 1–60 s) or until ctx ends.
func (s *Service) Call(ctx context.Context, clientID string, payload []byte, timeout time.Duration) (Answer, error) {
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if err := s.check(clientID, payload, timeout); err != nil {
		s.m.calls.WithLabelValues(outcomeBad).Inc()
		return Answer{}, err
	}
	start := time.Now()
	deadline := start.Add(timeout)
	id := s.newID()
	s.hop(id, HopCall, "", map[string]string{"client": clientID, "timeout_ms": fmt.Sprint(timeout.Milliseconds())})
	ch := make(chan result, 1)
	done := func(r result) { ch <- r }
	err := s.deliver(id, clientID, payload, deadline, done)
	if errors.Is(err, ErrNotConnected) && s.opts.Conn != nil {
		err = s.ask(ctx, id, clientID, payload, deadline, done)
	}
	var r result
	if err == nil {
		select {
		case r = <-ch:
		case <-ctx.Done():
			s.abandon(id)
			r.err = fmt.Errorf("rpc: call to %q: %w", clientID, ctx.Err())
		}
	} else {
		r.err = err
	}
	took := time.Since(start)
	switch {
	case r.err == nil:
		s.m.calls.WithLabelValues(outcomeAnswered).Inc()
		s.m.latency.Observe(took.Seconds())
		return Answer{ID: id, Payload: r.payload, Node: r.node, Took: took}, nil
	case errors.Is(r.err, ErrNotConnected):
		s.m.calls.WithLabelValues(outcomeNotConnected).Inc()
	case errors.Is(r.err, ErrTimeout):
		s.m.calls.WithLabelValues(outcomeTimeout).Inc()
	default:
		s.m.calls.WithLabelValues(outcomeError).Inc()
	}
	return Answer{ID: id}, r.err
}

// check validates a call.
func (s *Service) check(clientID string, payload []byte, timeout time.Duration) error {
	if timeout < MinTimeout || timeout > MaxTimeout {
		return fmt.Errorf("%w: timeout %v is outside %v–%v", ErrBadRequest, timeout, MinTimeout, MaxTimeout)
	}
	if len(payload) > s.opts.MaxPayload {
		return fmt.Errorf("%w: payload of %d bytes is over the limit, %d", ErrBadRequest, len(payload), s.opts.MaxPayload)
	}
	return checkClient(clientID)
}

// checkClient reports whether clientID can be called: it must make a valid
// topic level of its request topic.
func checkClient(clientID string) error {
	switch {
	case clientID == "":
		return fmt.Errorf("%w: empty client ID", ErrBadRequest)
	case len(clientID) > maxClientID:
		return fmt.Errorf("%w: client ID of %d bytes is over %d", ErrBadRequest, len(clientID), maxClientID)
	case !utf8.ValidString(clientID) || strings.ContainsAny(clientID, "+#\x00"):
		return fmt.Errorf("%w: client ID %q cannot be part of a topic name", ErrBadRequest, clientID)
	}
	return nil
}

// deliver hands the request to clientID's connection on this node and
// registers the call until done is called: with the answer, or ErrTimeout
// at deadline. ErrNotConnected when the device is not connected here.
func (s *Service) deliver(id core.MessageID, clientID string, payload []byte, deadline time.Time, done func(result)) error {
	e := s.e.Load()
	if e == nil || !e.Connected(clientID) {
		return ErrNotConnected
	}
	p := &pending{client: clientID, done: done}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.pending[id] = p
	p.timer = time.AfterFunc(time.Until(deadline), func() {
		if s.take(id) != nil {
			s.hop(id, HopTimeout, clientID, nil)
			done(result{err: fmt.Errorf("%w: %q", ErrTimeout, clientID)})
		}
	})
	s.mu.Unlock()
	ids := id.String()
	m := &engine.Message{
		Topic:   RequestTopic(clientID, ids),
		Payload: payload,
		QoS:     1,
		// It expires with the call: a device that reconnects later never
		// gets a request nobody waits for.
		Expiry: (deadline.UnixNano() + int64(time.Second) - 1) / int64(time.Second),
		Props:  &engine.Props{ResponseTopic: ResponseTopic(clientID, ids), CorrelationData: []byte(ids)},
	}
	if err := e.Send(clientID, m); err != nil {
		if s.take(id) == nil {
			return nil // ended meanwhile (closed): done was called
		}
		if errors.Is(err, engine.ErrNotConnected) || errors.Is(err, engine.ErrNoSession) {
			return ErrNotConnected
		}
		return fmt.Errorf("rpc: send to %q: %w", clientID, err)
	}
	s.hop(id, HopRequest, clientID, map[string]string{"topic": m.Topic})
	return nil
}

// take removes and returns call id's pending entry, its timer stopped;
// nil if it ended already. Whoever takes it calls its done.
func (s *Service) take(id core.MessageID) *pending {
	s.mu.Lock()
	p := s.pending[id]
	delete(s.pending, id)
	s.mu.Unlock()
	if p != nil && p.timer != nil {
		p.timer.Stop()
	}
	return p
}

// abandon forgets a call whose caller went away.
func (s *Service) abandon(id core.MessageID) {
	s.take(id)
	s.takeAsk(id)
}

// Prefix implements bridge.Interceptor: "$rpc/".
func (s *Service) Prefix() string { return topicPrefix }

// Intercept implements bridge.Interceptor: a device's answer completes its
// call.
func (s *Service) Intercept(c *engine.Client, m *engine.Message) engine.Result {
	client, id, err := parseResponse(m.Topic)
	if err != nil || client != c.ID() {
		s.m.refused.Inc()
		s.log.Debug().Str("client", c.ID()).Str("topic", m.Topic).Msg("publish to a $rpc topic refused")
		return engine.Result{Code: engine.NotAuthorized, Reason: "only answers to this client's own calls may be published under $rpc/"}
	}
	p := s.take(id)
	if p == nil || p.client != client {
		s.m.unmatched.Inc()
		return engine.Result{}
	}
	s.hop(id, HopAnswer, client, map[string]string{"bytes": fmt.Sprint(len(m.Payload))})
	p.done(result{payload: m.Payload, node: s.opts.Node})
	return engine.Result{}
}

// hop records a hop of call id when calls are traced.
func (s *Service) hop(id core.MessageID, hop, actor string, attrs map[string]string) {
	if t := s.opts.Trace; t.Enabled(TraceTopic) {
		t.Record(trace.Event{ID: id, Hop: hop, Actor: actor, Attrs: attrs})
	}
}

// Pending returns the calls waiting for a device connected here and those
// asked of the other nodes.
func (s *Service) Pending() (here, asked int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending), len(s.asks)
}

// Close ends every pending call with ErrClosed and stops serving the other
// nodes. Calls after it fail with ErrClosed.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	subs := s.subs
	s.subs = nil
	pend, asks := s.pending, s.asks
	s.pending, s.asks = map[core.MessageID]*pending{}, map[core.MessageID]*ask{}
	s.mu.Unlock()
	var errs []error
	for _, sub := range subs {
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			errs = append(errs, err)
		}
	}
	for _, p := range pend {
		p.timer.Stop()
		p.done(result{err: ErrClosed})
	}
	for _, a := range asks {
		a.timer.Stop()
		a.done(result{err: ErrClosed})
	}
	return errors.Join(errs...)
}
