package engine_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// TestRapidReconnectsAllServed: clients that connect, are served and leave
// in quick succession — each new socket likely reusing the descriptor
// number of one just closed — all get their CONNACK: no event or close
// meant for the old socket reaches the new one.
func TestRapidReconnectsAllServed(t *testing.T) {
	_, addr := start(t, engine.Options{})
	const workers, rounds = 4, 500
	var failed atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err.Error())
					continue
				}
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, err = c.Write(connectV4(fmt.Sprintf("r%d-%d", w, i)))
				ack := make([]byte, 4)
				if err == nil {
					_, err = io.ReadFull(c, ack)
				}
				if err != nil || ack[0] != 0x20 {
					failed.Add(1)
					first.CompareAndSwap(nil, fmt.Sprint(err, ack))
				}
				if i%2 == 0 {
					_, _ = c.Write([]byte{0xE0, 0}) // DISCONNECT: the engine closes
					_, _ = io.Copy(io.Discard, c)
				}
				_ = c.Close() // or the client does
			}
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "connections without a CONNACK (first: %v)", first.Load())
}

// TestRefusedReconnectsAllAnswered: the engine closes a refused
// connection itself while its client hangs up as soon as it has read the
// CONNACK, and new clients keep arriving. The event loop can then hold the
// old socket's hang-up for a descriptor number that a new socket already
// has; the engine's own closes must leave closing the descriptor to the
// event loop, or that hang-up closes the new connection before its
// CONNACK (seen as a client reading EOF instead of return code 4).
func TestRefusedReconnectsAllAnswered(t *testing.T) {
	refuse := authFunc(func(*engine.ConnectInfo) (engine.Identity, error) {
		return engine.Identity{}, &engine.Refusal{Code: engine.BadUsernameOrPassword, Reason: "refused by the test"}
	})
	_, addr := start(t, engine.Options{Hooks: engine.Hooks{Auth: refuse}})
	const workers, rounds = 4, 750
	var failed atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err.Error())
					continue
				}
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, err = c.Write(connectV4(fmt.Sprintf("x%d-%d", w, i)))
				ack := make([]byte, 4)
				if err == nil {
					_, err = io.ReadFull(c, ack)
				}
				if err != nil || !bytes.Equal(ack, []byte{0x20, 2, 0, 4}) {
					failed.Add(1)
					first.CompareAndSwap(nil, fmt.Sprint(err, ack))
				}
				_ = c.Close()
			}
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "refused connections without their CONNACK (first: %v)", first.Load())
}
