package engine_test

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// TestEverythingSentBeforeCloseIsHandled: a client that writes megabytes
// of QoS 0 publishes and a DISCONNECT, then closes at once, has every
// publish handled and its will cancelled — although the engine reads no
// more than a bounded inbox ahead of handling, and the event loop closes a
// socket as soon as it reports the client's FIN (what was still in the
// socket then was lost: 8 % of a 10-publisher fan-in, and the DISCONNECT).
func TestEverythingSentBeforeCloseIsHandled(t *testing.T) {
	e, addr := start(t, engine.Options{})
	const n, size = 20000, 300
	var out bytes.Buffer
	out.Write(connectWithWill("flood", "flood/will"))
	payload := bytes.Repeat([]byte{'x'}, size)
	for range n {
		out.Write(publishQoS0("flood/data", payload))
	}
	out.Write([]byte{0xE0, 0}) // DISCONNECT
	for round := range 3 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		_, err = c.Write(out.Bytes())
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		_, _ = io.Copy(io.Discard, c) // CONNACK, then the engine's close
		_ = c.Close()
		want := uint64((round + 1) * n)
		require.Eventually(t, func() bool { return e.Stats().Counters["published"] >= want }, 10*time.Second, 5*time.Millisecond,
			"round %d: %d of %d publishes handled", round, e.Stats().Counters["published"], want)
		require.Equal(t, want, e.Stats().Counters["published"])
		require.Zero(t, e.Stats().Counters["wills"], "the DISCONNECT was lost: the will went out")
	}
}

// connectWithWill is an MQTT 3.1.1 CONNECT (clean session) with a QoS 0
// will on willTopic.
func connectWithWill(id, willTopic string) []byte {
	body := []byte{0, 4, 'M', 'Q', 'T', 'T', 4, 0x06, 0, 60}
	body = appendString(body, id)
	body = appendString(body, willTopic)
	body = appendString(body, "gone")
	return append(appendLength([]byte{0x10}, len(body)), body...)
}

func publishQoS0(topic string, payload []byte) []byte {
	body := appendString(nil, topic)
	body = append(body, payload...)
	return append(appendLength([]byte{0x30}, len(body)), body...)
}

func appendString(b []byte, s string) []byte {
	b = append(b, byte(len(s)>>8), byte(len(s)))
	return append(b, s...)
}

func appendLength(b []byte, n int) []byte {
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

// heldUplink defers every QoS 1 publish until release.
type heldUplink struct {
	mu      sync.Mutex
	dones   []func(engine.Result)
	taken   int
	release chan struct{}
}

func (h *heldUplink) Publish(_ *engine.Client, m *engine.Message, done func(engine.Result)) (engine.Decision, engine.Result) {
	if m.QoS == 0 {
		return engine.Deliver, engine.Result{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.taken++
	h.dones = append(h.dones, done)
	return engine.Defer, engine.Result{}
}

func (h *heldUplink) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.taken
}

func (h *heldUplink) ackAll() {
	h.mu.Lock()
	d := h.dones
	h.dones = nil
	h.mu.Unlock()
	for _, done := range d {
		done(engine.Result{})
	}
}

// TestPausedInputIsHandledOnResume: an MQTT 3.1.1 client sends more QoS 1
// publishes than the receive maximum in one write, then DISCONNECT. The
// engine stops handling at the maximum; once the uplink acknowledges, the
// rest is handled although the socket has nothing new to wake the engine —
// and when the client closed meanwhile ("closed"), although our acks can
// no longer be written: no publish lost, no will.
func TestPausedInputIsHandledOnResume(t *testing.T) {
	for _, closeEarly := range []bool{false, true} {
		t.Run(map[bool]string{false: "open", true: "closed"}[closeEarly], func(t *testing.T) {
			up := &heldUplink{}
			e, addr := start(t, engine.Options{ReceiveMaximum: 8, Hooks: engine.Hooks{Uplink: up}})
			const n = 40
			var out bytes.Buffer
			out.Write(connectWithWill("paused", "paused/will"))
			for i := range n {
				body := appendString(nil, "paused/data")
				body = append(body, 0, byte(i+1), 'x') // packet ID, payload
				out.Write(append(appendLength([]byte{0x32}, len(body)), body...))
			}
			out.Write([]byte{0xE0, 0})
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer c.Close()
			_, err = c.Write(out.Bytes())
			require.NoError(t, err)
			require.Eventually(t, func() bool { return up.count() == 8 }, 5*time.Second, time.Millisecond)
			if closeEarly {
				require.NoError(t, c.Close()) // gone, with 32 publishes and the DISCONNECT unhandled
			}
			for up.count() < n {
				before := up.count()
				up.ackAll()
				require.Eventually(t, func() bool { return up.count() > before }, 5*time.Second, time.Millisecond,
					"%d of %d publishes taken", up.count(), n)
			}
			up.ackAll()
			require.Eventually(t, func() bool { return !e.Connected("paused") }, 5*time.Second, time.Millisecond)
			require.Zero(t, e.Stats().Counters["wills"], "the DISCONNECT was lost: the will went out")
		})
	}
}
