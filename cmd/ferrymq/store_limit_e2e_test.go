package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
)

// TestBinaryKill9LoweredMessageLimit is issue #19 on the real binary: `ferrymq
// serve --flush sync` with store.max_message_bytes 64 KiB stores a 5-byte
// and two 32 KiB messages (acknowledged after fsync; 64 KiB segments put one
// large record in a sealed segment and the other at the end of the active
// one), is killed with SIGKILL, and restarts with the limit lowered to 8 KiB.
// Every acknowledged message is served, by ID and in queue order, and a new
// 32 KiB produce is refused with a message-too-large error.
func TestBinaryKill9LoweredMessageLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	serve := func(limit int) (*process, *client.Client) {
		cfg := filepath.Join(dir, fmt.Sprintf("ferrymq-%d.yaml", limit))
		require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, "flush: sync\nstore: {segment_bytes: 65536, max_message_bytes: %d, default_queues: 2}\n", limit), 0o644))
		p := startProcess(t, bin, "serve", "--config", cfg, "--data", filepath.Join(dir, "data"), "--core", "127.0.0.1:0",
			"--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "")
		addr := printedAddrs(t, p, "core")["core"]
		c, err := client.Dial(t.Context(), client.Options{Addr: addr})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return p, c
	}
	bodies := [][]byte{[]byte("small"), bytes.Repeat([]byte{'a'}, 32<<10), bytes.Repeat([]byte{'b'}, 32<<10)}

	srv, c := serve(64 << 10)
	p := c.NewProducer()
	var acked []core.SendResult
	for _, b := range bodies {
		res, err := p.Send(t.Context(), &core.Message{Topic: "telemetry", ShardingKey: "car-42", Body: b})
		require.NoError(t, err)
		acked = append(acked, res)
	}
	require.NoError(t, srv.cmd.Process.Kill()) // SIGKILL: no Close, no final flush
	<-srv.exited
	srv.exited <- nil
	_ = c.Close()

	srv, c = serve(8 << 10)
	for i, r := range acked {
		m, err := c.Get(t.Context(), r.ID)
		require.NoError(t, err, "acknowledged message %d (%d bytes) after SIGKILL and a lower limit", i, len(bodies[i]))
		require.Equal(t, bodies[i], m.Body)
	}
	res, err := c.Pull(t.Context(), "telemetry", acked[0].Queue, 0, 10, 0)
	require.NoError(t, err)
	require.Len(t, res.Messages, len(bodies))
	for i, m := range res.Messages {
		require.Equal(t, bodies[i], m.Body, "queue order after the restart")
	}

	_, err = c.NewProducer().Send(t.Context(), &core.Message{Topic: "telemetry", ShardingKey: "car-42", Body: bytes.Repeat([]byte{'c'}, 32<<10)})
	require.ErrorIs(t, err, core.ErrMessageTooLarge)
	require.Contains(t, err.Error(), "limit 8192")
	srv.interrupt(t)
	require.False(t, strings.Contains(srv.errOut.String(), "torn tail"), "recovery cut acknowledged data:\n%s", srv.errOut.String())
}
