package bridge

import (
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// clientState is a client's QoS 1/2 uplink pipeline: how many publishes are
// on their way to the core, and the acknowledgements ready to be written.
// It exists only while a client has publishes in flight, so an idle
// connection costs nothing here.
type clientState struct {
	cl *mqtt.Client

	mu       sync.Mutex
	pending  int                 // admitted, not yet acknowledged
	wake     chan struct{}       // closed when pending drops; nil if nobody waits
	qos2     map[uint16]struct{} // QoS 2 packet IDs on their way to the core
	acks     []ack               // completed by the core, in append order
	spare    []ack
	flushing bool // a flusher goroutine owns acks
	failed   bool // the client was disconnected for a refused publish: no more acks
}

// ack is one completed publish.
type ack struct {
	pk  packets.Packet
	err error
	// held: not delivered to MQTT subscribers once durable (a delayed
	// publish).
	held bool
	// id is the stored message's ID; traced: its ack hop is recorded.
	id     core.MessageID
	traced bool
}

// admit reserves a pipeline slot for pk, waiting while the client has
// max publishes in flight (the read loop stalls: TCP backpressure). It
// returns false for a QoS 2 resend of a packet still on its way to the core.
func (st *clientState) admit(pk *packets.Packet, max int) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	for st.pending >= max {
		if st.wake == nil {
			st.wake = make(chan struct{})
		}
		w := st.wake
		st.mu.Unlock()
		<-w // the core always completes what it was given, so this ends
		st.mu.Lock()
	}
	if pk.FixedHeader.Qos == 2 {
		if _, dup := st.qos2[pk.PacketID]; dup { // [MQTT-4.3.3-10]: deliver once
			return false
		}
		if st.qos2 == nil {
			st.qos2 = make(map[uint16]struct{})
		}
		st.qos2[pk.PacketID] = struct{}{}
	}
	st.pending++
	return true
}

// takeReceiveQuota counts a QoS 1/2 publish the bridge took over from
// mochi against the client's Receive Maximum, as mochi does for the
// publishes it acknowledges itself: mochi refuses the next publish with
// DISCONNECT 0x93 once the quota is spent (MQTT 5 §3.2.2.3.3). PUBACK (or a
// PUBREC with an error code) gives it back (returnReceiveQuota), a QoS 2
// flow gives it back at PUBCOMP (mochi's processPubrel). MQTT 3 has no
// Receive Maximum: its clients are paced by admit's backpressure alone.
func takeReceiveQuota(cl *mqtt.Client) {
	if cl.Properties.ProtocolVersion == 5 {
		cl.State.Inflight.DecreaseReceiveQuota()
	}
}

// returnReceiveQuota ends what takeReceiveQuota started.
func returnReceiveQuota(cl *mqtt.Client) {
	if cl.Properties.ProtocolVersion == 5 {
		cl.State.Inflight.IncreaseReceiveQuota()
	}
}

// complete queues a finished publish; runs on the core's goroutine, so it
// only appends and, if no flusher runs, starts one.
func (st *clientState) complete(h *Hook, a ack) {
	st.mu.Lock()
	st.acks = append(st.acks, a)
	start := !st.flushing
	st.flushing = true
	st.mu.Unlock()
	if start {
		h.flushers.Add(1)
		go st.flush(h)
	}
}

// flush writes acknowledgements in the order the core completed the
// publishes — the order the client sent them [MQTT-4.6.0-2] [MQTT-4.6.0-3] —
// batching whatever is ready into one write, then delivers the messages to
// MQTT subscribers. It exits when nothing is left.
func (st *clientState) flush(h *Hook) {
	defer h.flushers.Done()
	var buf []byte
	for {
		st.mu.Lock()
		items := st.acks
		st.acks, st.spare = st.spare[:0], nil // the two slices take turns
		if len(items) == 0 {
			st.flushing = false
			st.mu.Unlock()
			return
		}
		st.mu.Unlock()

		// The quota comes back before the acks are written: a client may
		// send its next publish the moment it reads one, and must not find
		// the quota still spent (DISCONNECT 0x93).
		for i := range items {
			if items[i].pk.FixedHeader.Qos == 1 || items[i].err != nil {
				returnReceiveQuota(st.cl) // PUBACK, or PUBREC >= 0x80: the flow ended
			}
		}
		buf = st.writeAcks(h, items, buf[:0])
		for i := range items {
			if items[i].err == nil && !items[i].held {
				h.republish(st.cl.ID, items[i].pk)
			}
		}

		st.mu.Lock()
		st.pending -= len(items)
		for i := range items {
			if items[i].pk.FixedHeader.Qos == 2 {
				delete(st.qos2, items[i].pk.PacketID)
			}
			items[i] = ack{}
		}
		if st.wake != nil {
			close(st.wake)
			st.wake = nil
		}
		st.spare = items[:0]
		st.mu.Unlock()
		h.m.inflight.Sub(float64(len(items)))
	}
}

// writeAcks encodes and writes the acks for items. A refused publish gets
// a reason code on MQTT 5; MQTT 3 has none, so the client is disconnected
// without an ack and will publish again [MQTT-4.4.0-1]. Traced publishes
// whose acks were written record their ack hop.
func (st *clientState) writeAcks(h *Hook, items []ack, buf []byte) []byte {
	cl := st.cl
	v5 := cl.Properties.ProtocolVersion == 5
	problemInfo := !(cl.Properties.Props.RequestProblemInfoFlag && cl.Properties.Props.RequestProblemInfo == 0)
	n := 0
	sent := len(items) // items[:sent] had their acks written
	for i := range items {
		if st.failed {
			sent = i
			break
		}
		pk := &items[i].pk
		typ := byte(packets.Puback)
		if pk.FixedHeader.Qos == 2 {
			typ = packets.Pubrec
		}
		if err := items[i].err; err != nil {
			code := reasonCode(err)
			if !v5 || code == packets.ErrPacketTooLarge.Code {
				sent = i
				if !st.write(h, buf, n) {
					sent = 0
				}
				buf, n = buf[:0], 0
				st.failed = true
				if v5 {
					_ = h.server.DisconnectClient(cl, packets.ErrPacketTooLarge) // [MQTT-3.2.2-15]
				} else {
					cl.Stop(err)
				}
				h.log.Warn().Err(err).Str("client", cl.ID).Msg("core refused a publish; client disconnected without ack")
				break
			}
			reason := ""
			if problemInfo {
				reason = err.Error()
				if len(reason) > 200 {
					reason = reason[:200]
				}
			}
			buf = appendAck(buf, typ, pk.PacketID, code, reason)
			n++
			continue
		}
		if typ == packets.Pubrec {
			// mochi answers the PUBREL from its inflight table [MQTT-4.3.3-8].
			now := time.Now().Unix()
			rec := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, PacketID: pk.PacketID,
				Created: now, Expiry: now + h.server.Options.Capabilities.MaximumMessageExpiryInterval}
			if cl.State.Inflight.Set(rec) {
				atomic.AddInt64(&h.server.Info.Inflight, 1)
			}
			if h.opts.Sessions != nil {
				h.opts.Sessions.InboundQoS2(cl.ID, pk.PacketID)
			}
		}
		buf = appendAck(buf, typ, pk.PacketID, 0, "")
		n++
	}
	if n > 0 && !st.write(h, buf, n) {
		sent = 0
	}
	if h.opts.Trace != nil {
		h.traceAcks(cl, items[:sent])
	}
	return buf
}

// write sends n encoded acks under the client's write lock, which mochi
// holds for its own writes, so packets never interleave; false if they
// were not written.
func (st *clientState) write(h *Hook, b []byte, n int) bool {
	cl := st.cl
	if n == 0 || cl.Net.Conn == nil || cl.Closed() {
		return false
	}
	cl.Lock()
	_, err := cl.Net.Conn.Write(b)
	cl.Unlock()
	if err != nil {
		h.log.Debug().Err(err).Str("client", cl.ID).Msg("write acks")
		return false
	}
	h.m.acks.Add(float64(n))
	atomic.AddInt64(&h.server.Info.BytesSent, int64(len(b)))
	atomic.AddInt64(&h.server.Info.PacketsSent, int64(n))
	return true
}

// appendAck encodes a PUBACK or PUBREC. Success is the 2-byte form every
// version accepts; a reason code (MQTT 5 only) may carry a reason string.
func appendAck(b []byte, typ byte, id uint16, code byte, reason string) []byte {
	if code == 0 {
		return append(b, typ<<4, 2, byte(id>>8), byte(id))
	}
	if reason == "" {
		return append(b, typ<<4, 3, byte(id>>8), byte(id), code) // [MQTT-3.4.2.1]
	}
	props := 3 + len(reason) // 0x1F, uint16 length, string
	b = append(b, typ<<4)
	b = appendVarint(b, 3+varintLen(props)+props)
	b = append(b, byte(id>>8), byte(id), code)
	b = appendVarint(b, props)
	b = append(b, 0x1F, byte(len(reason)>>8), byte(len(reason)))
	return append(b, reason...)
}

func appendVarint(b []byte, v int) []byte {
	for {
		c := byte(v & 0x7F)
		v >>= 7
		if v > 0 {
			c |= 0x80
		}
		b = append(b, c)
		if v == 0 {
			return b
		}
	}
}

func varintLen(v int) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// reasonCode is the MQTT 5 reason code for a publish the core refused.
func reasonCode(err error) byte {
	switch {
	case errors.Is(err, core.ErrMessageTooLarge), errors.Is(err, core.ErrPropertiesTooLarge):
		return packets.ErrPacketTooLarge.Code // 0x95
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return packets.ErrQuotaExceeded.Code // 0x97
	case errors.Is(err, core.ErrTopicNotFound), errors.Is(err, core.ErrInvalidTopic), errors.Is(err, mqtttopic.ErrBadDelayed),
		errors.Is(err, delay.ErrDelayTooLong):
		return packets.ErrTopicNameInvalid.Code // 0x90
	case errors.Is(err, core.ErrInvalidMessage):
		return packets.ErrImplementationSpecificError.Code // 0x83
	}
	return packets.ErrUnspecifiedError.Code // 0x80
}

// failureReason labels a refused publish in metrics.
func failureReason(err error) string {
	switch {
	case errors.Is(err, core.ErrMessageTooLarge), errors.Is(err, core.ErrPropertiesTooLarge):
		return "too_large"
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "disk_full"
	case errors.Is(err, core.ErrStoreFailed):
		return "store_failed"
	case errors.Is(err, core.ErrClosed):
		return "closed"
	case errors.Is(err, core.ErrTopicNotFound), errors.Is(err, core.ErrInvalidTopic):
		return "topic"
	case errors.Is(err, core.ErrInvalidMessage):
		return "invalid_message"
	}
	return "other"
}
