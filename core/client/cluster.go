package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/rendezvous"
	"github.com/ferrymq/ferrymq/core/wire"
)

// ClusterOptions configure a Cluster. A zero field means its default.
type ClusterOptions struct {
	// Addrs are the nodes' core addresses, host:port.
	Addrs []string
	// Client configures each node's connection (its Addr is ignored).
	Client Options
	// Breaker configures each node's circuit breaker.
	Breaker BreakerOptions
	// Attempts bounds the tries of one send, each on a different node
	// while there are others; default 3.
	Attempts int
	// AttemptTimeout bounds one try, so that a node that stalls is left
	// for another; default 5 s (the send's own context still bounds the
	// whole).
	AttemptTimeout time.Duration
	// OnStateChange, when set, is called at each change of a node's
	// breaker (besides the log line), on the goroutine that caused it; it
	// must not block.
	OnStateChange func(addr string, from, to BreakerState)
	// Discover asks a connected node for its cluster's nodes (wire
	// CLUSTER) at once and every Client.DiscoverEvery (default 30 s), and
	// adds those it does not know, each with a connection and a breaker of
	// its own: Addrs may then name one node.
	Discover bool
}

// ErrNoNode is returned when no node could take a send in its attempts.
var ErrNoNode = errors.New("client: no node took the request")

// Cluster sends to several nodes at once, each with its own connection
// and circuit breaker: a node whose calls fail or time out too often in a
// window is isolated (its breaker opens) and the others take its traffic;
// after a pause one call probes it (half-open), and it is readmitted when
// that call succeeds. A send that fails for a reason another node may not
// have — the connection lost or refused, the try's timeout, the store
// failed, the server shutting down or overloaded — is tried again on
// another node, up to Attempts in all. The caller sees a failure only when
// every try failed, or one failed for a reason of the message's own (too
// large, invalid), which no node would take.
//
// A message goes to the node its sharding key ranks first (rendezvous
// hashing over the nodes whose breakers let it through), so a key's
// messages keep to one node while it is healthy; messages without a key
// go round the nodes. A try that timed out may still land on its node: a
// send is at least once, as any retried send.
//
// A node that cannot be reached when the Cluster is made is dialled again
// in the background until it answers (its breaker counts the tries it
// misses meanwhile); the Cluster needs one node that answers at once.
type Cluster struct {
	o     ClusterOptions
	log   zerolog.Logger
	nodes atomic.Pointer[[]*clusterNode] // copied on write: discovery adds nodes
	rr    atomic.Uint64

	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex // guards closed and wg.Add after Close
	closed bool
	wg     sync.WaitGroup
}

type clusterNode struct {
	addr    string
	br      *breaker
	c       atomic.Pointer[Client]   // nil until the first connection
	p       atomic.Pointer[Producer] // c's, for SendAsync (its own retries off: the Cluster retries)
	sent    atomic.Int64             // successful tries
	fail    atomic.Int64             // failed tries
	changes [3]atomic.Int64          // changes of its breaker, by the state changed to
}

// live is n's connection if it is up now, else nil (not yet connected, or
// reconnecting).
func (n *clusterNode) live() *Client {
	if c := n.c.Load(); c != nil && c.connected() {
		return c
	}
	return nil
}

// NodeStatus is a node's breaker and counts, from Cluster.Nodes.
type NodeStatus struct {
	Addr string
	// Connected: the node's connection is up now (not while it is first
	// dialled or reconnects).
	Connected bool
	State     BreakerState
	// WindowCalls and WindowFailures are the breaker's window.
	WindowCalls, WindowFailures int
	// Sent and Failed count tries since the Cluster was made.
	Sent, Failed int64
	// Changes counts the breaker's changes since the Cluster was made, by
	// the state changed to (Changes[BreakerOpen]: the times it opened).
	Changes [3]int64
}

// DialCluster connects to the nodes, each within the client's DialTimeout:
// it returns once each answered or failed, with an error only if none
// answered, and keeps dialling those that failed in the background.
func DialCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	if len(o.Addrs) == 0 {
		return nil, errors.New("client: no node addresses")
	}
	if o.Attempts <= 0 {
		o.Attempts = 3
	}
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = 5 * time.Second
	}
	co := o.Client.withDefaults()
	cl := &Cluster{o: o, log: co.Logger.With().Str("component", "client-cluster").Logger()}
	cl.ctx, cl.cancel = context.WithCancel(context.Background())
	var nodes []*clusterNode
	for _, a := range o.Addrs {
		nodes = append(nodes, &clusterNode{addr: a, br: newBreaker(o.Breaker, time.Now)})
	}
	cl.nodes.Store(&nodes)
	first := make(chan error, len(nodes)) // each node's first try
	for _, n := range nodes {
		cl.wg.Go(func() { cl.dialNode(ctx, n, first) })
	}
	var errs []error
	up := 0
	for range nodes {
		if err := <-first; err != nil {
			errs = append(errs, err)
		} else {
			up++
		}
	}
	if up > 0 {
		if o.Discover {
			cl.wg.Go(cl.discover)
		}
		return cl, nil
	}
	_ = cl.Close()
	return nil, fmt.Errorf("client: no node answered: %w", errors.Join(errs...))
}

// dialNode connects n: its first try with ctx (DialCluster's), whose
// outcome goes to first; after a failure it tries again with backoff
// until it answers or the Cluster closes.
func (cl *Cluster) dialNode(ctx context.Context, n *clusterNode, first chan<- error) {
	o := cl.o.Client
	o.Addr = n.addr
	b := backoff{max: o.withDefaults().MaxBackoff}
	for try := 0; ; try++ {
		dctx := cl.ctx
		if try == 0 {
			dctx = ctx
		}
		c, err := Dial(dctx, o)
		if err == nil {
			if cl.ctx.Err() != nil { // closed meanwhile
				_ = c.Close()
			} else {
				p := c.NewProducer()
				p.Retries = 0
				n.p.Store(p)
				n.c.Store(c) // before DialCluster hears of it
			}
			if try == 0 {
				first <- nil
			} else {
				cl.log.Info().Str("node", n.addr).Msg("node connected")
			}
			return
		}
		if try == 0 {
			first <- fmt.Errorf("%s: %w", n.addr, err)
			cl.log.Warn().Err(err).Str("node", n.addr).Msg("node not reachable; dialling it again in the background")
		}
		if !b.wait(cl.ctx) {
			return
		}
	}
}

// list is the nodes now.
func (cl *Cluster) list() []*clusterNode { return *cl.nodes.Load() }

// discover adds the nodes a connected node names (ClusterOptions.Discover)
// until the Cluster closes.
func (cl *Cluster) discover() {
	every := cl.o.Client.withDefaults().DiscoverEvery
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		for _, n := range cl.list() {
			c := n.c.Load()
			if c == nil || !c.connected() {
				continue
			}
			ctx, cancel := context.WithTimeout(cl.ctx, cl.o.AttemptTimeout)
			info, err := c.Cluster(ctx)
			cancel()
			if err != nil {
				cl.log.Debug().Err(err).Str("node", n.addr).Msg("cluster not discovered")
				continue
			}
			for _, a := range info.Addrs() {
				cl.add(a)
			}
			break
		}
		select {
		case <-t.C:
		case <-cl.ctx.Done():
			return
		}
	}
}

// add makes a node for addr unless there is one, and dials it.
func (cl *Cluster) add(addr string) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		return
	}
	old := cl.list()
	if slices.ContainsFunc(old, func(n *clusterNode) bool { return n.addr == addr }) {
		return
	}
	n := &clusterNode{addr: addr, br: newBreaker(cl.o.Breaker, time.Now)}
	nodes := append(slices.Clone(old), n)
	cl.nodes.Store(&nodes)
	cl.log.Info().Str("node", addr).Msg("node discovered")
	cl.wg.Go(func() { cl.dialNode(cl.ctx, n, make(chan error, 1)) })
}

// Close closes every node's connection and stops the dialling; async
// sends not yet answered fail with ErrClosed.
func (cl *Cluster) Close() error {
	cl.mu.Lock()
	cl.closed = true
	cl.mu.Unlock()
	cl.cancel()
	cl.wg.Wait()
	var errs []error
	for _, n := range cl.list() {
		if c := n.c.Swap(nil); c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// Nodes reports each node's breaker and counts, in the order of Addrs.
func (cl *Cluster) Nodes() []NodeStatus {
	nodes := cl.list()
	out := make([]NodeStatus, len(nodes))
	for i, n := range nodes {
		st, calls, fails := n.br.snapshot()
		c := n.c.Load()
		out[i] = NodeStatus{Addr: n.addr, Connected: c != nil && c.connected(), State: st, WindowCalls: calls, WindowFailures: fails,
			Sent: n.sent.Load(), Failed: n.fail.Load()}
		for st := range out[i].Changes {
			out[i].Changes[st] = n.changes[st].Load()
		}
	}
	return out
}

// Send stores m on a node and returns once it acknowledged it.
func (cl *Cluster) Send(ctx context.Context, m *core.Message) (core.SendResult, error) {
	res, err := cl.SendBatch(ctx, []*core.Message{m})
	if err != nil {
		return core.SendResult{}, err
	}
	return res[0], nil
}

// SendBatch stores msgs on one node, as one request (at most
// wire.MaxBatch); the first message's sharding key picks the node.
func (cl *Cluster) SendBatch(ctx context.Context, msgs []*core.Message) ([]core.SendResult, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	payload, err := wire.EncodeProduce(msgs)
	if err != nil {
		return nil, err
	}
	t := cl.attempts(msgs[0].ShardingKey)
	for {
		n, probe := t.next()
		if n == nil {
			return nil, t.err()
		}
		var b []byte
		err := fmt.Errorf("%w: not connected", ErrConnLost) // not yet, or reconnecting: another node now
		if c := n.live(); c != nil {
			actx, cancel := context.WithTimeout(ctx, cl.o.AttemptTimeout)
			b, err = c.call(actx, wire.OpProduce, payload)
			cancel()
			if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%w: no answer within %s: %w", ErrAttemptTimeout, cl.o.AttemptTimeout, err)
			}
		}
		cl.outcome(ctx, n, probe, err)
		if err == nil {
			return decodeSend(b, msgs)
		}
		if ctx.Err() != nil || !nodeFault(err) {
			return nil, err
		}
		t.failed(n, err)
	}
}

// SendAsync sends m without waiting; done is called once with the
// outcome, on a client goroutine (it must not block). Each node's sends
// are its connection's Producer's (coalesced, in call order), so the
// messages of one key keep their order while its node is healthy; a send
// tried again on another node may land after later ones. A try that gets
// no answer within AttemptTimeout is given up (it may still land: at least
// once) and the send tried elsewhere.
func (cl *Cluster) SendAsync(ctx context.Context, m *core.Message, done func(core.SendResult, error)) {
	if _, err := wire.AppendMessage(nil, m); err != nil {
		done(core.SendResult{}, err)
		return
	}
	a := &asyncSend{cl: cl, ctx: ctx, m: m, done: done, t: cl.attempts(m.ShardingKey)}
	a.next()
}

// asyncSend is one SendAsync's tries, made one after another.
type asyncSend struct {
	cl   *Cluster
	ctx  context.Context
	m    *core.Message
	done func(core.SendResult, error)
	t    *attempts
}

// next makes the next try, or ends the send with the errors so far.
func (a *asyncSend) next() {
	cl := a.cl
	if cl.ctx.Err() != nil {
		a.done(core.SendResult{}, ErrClosed)
		return
	}
	n, probe := a.t.next()
	if n == nil {
		a.done(core.SendResult{}, a.t.err())
		return
	}
	var once atomic.Bool
	finish := func(res core.SendResult, err error) { // the try's outcome: the answer or the timer, whichever comes first
		if !once.CompareAndSwap(false, true) {
			return
		}
		if cl.outcome(a.ctx, n, probe, err) || a.ctx.Err() != nil {
			a.done(res, err)
			return
		}
		a.t.failed(n, err)
		// Off the connection's goroutine: a send may wait for room.
		cl.mu.Lock()
		if cl.closed {
			cl.mu.Unlock()
			a.done(core.SendResult{}, ErrClosed)
			return
		}
		cl.wg.Add(1)
		cl.mu.Unlock()
		go func() {
			defer cl.wg.Done()
			a.next()
		}()
	}
	if n.live() == nil {
		finish(core.SendResult{}, fmt.Errorf("%w: not connected", ErrConnLost))
		return
	}
	timer := time.AfterFunc(cl.o.AttemptTimeout, func() {
		finish(core.SendResult{}, fmt.Errorf("%w: no answer within %s", ErrAttemptTimeout, cl.o.AttemptTimeout))
	})
	// The node's producer queues the send; while the node stalls its
	// queue fills, and queuing must not hold the caller past the try.
	qctx, cancel := context.WithTimeout(a.ctx, cl.o.AttemptTimeout)
	n.p.Load().SendAsync(qctx, a.m, func(res core.SendResult, err error) {
		timer.Stop()
		cancel()
		if err != nil && a.ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: not queued within %s: %w", ErrAttemptTimeout, cl.o.AttemptTimeout, err)
		}
		finish(res, err)
	})
}

// attempts is one send's tries: the nodes in the order its key ranks them
// (the list when it began), those tried, the failures so far.
type attempts struct {
	cl    *Cluster
	order []*clusterNode
	tried map[*clusterNode]bool
	made  int
	errs  []error
}

func (cl *Cluster) attempts(key string) *attempts {
	return &attempts{cl: cl, order: cl.rank(key), tried: map[*clusterNode]bool{}}
}

// next picks the node of the next try (pick); nil once Attempts tries
// were made or there is no node.
func (t *attempts) next() (*clusterNode, bool) {
	if t.made >= t.cl.o.Attempts {
		return nil, false
	}
	n, probe := t.cl.pick(t.order, t.tried)
	if n != nil {
		t.tried[n] = true
		t.made++
	}
	return n, probe
}

// failed notes a try that failed for the node's fault.
func (t *attempts) failed(n *clusterNode, err error) {
	t.errs = append(t.errs, fmt.Errorf("%s: %w", n.addr, err))
	if len(t.tried) == len(t.order) {
		clear(t.tried) // every node had a try: the next ones go round again
	}
}

// err is the send's error when no try succeeded.
func (t *attempts) err() error {
	return fmt.Errorf("%w in %d attempts: %w", ErrNoNode, t.made, errors.Join(t.errs...))
}

// outcome counts a try's outcome against n and in its breaker, and
// reports whether the node did its part: it answered, or refused the
// request for the request's own fault. A failed try the caller had given
// up on (ctx ended) counts for nothing.
func (cl *Cluster) outcome(ctx context.Context, n *clusterNode, probe bool, err error) (ok bool) {
	ok = err == nil || !nodeFault(err)
	if !ok && ctx.Err() != nil {
		return ok
	}
	if ok {
		n.sent.Add(1)
	} else {
		n.fail.Add(1)
	}
	cl.changed(n, n.br.record(ok, probe))
	return ok
}

// ErrAttemptTimeout is a try that got no answer within
// ClusterOptions.AttemptTimeout; the request may still take effect.
var ErrAttemptTimeout = errors.New("client: attempt timed out")

// nodeFault reports whether err is the node's rather than the request's:
// another node may take the request.
func nodeFault(err error) bool {
	var we *wire.Error
	if errors.As(err, &we) {
		switch we.Code {
		case wire.CodeStoreFailed, wire.CodeShuttingDown, wire.CodeOverloaded, wire.CodeTimeout, wire.CodeInternal:
			return true
		}
		return false
	}
	return errors.Is(err, ErrConnLost) || errors.Is(err, ErrAttemptTimeout) || errors.Is(err, core.ErrStoreFailed)
}

// rank orders the nodes for key: by rendezvous hash, or from the next in a
// round when there is no key.
func (cl *Cluster) rank(key string) []*clusterNode {
	out := slices.Clone(cl.list())
	if key == "" {
		start := int(cl.rr.Add(1) % uint64(len(out)))
		return append(out[start:], out[:start]...)
	}
	score := func(n *clusterNode) uint64 { return rendezvous.Score(n.addr, key) }
	slices.SortFunc(out, func(a, b *clusterNode) int {
		sa, sb := score(a), score(b)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return 0
	})
	return out
}

// pick returns the first node in order not yet tried whose breaker lets a
// call through; if none does, the first untried node all the same (a send
// with every breaker open still gets its attempts: better a try on an
// isolated node than no try). probe is the breaker's answer.
func (cl *Cluster) pick(order []*clusterNode, tried map[*clusterNode]bool) (*clusterNode, bool) {
	var fallback *clusterNode
	for _, n := range order {
		if tried[n] {
			continue
		}
		ok, probe, tr := n.br.allow()
		cl.changed(n, tr)
		if ok {
			return n, probe
		}
		if fallback == nil {
			fallback = n
		}
	}
	return fallback, false
}

// changed logs and reports a breaker's transition.
func (cl *Cluster) changed(n *clusterNode, tr *transition) {
	if tr == nil {
		return
	}
	n.changes[tr.to].Add(1)
	st, calls, fails := n.br.snapshot()
	ev := cl.log.Info()
	if tr.to == BreakerOpen {
		ev = cl.log.Warn()
	}
	ev.Str("node", n.addr).Str("from", tr.from.String()).Str("to", st.String()).Int("window_calls", calls).
		Int("window_failures", fails).Msg("node breaker changed")
	if cl.o.OnStateChange != nil {
		cl.o.OnStateChange(n.addr, tr.from, tr.to)
	}
}
