package gateway_test

import (
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
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// connectPersistent is an MQTT 3.1.1 CONNECT with clean session 0.
func connectPersistent(id string) []byte {
	return packet(0x10, str("MQTT"), []byte{4, 0x00, 0, 60}, str(id))
}

// BenchmarkReconnectStorm: 2,000 persistent sessions go offline, 10 QoS 1
// point-to-point commands are queued for each, then all reconnect at once
// (64 at a time) and acknowledge what they get. Reports the memory an
// offline session costs (heap, after GC) without and with its 10 queued
// messages, and the time until every queued message was delivered.
//
//	go test -run '^$' -bench ReconnectStorm -benchtime 1x ./gateway/
func BenchmarkReconnectStorm(b *testing.B) {
	const sessions, queued = 2000, 10
	for b.Loop() {
		env := gatewaytest.Start(b, gatewaytest.Options{Sessions: true})
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
			return atomic.LoadInt64(&env.Gateway.Server().Info.ClientsConnected) == 0
		}, time.Minute, 10*time.Millisecond)
		h1 := heap()
		for i := range sessions * queued {
			id := fmt.Sprintf("car-%d", i%sessions)
			_, err := env.Store.Produce(b.Context(), &core.Message{Topic: "commands", ShardingKey: id, Body: make([]byte, 64),
				Properties: map[string]string{bridge.PropClientID: id}})
			require.NoError(b, err)
		}
		require.Eventually(b, func() bool {
			return atomic.LoadInt64(&env.Gateway.Server().Info.Inflight) >= sessions*queued
		}, time.Minute, 10*time.Millisecond, "commands queued in the offline sessions")
		h2 := heap()

		var got atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		ds := make([]*device, sessions)
		for i := range sessions {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				c, err := net.Dial("tcp", env.TCP)
				if err != nil {
					b.Error(err)
					return
				}
				if _, err := c.Write(connectPersistent(fmt.Sprintf("car-%d", i))); err != nil {
					b.Error(err)
					return
				}
				ack := make([]byte, 4)
				if _, err := io.ReadFull(c, ack); err != nil || ack[2] != 1 {
					b.Errorf("CONNACK %x %v: want session present", ack, err)
					return
				}
				d := &device{c: c, got: &got, done: make(chan struct{})}
				go d.read()
				ds[i] = d
			}()
		}
		wg.Wait()
		for got.Load() < sessions*queued && time.Since(start) < 2*time.Minute {
			time.Sleep(2 * time.Millisecond)
		}
		el := time.Since(start)
		require.Equal(b, int64(sessions*queued), got.Load())
		b.ReportMetric(el.Seconds(), "s-to-deliver-all")
		b.ReportMetric(float64(sessions*queued)/el.Seconds(), "msgs/s")
		b.ReportMetric(float64(h1-h0)/sessions, "heap-B/offline-session")
		b.ReportMetric(float64(h2-h0)/sessions, "heap-B/offline-session+10msgs")
		for _, d := range ds {
			if d != nil {
				_ = d.c.Close()
				<-d.done
			}
		}
		env.Stop(b)
	}
}
