package bridge

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

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

func (h *Hook) emit(e *Event) {
	e.Seq = h.seq.Add(1)
	e.Time = time.Now().UTC()
	e.Node = h.opts.Node
	body, err := json.Marshal(e)
	if err != nil { // cannot happen for this struct
		h.log.Error().Err(err).Msg("encode presence event")
		return
	}
	msg := &core.Message{Topic: h.opts.EventsTopic, ShardingKey: e.ClientID, Tag: e.Event, Body: body}
	h.produces.Add(1)
	h.opts.Broker.ProduceAsync([]*core.Message{msg}, func(_ []core.SendResult, err error) {
		defer h.produces.Done()
		if err != nil {
			h.m.eventFailures.Inc()
			return
		}
		h.m.events.Inc()
	})
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
