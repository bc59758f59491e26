package engine_test

import (
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
