package rpc

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/gateway/cluster"
)

// Headers of the messages between nodes (see the package doc).
const (
	hdrVersion = "Fmq-Rpc-V"
	hdrID      = "Fmq-Rpc-Id"
	hdrClient  = "Fmq-Rpc-Client"
	hdrTimeout = "Fmq-Rpc-Timeout"
	hdrState   = "Fmq-Rpc-State"
	hdrNode    = "Fmq-Rpc-Node"
	version    = "1"
)

// States a node replies with.
const (
	stateHere    = "here"
	stateAbsent  = "absent"
	stateAnswer  = "answer"
	stateTimeout = "timeout"
	stateError   = "error"
)

// relayGrace is how long past a call's deadline the calling node waits
// for the serving node's "timeout" before it decides so itself.
const relayGrace = time.Second

// ask is a call this node asked the other nodes about.
type ask struct {
	client string
	peers  int // other live nodes; -1 unknown
	absent int
	here   bool
	end    time.Time
	timer  *time.Timer
	done   func(result)
}

func (s *Service) callSubject() string { return s.opts.Prefix + ".call" }
func (s *Service) replySubject() string {
	return s.opts.Prefix + ".reply." + cluster.Token(s.opts.Node)
}

// Start subscribes to the calls of the other nodes and to the replies to
// this node's; nothing to do without Options.Conn.
func (s *Service) Start() error {
	nc := s.opts.Conn
	if nc == nil {
		return nil
	}
	calls, err := nc.Subscribe(s.callSubject(), s.serveCall)
	if err != nil {
		return fmt.Errorf("rpc: subscribe to calls: %w", err)
	}
	replies, err := nc.Subscribe(s.replySubject(), s.takeReply)
	if err != nil {
		_ = calls.Unsubscribe()
		return fmt.Errorf("rpc: subscribe to replies: %w", err)
	}
	// Both in place before a call is asked: a flush makes the server
	// know them.
	if err := nc.Flush(); err != nil {
		_ = calls.Unsubscribe()
		_ = replies.Unsubscribe()
		return fmt.Errorf("rpc: subscribe: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = calls.Unsubscribe()
		_ = replies.Unsubscribe()
		return ErrClosed
	}
	s.subs = append(s.subs, calls, replies)
	return nil
}

// ask asks the other nodes for the device and registers the call until
// done is called: with the answer, ErrNotConnected when no node has it,
// ErrTimeout.
func (s *Service) ask(ctx context.Context, id core.MessageID, clientID string, payload []byte, deadline time.Time, done func(result)) error {
	peers := -1
	if s.opts.Peers != nil {
		if n, err := s.opts.Peers(ctx); err == nil {
			peers = n
		} else {
			s.log.Debug().Err(err).Msg("live nodes unknown: waiting the ask window")
		}
	}
	if peers == 0 {
		return ErrNotConnected // no other node
	}
	a := &ask{client: clientID, peers: peers, end: deadline.Add(relayGrace), done: done}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.asks[id] = a
	a.timer = time.AfterFunc(min(s.opts.AskWindow, time.Until(a.end)), func() { s.askTimer(id) })
	s.mu.Unlock()
	m := nats.NewMsg(s.callSubject())
	m.Reply = s.replySubject()
	m.Header.Set(hdrVersion, version)
	m.Header.Set(hdrID, id.String())
	m.Header.Set(hdrClient, url.QueryEscape(clientID))
	m.Header.Set(hdrTimeout, strconv.FormatInt(time.Until(deadline).Milliseconds(), 10))
	m.Header.Set(hdrNode, url.QueryEscape(s.opts.Node))
	m.Data = payload
	if err := s.opts.Conn.PublishMsg(m); err != nil {
		if s.takeAsk(id) != nil {
			return fmt.Errorf("rpc: ask the other nodes: %w", err)
		}
	}
	return nil
}

// askTimer decides an ask whose window or deadline passed.
func (s *Service) askTimer(id core.MessageID) {
	s.mu.Lock()
	a := s.asks[id]
	if a == nil {
		s.mu.Unlock()
		return
	}
	if a.here && time.Now().Before(a.end) {
		a.timer.Reset(time.Until(a.end)) // woken for the window, but a node has the device
		s.mu.Unlock()
		return
	}
	delete(s.asks, id)
	s.mu.Unlock()
	if a.here {
		a.done(result{err: fmt.Errorf("%w: %q (no word from its node)", ErrTimeout, a.client)})
		return
	}
	a.done(result{err: fmt.Errorf("%w: %q", ErrNotConnected, a.client)})
}

// takeAsk removes and returns ask id, its timer stopped; nil if it ended.
func (s *Service) takeAsk(id core.MessageID) *ask {
	s.mu.Lock()
	a := s.asks[id]
	delete(s.asks, id)
	s.mu.Unlock()
	if a != nil && a.timer != nil {
		a.timer.Stop()
	}
	return a
}

// reply is a decoded reply of another node.
type reply struct {
	id    core.MessageID
	state string
	node  string
	data  []byte
}

// decodeReply decodes another node's reply to an ask.
func decodeReply(m *nats.Msg) (reply, error) {
	if v := m.Header.Get(hdrVersion); v != version {
		return reply{}, fmt.Errorf("%w: reply of version %q", errMalformed, v)
	}
	id, err := core.ParseMessageID(m.Header.Get(hdrID))
	if err != nil {
		return reply{}, fmt.Errorf("%w: reply: %w", errMalformed, err)
	}
	node, err := url.QueryUnescape(m.Header.Get(hdrNode))
	if err != nil {
		return reply{}, fmt.Errorf("%w: reply's node: %w", errMalformed, err)
	}
	r := reply{id: id, state: m.Header.Get(hdrState), node: node, data: m.Data}
	switch r.state {
	case stateHere, stateAbsent, stateAnswer, stateTimeout, stateError:
		return r, nil
	}
	return reply{}, fmt.Errorf("%w: reply state %q", errMalformed, r.state)
}

// takeReply handles another node's reply to one of this node's asks.
func (s *Service) takeReply(m *nats.Msg) {
	r, err := decodeReply(m)
	if err != nil {
		s.m.malformed.Inc()
		s.log.Debug().Err(err).Msg("reply from another node dropped")
		return
	}
	id := r.id
	switch r.state {
	case stateHere:
		s.mu.Lock()
		if a := s.asks[id]; a != nil && !a.here {
			a.here = true
			a.timer.Reset(time.Until(a.end))
		}
		s.mu.Unlock()
	case stateAbsent:
		s.mu.Lock()
		a := s.asks[id]
		if a == nil || a.here {
			s.mu.Unlock()
			return
		}
		a.absent++
		if a.peers < 0 || a.absent < a.peers {
			s.mu.Unlock()
			return
		}
		delete(s.asks, id)
		s.mu.Unlock()
		a.timer.Stop()
		a.done(result{err: fmt.Errorf("%w: %q", ErrNotConnected, a.client)})
	case stateAnswer:
		if a := s.takeAsk(id); a != nil {
			a.done(result{payload: r.data, node: r.node})
		}
	case stateTimeout:
		if a := s.takeAsk(id); a != nil {
			a.done(result{err: fmt.Errorf("%w: %q", ErrTimeout, a.client)})
		}
	case stateError:
		if a := s.takeAsk(id); a != nil {
			a.done(result{err: fmt.Errorf("rpc: call to %q failed on node %s: %s", a.client, r.node, r.data)})
		}
	}
}

// callMsg is a decoded ask of another node.
type callMsg struct {
	id      core.MessageID
	client  string
	caller  string
	timeout time.Duration
	payload []byte
}

// decodeCall decodes another node's ask; maxPayload bounds its payload.
func decodeCall(m *nats.Msg, maxPayload int) (callMsg, error) {
	if v := m.Header.Get(hdrVersion); v != version {
		return callMsg{}, fmt.Errorf("%w: call of version %q", errMalformed, v)
	}
	if m.Reply == "" {
		return callMsg{}, fmt.Errorf("%w: call without a reply subject", errMalformed)
	}
	id, err := core.ParseMessageID(m.Header.Get(hdrID))
	if err != nil {
		return callMsg{}, fmt.Errorf("%w: call: %w", errMalformed, err)
	}
	c := callMsg{id: id, payload: m.Data}
	if c.caller, err = url.QueryUnescape(m.Header.Get(hdrNode)); err != nil {
		return callMsg{}, fmt.Errorf("%w: call's node: %w", errMalformed, err)
	}
	if c.client, err = url.QueryUnescape(m.Header.Get(hdrClient)); err != nil {
		return callMsg{}, fmt.Errorf("%w: call's client: %w", errMalformed, err)
	}
	if err := checkClient(c.client); err != nil {
		return callMsg{}, fmt.Errorf("%w: %w", errMalformed, err)
	}
	ms, err := strconv.ParseInt(m.Header.Get(hdrTimeout), 10, 64)
	if err != nil || ms < 0 {
		return callMsg{}, fmt.Errorf("%w: call's timeout %q", errMalformed, m.Header.Get(hdrTimeout))
	}
	c.timeout = time.Duration(min(ms, MaxTimeout.Milliseconds())) * time.Millisecond
	if len(m.Data) > maxPayload {
		return callMsg{}, fmt.Errorf("%w: call's payload of %d bytes is over %d", errMalformed, len(m.Data), maxPayload)
	}
	return c, nil
}

// serveCall handles another node's ask: the device is here (the request
// is delivered and the answer relayed) or absent.
func (s *Service) serveCall(m *nats.Msg) {
	c, err := decodeCall(m, s.opts.MaxPayload)
	if err != nil {
		s.m.malformed.Inc()
		s.log.Debug().Err(err).Msg("call from another node dropped")
		if m.Reply != "" {
			if id, err := core.ParseMessageID(m.Header.Get(hdrID)); err == nil {
				s.reply(m.Reply, id, stateError, []byte("malformed call"))
			}
		}
		return
	}
	if c.caller == s.opts.Node {
		return // this node's own ask: it looked here first
	}
	id := c.id
	err = s.deliver(id, c.client, c.payload, time.Now().Add(c.timeout), func(r result) {
		switch {
		case r.err == nil && len(r.payload) > s.opts.MaxPayload:
			s.reply(m.Reply, id, stateError, []byte(fmt.Sprintf("the answer of %d bytes is over the limit between nodes, %d", len(r.payload), s.opts.MaxPayload)))
		case r.err == nil:
			s.reply(m.Reply, id, stateAnswer, r.payload)
		case errors.Is(r.err, ErrTimeout):
			s.reply(m.Reply, id, stateTimeout, nil)
		default:
			s.reply(m.Reply, id, stateError, []byte(r.err.Error()))
		}
	})
	if err != nil {
		s.m.served.WithLabelValues(stateAbsent).Inc()
		s.reply(m.Reply, id, stateAbsent, nil)
		return
	}
	s.m.served.WithLabelValues(stateHere).Inc()
	s.reply(m.Reply, id, stateHere, nil)
}

// reply sends a state of call id to the calling node.
func (s *Service) reply(subject string, id core.MessageID, state string, data []byte) {
	m := nats.NewMsg(subject)
	m.Header.Set(hdrVersion, version)
	m.Header.Set(hdrID, id.String())
	m.Header.Set(hdrState, state)
	m.Header.Set(hdrNode, url.QueryEscape(s.opts.Node))
	m.Data = data
	if err := s.opts.Conn.PublishMsg(m); err != nil {
		s.log.Debug().Err(err).Str("state", state).Msg("reply to a call of another node lost")
	}
}
