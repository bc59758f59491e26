package engine_test

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// TestConnectRightAfterAccept: clients that send their CONNECT with the
// TCP handshake are served while the accepting goroutine may still be
// setting their connection up (its first deadline in the wheel); that
// setup must be ordered before the connection's first turn (-race).
func TestConnectRightAfterAccept(t *testing.T) {
	_, addr := start(t, engine.Options{})
	var wg sync.WaitGroup
	for i := range 256 {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if !assert.NoError(t, err) {
				return
			}
			defer c.Close()
			if _, err := c.Write(connectV4(fmt.Sprintf("fast-%d", i))); !assert.NoError(t, err) {
				return
			}
			ack := make([]byte, 4)
			_, err = io.ReadFull(c, ack)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
}
