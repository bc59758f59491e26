package bridge

import (
	"errors"
	"io"
	"net"
	"sort"
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

// OnSessionEstablish runs once a connection is accepted, before mochi
// takes over an existing session and before the CONNACK: the takeover
// event (a live connection with this client ID is replaced) and the
// connected event are emitted here, so they are stored before anything the
// client can do after its CONNACK — including being taken over itself.
func (h *Hook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	if h.server != nil && !h.opts.DisableDownlink {
		if _, exists := h.server.Clients.Get(cl.ID); !exists || !pk.Connect.Clean {
			// Before the CONNACK: a command sent the moment the client is
			// told it is connected finds its subscription. (A clean start
			// over an existing session gets it in OnSessionEstablished:
			// mochi drops the old session's subscriptions, which are filed
			// under the same client ID, in between.)
			h.subscribeP2P(cl)
		}
	}
	if h.server != nil && !cl.Properties.Clean {
		if old, ok := h.server.Clients.Get(cl.ID); ok && old != cl {
			orderInflight(old)
		}
	}
	traced := false
	if all, topics := h.opts.Trace.Traced(); all || len(topics) > 0 {
		traced = true
		h.conns.Store(cl, connSession{at: time.Now()})
	}
	if h.opts.DisableEvents {
		return
	}
	if h.server != nil {
		if old, ok := h.server.Clients.Get(cl.ID); ok && old != cl && !old.Closed() {
			h.takenOver.Store(old, struct{}{})
			h.emit(&Event{Event: EventTakeover, ClientID: cl.ID, Username: string(cl.Properties.Username),
				Remote: cl.Net.Remote, Listener: cl.Net.Listener, OldRemote: old.Net.Remote})
		}
	}
	seq := h.emit(&Event{Event: EventConnected, ClientID: cl.ID, Username: string(cl.Properties.Username),
		Remote: cl.Net.Remote, Listener: cl.Net.Listener, Proto: cl.Properties.ProtocolVersion,
		Clean: cl.Properties.Clean, Keepalive: cl.State.Keepalive})
	if traced {
		h.conns.Store(cl, connSession{at: time.Now(), seq: seq})
	}
}

// OnSessionEstablished makes sure the client has its point-to-point
// subscription (after mochi restored or dropped any session it replaced)
// and releases the commands held for it.
func (h *Hook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	if h.server != nil && !h.opts.DisableDownlink {
		h.subscribeP2P(cl)
		h.releaseHeld(cl.ID)
	}
}

// OnDisconnect emits the disconnected event (a connection that was taken
// over has its takeover event instead) and forgets the client's pipeline.
func (h *Hook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	if cl.Net.Conn == nil {
		return // a session loaded from storage at start, not a connection
	}
	h.clients.Delete(cl)
	h.conns.Delete(cl)
	h.wake(cl.ID)
	if !cl.IsTakenOver() {
		h.forgetPending(cl.ID) // rebuilt from the resent packets if the session resumes
	}
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

// emit stamps an event and queues it for storing.
func (h *Hook) emit(e *Event) uint64 {
	e.Seq = h.seq.Add(1)
	e.Time = time.Now().UTC()
	e.Node = h.opts.Node
	h.enqueue(&core.Message{Topic: h.opts.EventsTopic, ShardingKey: e.ClientID, Tag: e.Event, Body: e.appendJSON(nil)})
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
			} else {
				ok.Inc()
			}
		}
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

// orderInflight makes mochi resend a resumed session's messages in the
// order they were first sent [MQTT-4.6.0-1]. mochi sorts them by the low 16
// bits of their creation time in seconds, so messages of the same second
// come back in random order; here their creation times are rewritten to
// consecutive seconds in packet ID order (IDs are handed out in sending
// order; the order starts after the widest gap in the 16-bit ID circle).
func orderInflight(cl *mqtt.Client) {
	pks := cl.State.Inflight.GetAll(false)
	if len(pks) < 2 {
		return
	}
	sort.Slice(pks, func(i, j int) bool { return pks[i].PacketID < pks[j].PacketID })
	start, gap := 0, -1
	for i := range pks {
		next := pks[(i+1)%len(pks)].PacketID
		d := int(next) - int(pks[i].PacketID)
		if d <= 0 {
			d += 1 << 16
		}
		if d > gap {
			gap, start = d, (i+1)%len(pks)
		}
	}
	now := time.Now().Unix()
	base := now - now%(1<<16) // uint16(base+i) grows with i
	if base+int64(len(pks)) > now {
		base -= 1 << 16
	}
	for i := range pks {
		pk := pks[(start+i)%len(pks)]
		pk.Created = base + int64(i)
		cl.State.Inflight.Set(pk)
	}
}
