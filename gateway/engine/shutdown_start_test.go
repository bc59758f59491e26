package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// TestShutdownRightAfterStart: an engine stopped as soon as it started
// stops, whatever its pollers were doing (nbio's Stop, before the engine
// had its own event loop, was lost on a poller whose goroutine had not run
// yet, and Shutdown waited for it forever).
func TestShutdownRightAfterStart(t *testing.T) {
	for i := range 50 {
		e, err := engine.New(engine.Options{Listeners: []engine.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}}, Pollers: 1 + i%7})
		require.NoError(t, err)
		require.NoError(t, e.Start())
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done <- e.Shutdown(ctx)
		}()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("shutdown %d hung", i)
		}
	}
}
