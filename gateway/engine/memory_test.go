package engine_test

import (
	"io"
	"net"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// connectV4 is a minimal MQTT 3.1.1 CONNECT (clean session, keepalive 60).
func connectV4(id string) []byte {
	body := []byte{0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, byte(len(id) >> 8), byte(len(id))}
	body = append(body, id...)
	return append([]byte{0x10, byte(len(body))}, body...)
}

// BenchmarkIdleConnectionMemory opens b.N idle MQTT 3.1.1 connections
// (CONNECT, CONNACK, then nothing; "subscribed": each with one QoS 1
// subscription to a topic of its own) and reports what each costs the
// engine's process in heap and goroutine stacks, after two garbage
// collections, and how many goroutines it added. The clients are in the
// same process (their sockets' buffers are the kernel's, not counted), so
// this is the engine's share; docs/BENCHMARKS.md has the cross-process RSS
// figure.
//
//	go test -run '^$' -bench IdleConnectionMemory -benchtime 5000x ./gateway/engine/
func BenchmarkIdleConnectionMemory(b *testing.B) {
	for _, subscribed := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "subscribed"}[subscribed], func(b *testing.B) {
			idleConnections(b, subscribed)
		})
	}
}

func idleConnections(b *testing.B, subscribed bool) {
	_, addr := start(b, engine.Options{})
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	stack0, heap0, g0 := ms.StackInuse, ms.HeapInuse, runtime.NumGoroutine()
	conns := make([]net.Conn, 0, b.N)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	ack := make([]byte, 4)
	for i := 0; b.Loop(); i++ {
		c, err := net.Dial("tcp", addr)
		require.NoError(b, err)
		conns = append(conns, c)
		id := "idle-" + strconv.Itoa(i)
		_, err = c.Write(connectV4(id))
		require.NoError(b, err)
		_, err = io.ReadFull(c, ack)
		require.NoError(b, err)
		if subscribed {
			_, err = c.Write(packet(0x82, []byte{0, 1}, str("idle/"+id), []byte{1}))
			require.NoError(b, err)
			typ, _ := readFrame(b, c)
			require.Equal(b, byte(0x90), typ, "SUBACK")
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	n := float64(len(conns))
	b.ReportMetric(float64(ms.StackInuse-stack0)/n, "stack-B/conn")
	b.ReportMetric(float64(ms.HeapInuse-heap0)/n, "heap-B/conn")
	b.ReportMetric(float64(runtime.NumGoroutine()-g0), "goroutines-added")
}
