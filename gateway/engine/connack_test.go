package engine_test

import (
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// sendOnConnect sends each client a QoS 1 message from its
// Presence.Connected call (as the bridge releases the commands it held
// for a client it did not know yet).
// The engine is set after it started: atomic, as nothing else orders the
// test's store before the hook's load.
type sendOnConnect struct{ e atomic.Pointer[engine.Engine] }

func (h *sendOnConnect) Connected(c *engine.Client, _ bool, _ *engine.Client) {
	_ = h.e.Load().Send(c.ID(), &engine.Message{Topic: "cmd/" + c.ID(), QoS: 1, Payload: []byte("held")})
}

func (h *sendOnConnect) Disconnected(*engine.Client, string, error, bool) {}

// TestConnackComesFirst: a message given to a session while its connection
// is being accepted (here: by the Presence hook) goes out after the CONNACK
// [MQTT-3.2.0-1], not before.
func TestConnackComesFirst(t *testing.T) {
	h := &sendOnConnect{}
	e, addr := start(t, engine.Options{Hooks: engine.Hooks{Presence: h}})
	h.e.Store(e)
	for i := range 5 {
		c := rawConnect(t, addr, connectV4("first-"+string(rune('a'+i)))) // asserts CONNACK is the first packet
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		typ, _ := readFrame(t, c)
		require.Equal(t, byte(0x32), typ, "then the QoS 1 PUBLISH")
		require.NoError(t, c.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
		_, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "once (not again with DUP when the session resumes)")
		_ = c.Close()
	}
}
