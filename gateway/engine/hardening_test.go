package engine_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Raw-byte helpers for hand-made packets.

func remLen(n int) []byte {
	var b []byte
	for {
		d := byte(n & 0x7F)
		n >>= 7
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

func str(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }

func packet(first byte, body ...[]byte) []byte {
	b := bytes.Join(body, nil)
	return append(append([]byte{first}, remLen(len(b))...), b...)
}

func connectV5(id string) []byte {
	return packet(0x10, str("MQTT"), []byte{5, 0x02, 0, 60, 0}, str(id))
}

// rawConnect dials addr, sends connect and reads the CONNACK.
func rawConnect(t testing.TB, addr string, connect []byte) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Write(connect)
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	first, _ := readFrame(t, c)
	require.Equal(t, byte(0x20), first, "CONNACK")
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	return c
}

// readFrame reads one packet: its first byte and body.
func readFrame(t testing.TB, r io.Reader) (byte, []byte) {
	t.Helper()
	var b [1]byte
	_, err := io.ReadFull(r, b[:])
	require.NoError(t, err, "read fixed header")
	first := b[0]
	n, shift := 0, 0
	for i := 0; ; i++ {
		require.Less(t, i, 4)
		_, err = io.ReadFull(r, b[:])
		require.NoError(t, err)
		n |= int(b[0]&0x7F) << shift
		shift += 7
		if b[0]&0x80 == 0 {
			break
		}
	}
	body := make([]byte, n)
	_, err = io.ReadFull(r, body)
	require.NoError(t, err)
	return first, body
}

// closedWithin waits for the server to close c; it returns what was read
// before the close.
func closedWithin(t testing.TB, c net.Conn, d time.Duration) []byte {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(d)))
	got, err := io.ReadAll(c)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server did not close the connection")
	return got
}

// bystander is a connected client that must stay healthy: it pings.
func bystander(t testing.TB, addr string) func() {
	t.Helper()
	c := rawConnect(t, addr, connectV4("bystander"))
	return func() {
		t.Helper()
		_, err := c.Write([]byte{0xC0, 0})
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		first, _ := readFrame(t, c)
		require.Equal(t, byte(0xD0), first, "PINGRESP to the bystander")
	}
}

// TestMalformedInputClosesOnlyThatConnection: each kind of bad input closes
// its own connection (MQTT 3 silently [MQTT-4.8.0-1], MQTT 5 with a
// DISCONNECT first when past CONNACK [MQTT-4.13.1-1], nothing before a
// CONNACK [MQTT-3.2.0-2]); a bystander keeps being served.
func TestMalformedInputClosesOnlyThatConnection(t *testing.T) {
	_, addr := start(t, engine.Options{MaxPacketBytes: 4096})
	ping := bystander(t, addr)
	cases := []struct {
		name    string
		connect []byte // sent first, CONNACK expected (nil: none)
		bad     []byte
		v5code  byte // the DISCONNECT reason an MQTT 5 client gets; 0: none expected
	}{
		{"first packet not CONNECT [MQTT-3.1.0-1]", nil, packet(0x30, str("a"), []byte("x")), 0},
		{"reserved type 0", connectV4("r0"), []byte{0x00, 0}, 0},
		{"remaining length of 5 bytes §1.5.5", connectV4("r5"), []byte{0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, 0},
		{"packet over the maximum size", connectV5("big"), append([]byte{0x30}, remLen(10000)...), 0x95},
		{"second CONNECT [MQTT-3.1.0-2]", connectV5("c2"), connectV5("c2"), 0x82},
		{"PUBLISH with a wildcard [MQTT-3.3.2-2]", connectV5("w1"), packet(0x30, str("a/+/b"), []byte{0}, []byte("x")), 0x90},
		{"PUBLISH QoS 3 [MQTT-3.3.1-4]", connectV5("q3"), packet(0x36, str("a"), []byte{0, 1}, []byte{0}), 0x81},
		{"DUP on QoS 0 [MQTT-3.3.1-2]", connectV5("d0"), packet(0x38, str("a"), []byte{0}), 0x81},
		{"QoS 1 packet identifier 0 [MQTT-2.2.1-3]", connectV5("p0"), packet(0x32, str("a"), []byte{0, 0}, []byte{0}), 0x82},
		{"SUBSCRIBE wrong flags [MQTT-3.8.1-1]", connectV5("sf"), packet(0x80, []byte{0, 1, 0}, str("a"), []byte{1}), 0x81},
		{"SUBSCRIBE without options byte [MQTT-3.8.3-1]", connectV5("so"), packet(0x82, []byte{0, 1, 0}, str("a")), 0x81},
		{"SUBSCRIBE without filters [MQTT-3.8.3-3]", connectV5("sn"), packet(0x82, []byte{0, 1, 0}), 0x82},
		{"SUBSCRIBE reserved option bits [MQTT-3.8.3-5]", connectV5("sr"), packet(0x82, []byte{0, 1, 0}, str("a"), []byte{0xC1}), 0x81},
		{"UNSUBSCRIBE without filters [MQTT-3.10.3-2]", connectV5("un"), packet(0xA2, []byte{0, 1, 0}), 0x82},
		{"PUBREL wrong flags [MQTT-3.6.1-1]", connectV5("rf"), packet(0x60, []byte{0, 1}), 0x81},
		{"PINGREQ with a body", connectV5("pb"), []byte{0xC0, 1, 0}, 0x81},
		{"invalid UTF-8 topic [MQTT-1.5.4-1]", connectV5("u8"), packet(0x30, str("a/\xff"), []byte{0}), 0x81},
		{"topic alias 0 [MQTT-3.3.2-8]", connectV5("ta"), packet(0x30, str("a"), []byte{3, 0x23, 0, 0}), 0x94},
		{"unknown topic alias", connectV5("tu"), packet(0x30, str(""), []byte{3, 0x23, 0, 9}), 0x82},
		{"AUTH without a method [MQTT-4.12.0-1]", connectV5("au"), packet(0xF0, []byte{0}), 0x82},
		{"CONNACK from a client", connectV5("ca"), []byte{0x20, 2, 0, 0}, 0x81},
		{"v3 SUBSCRIBE reserved QoS bits [MQTT-3.8.3-4]", connectV4("s4"), packet(0x82, []byte{0, 1}, str("a"), []byte{0x04}), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c net.Conn
			if tc.connect != nil {
				c = rawConnect(t, addr, tc.connect)
			} else {
				var err error
				c, err = net.Dial("tcp", addr)
				require.NoError(t, err)
				defer c.Close()
			}
			_, err := c.Write(tc.bad)
			require.NoError(t, err)
			got := closedWithin(t, c, 5*time.Second)
			if tc.v5code != 0 && tc.connect[6+2] == 5 {
				require.NotEmpty(t, got, "an MQTT 5 client is told why")
				require.Equal(t, byte(0xE0), got[0], "DISCONNECT")
				require.Equal(t, tc.v5code, got[2], "reason code")
			} else {
				require.Empty(t, got, "nothing sent before the close")
			}
			ping()
		})
	}
}

// TestThousandMalformedConnections: a thousand connections in a row, each
// ended by bad input, leave the engine's goroutines and memory where they
// were.
func TestThousandMalformedConnections(t *testing.T) {
	e, addr := start(t, engine.Options{})
	bad := [][]byte{
		packet(0x30, str("a"), []byte("x")),                        // not CONNECT
		append(connectV4("x"), 0x00, 0),                            // reserved type
		append(connectV4("y"), 0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01), // 5-byte length
		{0x10, 0x05, 0, 2, 'Z', 'Z', 4},                            // another protocol
	}
	run := func(n int) {
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < n; i += 8 {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						continue
					}
					_, _ = c.Write(bad[i%len(bad)])
					_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
					_, _ = io.Copy(io.Discard, c)
					_ = c.Close()
				}
			})
		}
		wg.Wait()
	}
	run(100) // warm the pools
	require.Eventually(t, func() bool { return e.Stats().Connected == 0 }, 5*time.Second, 10*time.Millisecond)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	// The pool keeps the goroutines it started (at most Options.Workers):
	// they are not counted against the connections.
	others := func() int { return runtime.NumGoroutine() - e.Stats().Goroutines }
	heap0, g0 := ms.HeapInuse, others()
	run(1000)
	var g int
	ok := assert.Eventually(t, func() bool {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		g = others()
		return g <= g0+2 && ms.HeapInuse < heap0+2<<20
	}, 10*time.Second, 50*time.Millisecond)
	t.Logf("goroutines besides the pool's %d (were %d), heap %d (was %d)", g, g0, ms.HeapInuse, heap0)
	require.True(t, ok)
	ping := bystander(t, addr)
	ping()
	require.Equal(t, "1100", strconv.FormatUint(e.Stats().Counters["protocol_errors"]+e.Stats().Counters["refused"], 10), "every one was refused")
}
