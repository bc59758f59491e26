package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// connectPersistent is an MQTT 3.1.1 CONNECT with clean session 0.
func connectPersistent(id string) []byte {
	return packet(0x10, str("MQTT"), []byte{4, 0x00, 0, 60}, str(id))
}

// BenchmarkReconnectStorm: 10,000 persistent sessions go offline and are
// offline (the engine keeps a stub of each queued message; the store, the
// rest), 10 QoS 1 point-to-point commands are
// queued for each, then all reconnect in a storm (1,000 connecting at any
// moment: one process holds both ends of every socket and 20,000 file
// descriptors is the limit here), each acknowledging its 10 messages and
// leaving. Reports the heap an offline session costs (after GC) without
// and with its 10 queued messages, and the time until every queued message
// was delivered and acknowledged. Store flush async.
//
//	go test -run '^$' -bench ReconnectStorm -benchtime 1x ./gateway/
func BenchmarkReconnectStorm(b *testing.B) {
	const sessions, queued, concurrent = 10000, 10, 1000
	for b.Loop() {
		env := gatewaytest.Start(b, gatewaytest.Options{Sessions: true, Store: store.Options{FlushPolicy: store.FlushAsync}})
		heap := func() uint64 {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return ms.HeapInuse
		}
		h0 := heap()
		for i := range sessions {
			c, err := net.Dial("tcp", env.TCP)
			require.NoError(b, err)
			_, err = c.Write(connectPersistent(fmt.Sprintf("car-%d", i)))
			require.NoError(b, err)
			_, err = io.ReadFull(c, make([]byte, 4))
			require.NoError(b, err)
			_, _ = c.Write([]byte{0xE0, 0}) // DISCONNECT: the session stays
			_ = c.Close()
		}
		require.Eventually(b, func() bool {
			st := env.Gateway.Engine().Stats()
			return st.Connected == 0 && st.Sessions == sessions && env.Sessions.Stats().Sessions == sessions
		}, time.Minute, 10*time.Millisecond, "every session offline, stored")
		h1 := heap()
		for i := range sessions * queued {
			id := fmt.Sprintf("car-%d", i%sessions)
			_, err := env.Store.Produce(b.Context(), &core.Message{Topic: "commands", ShardingKey: id, Body: make([]byte, 64),
				Properties: map[string]string{bridge.PropClientID: id}})
			require.NoError(b, err)
		}
		require.Eventually(b, func() bool { return env.Sessions.Stats().Messages == sessions*queued },
			2*time.Minute, 10*time.Millisecond, "commands queued in the parked sessions")
		h2 := heap()

		var got atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		sem := make(chan struct{}, concurrent)
		for i := range sessions {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := drainSession(env.TCP, fmt.Sprintf("car-%d", i), queued, &got); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		require.Equal(b, int64(sessions*queued), got.Load())
		b.ReportMetric(el.Seconds(), "s-to-deliver-all")
		b.ReportMetric(float64(sessions*queued)/el.Seconds(), "msgs/s")
		b.ReportMetric(float64(h1-h0)/sessions, "heap-B/offline-session")
		b.ReportMetric(float64(h2-h0)/sessions, "heap-B/offline-session+10msgs")
		env.Stop(b)
	}
}

// drainSession resumes id's session, acknowledges n QoS 1 messages and
// leaves with DISCONNECT.
func drainSession(addr, id string, n int, got *atomic.Int64) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := c.Write(connectPersistent(id)); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	ack := make([]byte, 4)
	if _, err := io.ReadFull(r, ack); err != nil || ack[2] != 1 {
		return fmt.Errorf("%s: CONNACK %x %v: want session present", id, ack, err)
	}
	for acked := 0; acked < n; {
		h, err := r.ReadByte()
		if err != nil {
			return fmt.Errorf("%s: after %d messages: %w", id, acked, err)
		}
		size, shift := 0, 0
		for {
			b, err := r.ReadByte()
			if err != nil {
				return err
			}
			size |= int(b&0x7F) << shift
			shift += 7
			if b&0x80 == 0 {
				break
			}
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(r, body); err != nil {
			return err
		}
		if h>>4 != 3 || (h>>1)&3 != 1 || len(body) < 2 {
			continue
		}
		tl := int(body[0])<<8 | int(body[1])
		if len(body) < 4+tl {
			return fmt.Errorf("%s: short PUBLISH", id)
		}
		if _, err := c.Write([]byte{0x40, 2, body[2+tl], body[3+tl]}); err != nil {
			return err
		}
		acked++
		got.Add(1)
	}
	_, err = c.Write([]byte{0xE0, 0})
	return err
}
