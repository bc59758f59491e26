package bridge

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Presence event names; also the message tag, so consumers can filter.
const (
	EventConnected    = "connected"
	EventDisconnected = "disconnected"
	EventTakeover     = "takeover"
)

// Event is the JSON body of a presence message on the events topic. The
// message key is the client ID, so one client's events share a queue and
// are read in the order they happened. Seq grows strictly for every event a
// node emits, across restarts (it starts from the boot time in
// microseconds): for one client, a larger Seq is a later event even when
// two nodes' events are compared by time.
type Event struct {
	Event     string    `json:"event"`
	ClientID  string    `json:"clientid"`
	Username  string    `json:"username,omitempty"`
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"ts"`
	Node      string    `json:"node,omitempty"`
	Remote    string    `json:"remote,omitempty"`
	Listener  string    `json:"listener,omitempty"`
	Proto     byte      `json:"proto,omitempty"`      // 3 = 3.1, 4 = 3.1.1, 5 = 5.0
	Clean     bool      `json:"clean,omitempty"`      // clean session / clean start
	Keepalive uint16    `json:"keepalive,omitempty"`  // seconds, as granted
	Reason    string    `json:"reason,omitempty"`     // disconnected: why (see below)
	Error     string    `json:"error,omitempty"`      // disconnected: the error, if any
	OldRemote string    `json:"old_remote,omitempty"` // takeover: the connection replaced
}

// Disconnect reasons.
const (
	ReasonNormal     = "normal"            // the client sent DISCONNECT
	ReasonKeepalive  = "keepalive_timeout" // nothing heard within 1.5 × keepalive
	ReasonLost       = "connection_lost"   // the socket closed or broke
	ReasonShutdown   = "server_shutdown"   // the gateway is stopping
	ReasonProtocol   = "protocol_error"    // the client broke the protocol
	ReasonKicked     = "kicked"            // disconnected by the server for another reason
	ReasonMalformed  = "malformed_packet"  // a packet could not be decoded
	ReasonTakenOver  = "taken_over"        // not emitted: the takeover event says it
	ReasonCoreRefuse = "core_refused"      // an MQTT 3 client's publish was refused by the core
	ReasonTimeout    = "connect_timeout"   // no CONNECT in time
	ReasonRefused    = "refused"           // CONNACK refused it (never connected: no event)
)

// Connected implements engine.Presence. It runs before the CONNACK is
// written, so the takeover event (a live connection with this client ID is
// replaced) and the connected event are stored before anything the client
// can do after its CONNACK — including being taken over itself. Commands
// held for the client go out after its CONNACK.
func (h *Hook) Connected(c *engine.Client, present bool, replaced *engine.Client) {
	h.interceptorsPresence(func(p engine.Presence) { p.Connected(c, present, replaced) })
	traced := false
	if all, topics := h.opts.Trace.Traced(); all || len(topics) > 0 {
		traced = true
		h.conns.Store(c, connSession{at: time.Now()})
	}
	if !h.opts.DisableDownlink {
		h.releaseHeld(c.ID())
	}
	if h.opts.DisableEvents {
		return
	}
	if replaced != nil {
		h.emit(&Event{Event: EventTakeover, ClientID: c.ID(), Username: c.Username(),
			Remote: c.Remote(), Listener: c.Listener(), OldRemote: replaced.Remote()})
	}
	seq := h.emit(&Event{Event: EventConnected, ClientID: c.ID(), Username: c.Username(),
		Remote: c.Remote(), Listener: c.Listener(), Proto: c.Protocol(), Clean: c.Clean(), Keepalive: c.Keepalive()})
	if traced {
		h.conns.Store(c, connSession{at: time.Now(), seq: seq})
	}
}

// Disconnected implements engine.Presence: the disconnected event, unless
// the connection was taken over (the new connection's takeover event says
// it). reason is the engine's: the Reason… names below.
func (h *Hook) Disconnected(c *engine.Client, reason string, cause error, takenOver bool) {
	h.interceptorsPresence(func(p engine.Presence) { p.Disconnected(c, reason, cause, takenOver) })
	h.conns.Delete(c)
	h.wake(c.ID())
	if takenOver || h.opts.DisableEvents {
		return
	}
	e := &Event{Event: EventDisconnected, ClientID: c.ID(), Username: c.Username(), Remote: c.Remote(), Listener: c.Listener(),
		Reason: reason}
	if reason != ReasonNormal && cause != nil {
		e.Error = cause.Error()
	}
	h.emit(e)
}

// emit stamps an event and queues it for storing.
func (h *Hook) emit(e *Event) uint64 {
	e.Seq = h.seq.Add(1)
	e.Time = time.Now().UTC()
	e.Node = h.opts.Node
	h.enqueue(&core.Message{Topic: h.opts.EventsTopic, ShardingKey: e.ClientID, Tag: e.Event,
		Body: e.appendJSON(make([]byte, 0, e.jsonSizeHint()))})
	return e.Seq
}

// enqueue hands a presence event or receipt to the notices goroutine, which
// stores them in batches: one append per batch instead of one per message
// keeps a connect storm from turning into a storm of commit-log cycles
// (each an fsync under --flush sync). Order is kept: one channel, one
// goroutine, appended in call order.
func (h *Hook) enqueue(m *core.Message) {
	h.evMu.RLock()
	if h.evClosed { // after shutdown (a connection cleaned up late): store it alone
		h.evMu.RUnlock()
		h.storeNotices([]*core.Message{m})
		return
	}
	h.evOnce.Do(h.startNotices)
	h.evCh <- m // blocks when the core falls behind: backpressure
	h.evMu.RUnlock()
}

func (h *Hook) startNotices() {
	h.evDone = make(chan struct{})
	go func() {
		defer close(h.evDone)
		for m := range h.evCh {
			batch := []*core.Message{m}
		more:
			for len(batch) < maxNoticeBatch {
				select {
				case m, ok := <-h.evCh:
					if !ok {
						break more
					}
					batch = append(batch, m)
				default:
					break more
				}
			}
			h.storeNotices(batch)
		}
	}()
}

// stopNotices stores what is queued and ends the notices goroutine; safe
// to call twice.
func (h *Hook) stopNotices() {
	h.evMu.Lock()
	if h.evClosed {
		h.evMu.Unlock()
		return
	}
	h.evClosed = true
	h.evOnce.Do(func() {}) // never start it now
	close(h.evCh)
	h.evMu.Unlock()
	if h.evDone != nil {
		<-h.evDone
	}
}

const maxNoticeBatch = 256

// PresenceFailures counts the presence events the core refused: lost
// (ferrymq_presence_event_failures_total; the presence_dropping alarm).
func (h *Hook) PresenceFailures() int64 { return h.presenceFailed.Load() }

func (h *Hook) storeNotices(msgs []*core.Message) {
	h.produces.Add(1)
	h.core.ProduceAsync(msgs, func(_ []core.SendResult, err error) {
		defer h.produces.Done()
		for _, m := range msgs {
			ok, failed := h.m.events, h.m.eventFailures
			if m.Topic != h.opts.EventsTopic {
				ok, failed = h.m.receipts, h.m.receiptFailures
			}
			if err != nil {
				failed.Inc()
				if m.Topic == h.opts.EventsTopic {
					h.presenceFailed.Add(1)
				}
			} else {
				ok.Inc()
			}
		}
	})
}

// jsonSizeHint is the most appendJSON writes unless a string needs
// escaping: one allocation of the right size class instead of a connect's
// worth of append growth (~850 B of garbage per event before).
func (e *Event) jsonSizeHint() int {
	n := len(`{"event":"","clientid":"","seq":18446744073709551615,"ts":"2006-01-02T15:04:05.999999999Z"}`) +
		len(e.Event) + len(e.ClientID)
	for _, f := range [...]struct {
		name, v string
	}{{"username", e.Username}, {"node", e.Node}, {"remote", e.Remote}, {"listener", e.Listener},
		{"reason", e.Reason}, {"error", e.Error}, {"old_remote", e.OldRemote}} {
		if f.v != "" {
			n += len(`,"":""`) + len(f.name) + len(f.v)
		}
	}
	if e.Proto != 0 {
		n += len(`,"proto":255`)
	}
	if e.Clean {
		n += len(`,"clean":true`)
	}
	if e.Keepalive != 0 {
		n += len(`,"keepalive":65535`)
	}
	return n
}

// appendJSON encodes e as encoding/json would (same field names, order and
// omissions), without reflection: events are written on every connect.
func (e *Event) appendJSON(b []byte) []byte {
	b = append(b, `{"event":`...)
	b = appendJSONString(b, e.Event)
	b = append(b, `,"clientid":`...)
	b = appendJSONString(b, e.ClientID)
	str := func(name, v string) {
		if v != "" {
			b = append(b, ',', '"')
			b = append(b, name...)
			b = append(b, '"', ':')
			b = appendJSONString(b, v)
		}
	}
	str("username", e.Username)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"ts":"`...)
	b = e.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	str("node", e.Node)
	str("remote", e.Remote)
	str("listener", e.Listener)
	if e.Proto != 0 {
		b = append(b, `,"proto":`...)
		b = strconv.AppendUint(b, uint64(e.Proto), 10)
	}
	if e.Clean {
		b = append(b, `,"clean":true`...)
	}
	if e.Keepalive != 0 {
		b = append(b, `,"keepalive":`...)
		b = strconv.AppendUint(b, uint64(e.Keepalive), 10)
	}
	str("reason", e.Reason)
	str("error", e.Error)
	str("old_remote", e.OldRemote)
	return append(b, '}')
}

// appendJSONString appends s as a JSON string; invalid UTF-8 becomes
// U+FFFD, as with encoding/json.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\b':
				b = append(b, '\\', 'b')
			case c == '\f':
				b = append(b, '\\', 'f')
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, `\u202`...)
			b = append(b, hex[r&0xF])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// interceptorsPresence calls f with each interceptor that hears
// connections (an engine.Presence): the shadows' send a device its delta
// when it connects.
func (h *Hook) interceptorsPresence(f func(engine.Presence)) {
	for _, i := range h.opts.Interceptors {
		if p, ok := i.(engine.Presence); ok {
			f(p)
		}
	}
}
