package gateway_test

import (
	"io"
	"net"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// BenchmarkIdleConnectionMemory opens b.N idle MQTT 3.1.1 connections
// (CONNECT, CONNACK, then nothing) and reports what each costs the process
// in goroutine stacks and heap, after two garbage collections.
//
//	go test -run '^$' -bench IdleConnectionMemory -benchtime 5000x ./gateway/
func BenchmarkIdleConnectionMemory(b *testing.B) {
	env := gatewaytest.Start(b, gatewaytest.Options{})
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
		c, err := net.Dial("tcp", env.TCP)
		require.NoError(b, err)
		conns = append(conns, c)
		_, err = c.Write(connectV4("idle-" + strconv.Itoa(i)))
		require.NoError(b, err)
		_, err = io.ReadFull(c, ack)
		require.NoError(b, err)
	}
	b.StopTimer()
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	n := float64(len(conns))
	b.ReportMetric(float64(ms.StackInuse-stack0)/n, "stack-B/conn")
	b.ReportMetric(float64(ms.HeapInuse-heap0)/n, "heap-B/conn")
	b.ReportMetric(float64(runtime.NumGoroutine()-g0)/n, "goroutines/conn")
}
