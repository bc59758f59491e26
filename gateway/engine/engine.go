package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/gateway/eventloop"
	"github.com/ferrymq/ferrymq/gateway/topictree"
	"github.com/ferrymq/ferrymq/gateway/wheel"
)

// Log field names.
const (
	logClient   = "client"
	logRemote   = "remote"
	logListener = "listener"
)

// timed is what the engine's wheel holds: connections and offline sessions.
type timed interface{ tick(added, now int64) int64 }

// Engine is ferrymq's MQTT server: listeners on an event loop, connections
// handled in turns on a bounded pool, sessions, subscriptions, retained
// messages and wills, and the hooks. See the package doc.
type Engine struct {
	opts     Options
	log      zerolog.Logger
	idPrefix string

	loop  *eventloop.Loop // from Start
	pool  *pool
	wheel *wheel.Wheel[timed]
	lns   []*listener

	subs     topictree.Tree[*session]
	retained retainedTree

	mu       sync.Mutex // guards sessions
	sessions map[string]*session

	conns connTable

	m metrics

	// lastQoS2ID is the last Message.QoS2ID given (nextQoS2ID).
	lastQoS2ID atomic.Int64

	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started atomic.Bool
	closing atomic.Bool
	once    sync.Once
}

// New builds an engine and binds its listeners; nothing is served until
// Start.
func New(o Options) (*Engine, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	e := &Engine{
		opts:     o,
		log:      o.Logger.With().Str("component", "mqtt").Logger(),
		idPrefix: hex.EncodeToString(b[:]),
		sessions: map[string]*session{},
	}
	e.conns.init()
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.pool = newPool(o.Workers, func(r any) {
		e.m.panics.Add(1)
		e.log.Error().Str("panic", fmt.Sprint(r)).Msg("recovered panic in engine work")
	})
	e.wheel = wheel.New[timed](250*time.Millisecond, 16384, time.Now())
	for i := range o.Listeners {
		l, err := e.listen(&o.Listeners[i])
		if err != nil {
			for _, l := range e.lns {
				_ = l.ln.Close()
			}
			return nil, err
		}
		e.lns = append(e.lns, l)
	}
	return e, nil
}

// Start restores stored sessions, then serves the listeners.
func (e *Engine) Start() error {
	if !e.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	if st := e.opts.Hooks.Sessions; st != nil {
		if err := e.restore(st); err != nil {
			return fmt.Errorf("engine: restore sessions: %w", err)
		}
	}
	loop, err := eventloop.New(e.opts.Pollers, loopEvents{e})
	if err != nil {
		return fmt.Errorf("engine: start event loop: %w", err)
	}
	e.loop = loop
	e.wg.Go(e.tickLoop)
	for _, l := range e.lns {
		e.wg.Go(func() { l.serve() })
		e.log.Info().Str(logListener, l.cfg.Name).Str("addr", l.ln.Addr().String()).Msg("mqtt listening")
	}
	return nil
}

// Addr returns the bound address of the named listener, or nil.
func (e *Engine) Addr(name string) net.Addr {
	for _, l := range e.lns {
		if l.cfg.Name == name {
			return l.ln.Addr()
		}
	}
	return nil
}

// tickLoop advances the timing wheel: keepalives, connect and write
// timeouts, lingering closes, session expiry and delayed wills.
func (e *Engine) tickLoop() {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case now := <-t.C:
			e.wheel.Advance(now, func(it timed, added, now int64) int64 { return it.tick(added, now) })
		}
	}
}

// Shutdown stops accepting, ends every connection (MQTT 5: DISCONNECT
// 0x8B; wills are published as for any connection the server closes
// [MQTT-3.1.2-8]), waits for the work those started, and stops. It
// returns ctx's error if that takes too long.
func (e *Engine) Shutdown(ctx context.Context) error {
	var err error
	e.once.Do(func() {
		e.closing.Store(true)
		for _, l := range e.lns {
			_ = l.ln.Close()
		}
		if !e.started.Load() {
			e.cancel()
			return
		}
		e.conns.each(func(c *conn) { c.kill(ServerShuttingDown, reasonShutdown, nil) })
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
	wait:
		for e.connCount() > 0 {
			select {
			case <-ctx.Done():
				err = fmt.Errorf("engine shutdown: %w", ctx.Err())
				e.forceCloseAll()
				break wait
			case <-tick.C:
			}
		}
		e.cancel()
		e.wg.Wait()
		e.pool.close()
		if e.loop != nil {
			_ = e.loop.Close()
		}
	})
	return err
}

// loopEvents is the engine as the event loop's Handler.
type loopEvents struct{ e *Engine }

func (h loopEvents) Readable(s *eventloop.Socket) {
	if c := h.e.conns.get(s); c != nil {
		c.onReadable()
	}
}

func (h loopEvents) Written(s *eventloop.Socket, n int) {
	if c := h.e.conns.get(s); c != nil {
		c.noteWritten(n)
	}
}

func (h loopEvents) Failed(s *eventloop.Socket, err error) {
	if c := h.e.conns.get(s); c != nil {
		c.transportClosed(err)
	}
}

func (e *Engine) connCount() int { return int(e.conns.n.Load()) }

func (e *Engine) forceCloseAll() {
	e.conns.each(func(c *conn) {
		e.conns.remove(c)
		c.t.close()
	})
}

// removeConn forgets c once it is closed for good (after any lingering).
func (e *Engine) removeConn(c *conn) {
	if c.lingering.Load() {
		return // lingerDone removes it
	}
	e.conns.remove(c)
}

// connTable finds a connection by its socket: one slot per file
// descriptor, so an idle connection costs the table 8 bytes instead of a
// map entry. Slots are atomic: the poller that looks a connection up sees
// it fully built. A connection leaves the table before its socket closes,
// so a descriptor's number is never a new socket's while an old
// connection still holds its slot.
type connTable struct {
	slots []atomic.Pointer[conn]
	n     atomic.Int64
}

func (t *connTable) init() {
	t.slots = make([]atomic.Pointer[conn], eventloop.MaxFDs())
}

func (t *connTable) add(c *conn) bool {
	fd := c.sock.Fd()
	if fd < 0 || fd >= len(t.slots) || !t.slots[fd].CompareAndSwap(nil, c) {
		return false
	}
	t.n.Add(1)
	return true
}

func (t *connTable) get(s *eventloop.Socket) *conn {
	fd := s.Fd()
	if fd >= 0 && fd < len(t.slots) {
		if c := t.slots[fd].Load(); c != nil && c.sock == s {
			return c
		}
	}
	return nil
}

func (t *connTable) remove(c *conn) {
	fd := c.sock.Fd()
	if fd >= 0 && fd < len(t.slots) && t.slots[fd].CompareAndSwap(c, nil) {
		t.n.Add(-1)
	}
}

func (t *connTable) each(fn func(*conn)) {
	for i := range t.slots {
		if c := t.slots[i].Load(); c != nil {
			fn(c)
		}
	}
}

// watchSession puts an offline session in the wheel (its lock is held).
func (e *Engine) watchSession(s *session) {
	if s.offline == 0 {
		return
	}
	at := s.nextDeadlineLocked()
	if s.wheelAt != 0 && s.wheelAt <= at {
		return
	}
	s.wheelAt = at
	e.wheel.Add(s, at)
}

// Publish publishes a message from the server (the bridge's downlink, the
// router's deliveries): retained if asked, then delivered to every
// matching subscription. fromRouter keeps it from being routed back.
func (e *Engine) Publish(m *Message, fromRouter bool) error {
	if e.closing.Load() {
		return ErrClosed
	}
	if err := validTopicName(m.Topic); err != nil {
		return fmt.Errorf("engine: publish to %q: %w", m.Topic, err)
	}
	if m.Created == 0 {
		m.Created = time.Now().UnixNano()
	}
	e.publish(m, fromRouter)
	return nil
}

// PublishRouted delivers a message another node published: to the local
// subscriptions, except members of the shared groups that node served
// (skip, "group/filter"); retained here only if retain (a node whose
// session store shares retained messages does not retain it again). It is
// not routed back.
func (e *Engine) PublishRouted(m *Message, skip []string, retain bool) error {
	if e.closing.Load() {
		return ErrClosed
	}
	if m.Created == 0 {
		m.Created = time.Now().UnixNano()
	}
	if m.Retain && retain {
		e.retain(m)
	}
	e.distribute(m, true, skip)
	return nil
}

// Send delivers m to one client (point-to-point), whether or not it
// subscribed: at once if it is connected, queued in its session if it is
// offline (QoS 1/2), ErrNoSession if this engine has no session of that
// ID. Delivery outcomes of a message with a Ref go to the Delivery hook.
func (e *Engine) Send(clientID string, m *Message) error {
	if e.closing.Load() {
		return ErrClosed
	}
	e.mu.Lock()
	s := e.sessions[clientID]
	e.mu.Unlock()
	if s == nil {
		return ErrNoSession
	}
	if m.Created == 0 {
		m.Created = time.Now().UnixNano()
	}
	if m.QoS == 0 && !s.online.Load() {
		return ErrNotConnected
	}
	e.deliver(s, m, m.QoS, m.Retain, nil)
	return nil
}

// Connected reports whether clientID has a connection here.
func (e *Engine) Connected(clientID string) bool {
	e.mu.Lock()
	s := e.sessions[clientID]
	e.mu.Unlock()
	return s != nil && s.online.Load()
}

// HasSession reports whether clientID has a session here, online or
// offline.
func (e *Engine) HasSession(clientID string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sessions[clientID] != nil
}

// Window returns how many QoS 1/2 messages clientID has in flight and
// queued, and its window (the client's Receive Maximum, bounded).
func (e *Engine) Window(clientID string) (inflight, queued, window int, ok bool) {
	e.mu.Lock()
	s := e.sessions[clientID]
	e.mu.Unlock()
	if s == nil {
		return 0, 0, 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inflight), len(s.queue), s.windowLocked(e), true
}

// Disconnect ends clientID's connection with code (MQTT 5 clients get it
// in a DISCONNECT); the session stays as its expiry says.
func (e *Engine) Disconnect(clientID string, code ReasonCode, why string) error {
	e.mu.Lock()
	s := e.sessions[clientID]
	e.mu.Unlock()
	if s == nil {
		return ErrNotConnected
	}
	s.mu.Lock()
	c := s.conn
	s.mu.Unlock()
	if c == nil {
		return ErrNotConnected
	}
	c.kill(code, reasonKicked, fmt.Errorf("%s", why))
	return nil
}

// DeleteSession ends clientID's session: its connection (if any) is
// closed with DISCONNECT 0x98 and no will, and what was queued for it is
// discarded (dropped counts it; the Delivery hook hears of each).
func (e *Engine) DeleteSession(clientID string) (dropped int, ok bool) {
	e.mu.Lock()
	s := e.sessions[clientID]
	if s == nil {
		e.mu.Unlock()
		return 0, false
	}
	s.mu.Lock()
	dropped = len(s.inflight) + len(s.queue)
	c := s.conn
	s.conn = nil
	if s.online.Swap(false) {
		e.routeOnlineLocked(s, false)
	}
	e.endLocked(s, "the session was deleted")
	if !s.persistent() {
		e.storeDelete(s)
	}
	delete(e.sessions, clientID)
	s.mu.Unlock()
	e.mu.Unlock()
	if c != nil {
		c.takenOver.Store(true) // no will, no second end of the session
		c.kill(AdministrativeAction, reasonKicked, fmt.Errorf("session deleted"))
	}
	return dropped, true
}

// ClientInfo describes one session for the admin API.
type ClientInfo struct {
	ID            string
	Username      string
	Protocol      byte
	Connected     bool
	Listener      string
	Remote        string
	Since         time.Time // connected at, or offline since
	Keepalive     uint16
	Clean         bool
	SessionExpiry uint32
	Subscriptions []StoredSubscription
	Inflight      int
	Queued        int
	QueuedBytes   int
	// Expires is when an offline session ends (its expiry), zero while
	// connected.
	Expires time.Time
}

// Clients lists the sessions (online and offline), in no order.
func (e *Engine) Clients() []ClientInfo {
	e.mu.Lock()
	list := make([]*session, 0, len(e.sessions))
	for _, s := range e.sessions {
		list = append(list, s)
	}
	e.mu.Unlock()
	out := make([]ClientInfo, 0, len(list))
	for _, s := range list {
		out = append(out, s.info())
	}
	return out
}

// Client returns one session's description.
func (e *Engine) Client(clientID string) (ClientInfo, bool) {
	e.mu.Lock()
	s := e.sessions[clientID]
	e.mu.Unlock()
	if s == nil {
		return ClientInfo{}, false
	}
	return s.info(), true
}

func (s *session) info() ClientInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	ci := ClientInfo{ID: s.id, Username: s.username, Protocol: s.protocol, SessionExpiry: s.expiry,
		Inflight: len(s.inflight), Queued: len(s.queue), QueuedBytes: s.queueBytes}
	if c := s.conn; c != nil && c.client != nil {
		ci.Connected, ci.Listener, ci.Remote = true, c.client.listener, c.client.remote
		ci.Since, ci.Keepalive, ci.Clean = time.Unix(0, c.client.since), c.client.keepalive, c.client.clean
	} else if s.offline > 0 {
		ci.Since = time.Unix(0, s.offline)
		ci.Expires = time.Unix(0, s.offline+int64(s.expiry)*int64(time.Second))
	}
	for _, sub := range s.subs {
		ci.Subscriptions = append(ci.Subscriptions, StoredSubscription{Filter: sub.filter, Options: sub.o})
	}
	return ci
}

// Retained returns the retained messages whose topic matches filter.
func (e *Engine) Retained(filter string) []*Message {
	var out []*Message
	if filter == "" {
		e.retained.each(func(m *Message) { out = append(out, m) })
		return out
	}
	e.retained.match(filter, func(m *Message) { out = append(out, m) })
	return out
}

// RetainedMessage returns the retained message of topic.
func (e *Engine) RetainedMessage(topic string) (*Message, bool) {
	m := e.retained.get(topic)
	return m, m != nil
}

// ClearRetained deletes the retained message of topic without publishing
// anything (a deletion shared by another node's store); it reports whether
// there was one. To clear it as a client does — current subscribers get
// the empty publish — Publish an empty retained message.
func (e *Engine) ClearRetained(topic string) bool {
	if !e.retained.set(&Message{Topic: topic}) {
		return false
	}
	e.storeRetained(&Message{Topic: topic})
	return true
}

// SetRetained stores m as retained without delivering it (a retained
// message shared by another node's store).
func (e *Engine) SetRetained(m *Message) { e.retained.set(m) }

// Subscribers counts the subscriptions matching topic (diagnostics).
func (e *Engine) Subscribers(topic string) int {
	ms := matchSet{}
	e.subs.Match(topic, &ms)
	return len(ms.list)
}

// Stats are the engine's figures.
type Stats struct {
	Connected int64 // clients past CONNACK
	// Sockets are the connections open: connected, connecting, and those
	// closing (lingering until their client has read the last packet).
	Sockets       int64
	Sessions      int
	Subscriptions int
	Retained      int
	Goroutines    int // the pool's
	Counters      map[string]uint64
}

// Held counts the outbound QoS 1/2 messages of every session: in flight
// (sent, awaiting the client's ack) and queued behind them (or for an
// offline session). It visits each session (for a metrics scrape, not a
// hot path).
func (e *Engine) Held() (inflight, queued int) {
	e.mu.Lock()
	list := make([]*session, 0, len(e.sessions))
	for _, s := range e.sessions {
		list = append(list, s)
	}
	e.mu.Unlock()
	for _, s := range list {
		s.mu.Lock()
		inflight += len(s.inflight)
		queued += len(s.queue)
		s.mu.Unlock()
	}
	return inflight, queued
}

// Stats returns the current figures.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	n := len(e.sessions)
	e.mu.Unlock()
	e.retained.mu.RLock()
	r := e.retained.count
	e.retained.mu.RUnlock()
	return Stats{Connected: e.m.connected.Load(), Sockets: int64(e.connCount()), Sessions: n, Subscriptions: e.subs.Len(), Retained: r,
		Goroutines: e.pool.goroutines(), Counters: e.m.snapshot()}
}
