package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
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

// device is a minimal MQTT 3.1.1 client that acknowledges every QoS 1
// PUBLISH it receives.
type device struct {
	c    net.Conn
	got  *atomic.Int64
	done chan struct{}
}

func runDevice(tb testing.TB, addr, id string, got *atomic.Int64) *device {
	c, err := net.Dial("tcp", addr)
	require.NoError(tb, err)
	_, err = c.Write(connectV4(id))
	require.NoError(tb, err)
	ack := make([]byte, 4)
	_, err = io.ReadFull(c, ack)
	require.NoError(tb, err)
	require.Equal(tb, []byte{0x20, 2, 0, 0}, ack)
	d := &device{c: c, got: got, done: make(chan struct{})}
	go d.read()
	return d
}

func (d *device) read() {
	defer close(d.done)
	r := bufio.NewReader(d.c)
	for {
		h, err := r.ReadByte()
		if err != nil {
			return
		}
		n, shift := 0, 0
		for {
			b, err := r.ReadByte()
			if err != nil {
				return
			}
			n |= int(b&0x7F) << shift
			shift += 7
			if b&0x80 == 0 {
				break
			}
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		if h>>4 == 3 && (h>>1)&3 == 1 && len(body) >= 2 { // PUBLISH QoS 1: acknowledge
			tl := int(body[0])<<8 | int(body[1])
			if len(body) >= 4+tl {
				if _, err := d.c.Write([]byte{0x40, 2, body[2+tl], body[3+tl]}); err != nil {
					return
				}
				d.got.Add(1)
			}
		}
	}
}

// BenchmarkDownlinkPointToPoint: point-to-point QoS 1 commands from the core
// to 2,000 and 8,000 connected devices (one process holds both ends of every
// connection: 20,000 file descriptors is the limit here), each acknowledged
// by its device, a receipt stored per command. Reports commands delivered
// and acknowledged per second. --flush async; devices, gateway and core
// share the 2 cores.
//
//	go test -run '^$' -bench DownlinkPointToPoint -benchtime 100000x ./gateway/
func BenchmarkDownlinkPointToPoint(b *testing.B) {
	for _, devices := range []int{2000, 8000} {
		b.Run(fmt.Sprintf("devices=%d", devices), func(b *testing.B) { benchDownlink(b, devices) })
	}
}

func benchDownlink(b *testing.B, devices int) {
	env := gatewaytest.Start(b, gatewaytest.Options{Store: store.Options{FlushPolicy: store.FlushAsync}})
	var got atomic.Int64
	ds := make([]*device, devices)
	for i := range ds {
		ds[i] = runDevice(b, env.TCP, fmt.Sprintf("dev-%d", i), &got)
	}
	defer func() {
		for _, d := range ds {
			_ = d.c.Close()
			<-d.done
		}
	}()
	body := make([]byte, 64)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	const batch = 64
	for sent := 0; sent < b.N; sent += batch {
		msgs := make([]*core.Message, 0, batch)
		for i := sent; i < min(sent+batch, b.N); i++ {
			id := fmt.Sprintf("dev-%d", i%devices)
			msgs = append(msgs, &core.Message{Topic: "commands", ShardingKey: id, Body: body,
				Properties: map[string]string{bridge.PropClientID: id}})
		}
		wg.Add(1)
		env.Store.ProduceAsync(msgs, func(_ []core.SendResult, err error) {
			defer wg.Done()
			if err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	require.Eventually(b, func() bool { return got.Load() >= int64(b.N) }, 5*time.Minute, 5*time.Millisecond,
		"every command delivered and acknowledged")
	el := time.Since(start)
	b.StopTimer()
	require.Equal(b, int64(b.N), got.Load(), "every command delivered and acknowledged, once")
	b.ReportMetric(float64(b.N)/el.Seconds(), "cmds/s")
}
