package bridge

import (
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"
	"unicode/utf8"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/ferrymq/ferrymq/core"
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
)

// OnSessionEstablish runs before mochi takes over an existing session: a
// live connection with the same client ID is being replaced.
func (h *Hook) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	if h.opts.DisableEvents || h.server == nil {
		return
	}
	old, ok := h.server.Clients.Get(cl.ID)
	if !ok || old == cl || old.Closed() {
		return
	}
	h.takenOver.Store(old, struct{}{})
	h.emit(&Event{Event: EventTakeover, ClientID: cl.ID, Username: string(cl.Properties.Username),
		Remote: cl.Net.Remote, Listener: cl.Net.Listener, OldRemote: old.Net.Remote})
}

// OnSessionEstablished emits the connected event.
func (h *Hook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	if h.opts.DisableEvents {
		return
	}
	h.emit(&Event{Event: EventConnected, ClientID: cl.ID, Username: string(cl.Properties.Username),
		Remote: cl.Net.Remote, Listener: cl.Net.Listener, Proto: cl.Properties.ProtocolVersion,
		Clean: cl.Properties.Clean, Keepalive: cl.State.Keepalive})
}

// OnDisconnect emits the disconnected event (a connection that was taken
// over has its takeover event instead) and forgets the client's pipeline.
func (h *Hook) OnDisconnect(cl *mqtt.Client, err error, _ bool) {
	h.clients.Delete(cl)
	if _, ok := h.takenOver.LoadAndDelete(cl); ok || h.opts.DisableEvents {
		return
	}
	if cl.IsTakenOver() {
		return
	}
	e := &Event{Event: EventDisconnected, ClientID: cl.ID, Username: string(cl.Properties.Username),
		Remote: cl.Net.Remote, Listener: cl.Net.Listener}
	e.Reason, e.Error = disconnectReason(cl, err)
	h.emit(e)
}

// ClientClosed is for the gateway when a connection ended without mochi's
// OnDisconnect (a recovered panic): the event and cleanup still happen.
func (h *Hook) ClientClosed(cl *mqtt.Client, reason string, err error) {
	h.clients.Delete(cl)
	h.takenOver.Delete(cl)
	if h.opts.DisableEvents {
		return
	}
	e := &Event{Event: EventDisconnected, ClientID: cl.ID, Username: string(cl.Properties.Username),
		Remote: cl.Net.Remote, Listener: cl.Net.Listener, Reason: reason}
	if err != nil {
		e.Error = err.Error()
	}
	h.emit(e)
}

// emit stamps an event and hands it to the events goroutine, which stores
// events in batches: one append per batch instead of one per event keeps a
// connect storm from turning into a storm of commit-log cycles (each an
// fsync under --flush sync). Events keep their order: one channel, one
// goroutine, appended in call order.
func (h *Hook) emit(e *Event) {
	e.Seq = h.seq.Add(1)
	e.Time = time.Now().UTC()
	e.Node = h.opts.Node
	h.evMu.RLock()
	if h.evClosed { // after shutdown (a connection cleaned up late): store it alone
		h.evMu.RUnlock()
		h.storeEvents([]*Event{e})
		return
	}
	h.evOnce.Do(h.startEvents)
	h.evCh <- e // blocks when the core falls behind: backpressure on connects
	h.evMu.RUnlock()
}

func (h *Hook) startEvents() {
	h.evDone = make(chan struct{})
	go func() {
		defer close(h.evDone)
		batch := make([]*Event, 0, maxEventBatch)
		for e := range h.evCh {
			batch = append(batch[:0], e)
		more:
			for len(batch) < maxEventBatch {
				select {
				case e, ok := <-h.evCh:
					if !ok {
						break more
					}
					batch = append(batch, e)
				default:
					break more
				}
			}
			h.storeEvents(batch)
		}
	}()
}

// stopEvents stores what is queued and ends the events goroutine; safe to
// call twice.
func (h *Hook) stopEvents() {
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

const maxEventBatch = 256

func (h *Hook) storeEvents(es []*Event) {
	msgs := make([]*core.Message, len(es))
	for i, e := range es {
		msgs[i] = &core.Message{Topic: h.opts.EventsTopic, ShardingKey: e.ClientID, Tag: e.Event, Body: e.appendJSON(nil)}
	}
	h.produces.Add(1)
	h.opts.Broker.ProduceAsync(msgs, func(_ []core.SendResult, err error) {
		defer h.produces.Done()
		if err != nil {
			h.m.eventFailures.Add(float64(len(msgs)))
			return
		}
		h.m.events.Add(float64(len(msgs)))
	})
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

// disconnectReason classifies why a connection ended.
func disconnectReason(cl *mqtt.Client, err error) (reason, detail string) {
	if cause := cl.StopCause(); cause != nil && err == nil {
		err = cause
	} else if cause != nil {
		var code packets.Code
		if errors.As(cause, &code) {
			err = cause // the server's own reason beats "use of closed connection"
		}
	}
	if err == nil {
		return ReasonNormal, ""
	}
	detail = err.Error()
	var code packets.Code
	var ne net.Error
	switch {
	case errors.As(err, &code):
		switch code.Code {
		case packets.CodeDisconnect.Code, packets.CodeDisconnectWillMessage.Code:
			return ReasonNormal, ""
		case packets.ErrServerShuttingDown.Code:
			return ReasonShutdown, detail
		case packets.ErrSessionTakenOver.Code:
			return ReasonTakenOver, detail
		case packets.ErrKeepAliveTimeout.Code:
			return ReasonKeepalive, detail
		case packets.ErrMalformedPacket.Code:
			return ReasonMalformed, detail
		case packets.ErrProtocolViolation.Code:
			return ReasonProtocol, detail
		}
		if code.Code >= 0x80 && code.Code < 0x88 {
			return ReasonProtocol, detail
		}
		return ReasonKicked, detail
	case errors.As(err, &ne) && ne.Timeout():
		return ReasonKeepalive, detail
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, net.ErrClosed), errors.Is(err, syscall.EPIPE):
		return ReasonLost, detail
	case errors.Is(err, core.ErrStoreFailed), errors.Is(err, core.ErrClosed):
		return ReasonCoreRefuse, detail
	}
	return ReasonProtocol, detail
}
