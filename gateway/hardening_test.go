package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/store/vfs"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// Raw MQTT packets, hand-encoded, for input no real client would send.

func remLen(n int) []byte {
	var b []byte
	for {
		c := byte(n & 0x7F)
		n >>= 7
		if n > 0 {
			c |= 0x80
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

func str(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }

func packet(typeFlags byte, body ...[]byte) []byte {
	var b []byte
	for _, p := range body {
		b = append(b, p...)
	}
	return append(append([]byte{typeFlags}, remLen(len(b))...), b...)
}

func connectV4(id string) []byte {
	return packet(0x10, str("MQTT"), []byte{4, 0x02, 0, 60}, str(id))
}

func connectV5(id string) []byte {
	return packet(0x10, str("MQTT"), []byte{5, 0x02, 0, 60, 0}, str(id))
}

// rawConn dials the gateway; with connect it sends CONNECT and expects a
// successful CONNACK.
func rawConn(t testing.TB, addr string, connect []byte) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	if connect != nil {
		_, err = c.Write(connect)
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		hdr := make([]byte, 2)
		_, err = io.ReadFull(c, hdr)
		require.NoError(t, err)
		require.Equal(t, byte(0x20), hdr[0], "CONNACK")
		body := make([]byte, hdr[1])
		_, err = io.ReadFull(c, body)
		require.NoError(t, err)
		require.Equal(t, byte(0), body[1], "CONNACK code")
	}
	return c
}

// requireClosed reads until the server closes the connection.
func requireClosed(t testing.TB, c net.Conn, within time.Duration) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(within)))
	buf := make([]byte, 512)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "server did not close the connection within %v", within)
		return
	}
}

// healthy checks the gateway still serves: a fresh client publishes QoS 1
// and gets its PUBACK.
func healthy(t testing.TB, env *gatewaytest.Env) {
	t.Helper()
	c := dialV3(t, env.TCP, fmt.Sprintf("healthy-%d", time.Now().UnixNano()))
	tok := c.Publish("health/check", 1, false, "ok")
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	c.Disconnect(50)
}

func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Gateway: gateway.Options{ConnectTimeout: 500 * time.Millisecond}})
	bystander := dialV3(t, env.TCP, "bystander")

	cases := []struct {
		name    string
		connect []byte // sent first, CONNACK expected
		send    []byte
	}{
		// Each is a protocol violation: the connection is closed [MQTT-4.8.0-1]
		// [MQTT-4.13.1-1]. "gateway:" marks the checks the gateway makes itself
		// (conn.go, the recover in establish); the others are mochi's.
		//
		// gateway: mochi v2.7.9 indexes past the end here and panics; the
		// guard recovers and closes this connection only.
		{"v5 SUBSCRIBE without options byte", connectV5("s1"), packet(0x82, []byte{0, 1, 0}, str("a"))},
		// gateway: [MQTT-3.1.0-1] the first packet must be CONNECT ("G" is type 4).
		{"garbage", nil, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		// gateway: [MQTT-3.1.0-1].
		{"first packet not CONNECT", nil, packet(0xC0)},
		{"second CONNECT", connectV4("c2"), connectV4("c2")},                                                 // mochi: [MQTT-3.1.0-2]
		{"PUBLISH with wildcard", connectV4("w1"), packet(0x30, str("a/+/b"), []byte("x"))},                  // mochi: [MQTT-3.3.2-2]
		{"PUBLISH with empty topic", connectV4("e1"), packet(0x32, str(""), []byte{0, 1}, []byte("x"))},      // mochi
		{"invalid UTF-8 topic", connectV4("u1"), packet(0x32, str("a/\xff\xfe"), []byte{0, 1}, []byte("x"))}, // mochi
		// gateway: packet type 0 is reserved (3.1.1 §2.2.1) [MQTT-4.8.0-1].
		{"reserved packet type 0", connectV4("r1"), []byte{0x00, 0x00}},
		// gateway: a remaining length runs 4 bytes at most (3.1.1 §2.2.3) [MQTT-4.8.0-1].
		{"remaining length of 5 bytes", connectV4("l1"), []byte{0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F}},
		{"v3 SUBSCRIBE without QoS byte", connectV4("s3"), packet(0x82, []byte{0, 1}, str("a"))},                            // mochi
		{"v5 CONNECT with truncated properties", nil, packet(0x10, str("MQTT"), []byte{5, 0x02, 0, 60, 9, 0x11}, str("x"))}, // mochi: [MQTT-3.1.4-1]
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := rawConn(t, env.TCP, tc.connect)
			_, err := c.Write(tc.send)
			require.NoError(t, err)
			requireClosed(t, c, 5*time.Second)
			healthy(t, env)
		})
	}
	require.True(t, bystander.IsConnectionOpen(), "an unrelated client stays connected")
	tok := bystander.Publish("health/bystander", 1, false, "still here")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
}

// A CONNECT declaring 256 MiB is refused from its fixed header: nothing is
// allocated for it and the socket is closed at once, without a CONNACK and
// so without a DISCONNECT either [MQTT-3.14.0-1] (the protocol version is
// not known yet).
func TestHugeTrickledConnectRefused(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	c := rawConn(t, env.TCP, nil)
	_, err := c.Write(append([]byte{0x10}, remLen(256<<20)...))
	require.NoError(t, err)
	for i := 0; i < 5; i++ { // trickle: the server may already be gone
		if _, err := c.Write([]byte{0}); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond) // the trickle's pace: the scenario, not a wait
	}
	requireClosed(t, c, 3*time.Second)
	healthy(t, env)
}

// A socket that never sends CONNECT is closed after the connect timeout
// (MQTT 5 §3.1.4: the server SHOULD close a connection that sends no
// CONNECT within a reasonable time; untagged).
func TestSilentSocketClosedAfterConnectTimeout(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Gateway: gateway.Options{ConnectTimeout: 300 * time.Millisecond}})
	c := rawConn(t, env.TCP, nil)
	start := time.Now()
	requireClosed(t, c, 5*time.Second)
	require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond)
	// A half-sent CONNECT is no better.
	c = rawConn(t, env.TCP, nil)
	_, err := c.Write(connectV4("slow")[:5])
	require.NoError(t, err)
	requireClosed(t, c, 5*time.Second)
	healthy(t, env)
}

// 1,000 connections opened and dropped abruptly — before, during and after
// CONNECT — leave the gateway serving and holding no client.
func TestThousandAbruptDrops(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range 1000 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", env.TCP, 5*time.Second)
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			pkt := connectV4(fmt.Sprintf("drop-%d", i))
			switch i % 4 {
			case 1:
				_, _ = c.Write(pkt[:7])
			case 2, 3:
				_, _ = c.Write(pkt)
				if i%4 == 3 {
					_, _ = c.Write(packet(0x32, str("telemetry/x"), []byte{0, 1}, []byte("payload")))
				}
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				_, _ = c.Read(make([]byte, 4))
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // RST, not FIN
			}
			_ = c.Close()
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		return env.Gateway.Engine().Stats().Connected == 0
	}, 10*time.Second, 10*time.Millisecond)
	healthy(t, env)
}

// A full disk: MQTT 5 publishers get PUBACK 0x97 (quota exceeded), MQTT 3
// publishers are disconnected without an ack; nothing acknowledged before
// is lost and nothing refused was acknowledged.
func TestDiskFullRefusesWithoutAck(t *testing.T) {
	fs := vfs.NewCrashFS()
	env := gatewaytest.Start(t, gatewaytest.Options{Dir: "/data", Store: store.Options{FS: fs, FlushPolicy: store.FlushSync}})
	v3 := dialV3(t, env.TCP, "v3-dev")
	v5 := dialV5(t, env.TCP, "v5-dev", nil)
	tok := v3.Publish("orders/a", 1, false, "before")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())

	t.Cleanup(func() { fs.SetInject(nil) }) // let the store close
	fs.SetInject(func(op vfs.Op, _ string, n int) (int, error) {
		if op == vfs.OpWrite {
			return 0, syscall.ENOSPC
		}
		return n, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := v5.Publish(ctx, &paho.Publish{Topic: "orders/b", QoS: 1, Payload: []byte("refused")})
	require.Error(t, err, "paho reports a failure reason code as an error")
	require.NotNil(t, res)
	require.Equal(t, byte(0x97), res.ReasonCode, "quota exceeded")

	lost := make(chan error, 1)
	v3b := dialV3(t, env.TCP, "v3-full", func(o *paho3.ClientOptions) {
		o.SetConnectionLostHandler(func(_ paho3.Client, err error) { lost <- err })
	})
	tok = v3b.Publish("orders/c", 1, false, "refused")
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("MQTT 3 client not disconnected")
	}
	require.False(t, tok.WaitTimeout(200*time.Millisecond) && tok.Error() == nil, "a refused publish must not be acknowledged")

	ms := readAll(t, env.Store, "orders")
	require.Len(t, ms, 1)
	require.Equal(t, "before", string(ms[0].Body))
}
