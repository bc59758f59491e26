package engine_test

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// TestLargePacketsLeaveNoBuffers: eight MQTT 3.1.1 clients each publish a
// 4 MiB payload (the default maximum packet size allows it) to a ninth that
// receives all eight; afterwards the engine holds no buffer of that size
// for any of the nine connections (read side: the packet being assembled;
// write side: the queue the socket has not taken): its heap, after two
// garbage collections (the buffer pools are emptied), is within 2 MiB of
// what it was before, where a single kept buffer would add 4 MiB. Idle
// memory per connection is the engine's key figure
// (BenchmarkIdleConnectionMemory); a large message must not raise it.
func TestLargePacketsLeaveNoBuffers(t *testing.T) {
	_, addr := start(t, engine.Options{})
	const publishers, size = 8, 4 << 20
	sub := rawConnect(t, addr, connectV4("sub"))
	_, err := sub.Write(packet(0x82, []byte{0, 1}, str("big/#"), []byte{0}))
	require.NoError(t, err)
	typ, _ := readFrame(t, sub)
	require.Equal(t, byte(0x90), typ, "SUBACK")
	pubs := make([]interface{ Write([]byte) (int, error) }, publishers)
	for i := range pubs {
		pubs[i] = rawConnect(t, addr, connectV4("pub-"+strconv.Itoa(i)))
	}

	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	before := heap()

	// One at a time: QoS 0 to a subscriber whose write queue holds 16 MiB
	// (MaxPendingBytes) would be dropped, by design, were all eight sent
	// at once.
	require.NoError(t, sub.SetReadDeadline(time.Now().Add(30*time.Second)))
	for i, p := range pubs {
		done := make(chan error, 1)
		go func() {
			payload := make([]byte, size)
			payload[0], payload[size-1] = byte(i), byte(i)
			_, err := p.Write(packet(0x30, str("big/"+strconv.Itoa(i)), payload))
			done <- err
		}()
		typ, body := readFrame(t, sub)
		require.Equal(t, byte(0x30), typ, "PUBLISH")
		require.Len(t, body, 2+len("big/0")+size)
		require.Equal(t, []byte{byte(i), byte(i)}, []byte{body[2+len("big/0")], body[len(body)-1]})
		require.NoError(t, <-done)
	}
	after := heap()
	t.Logf("engine heap before %d B, after %d B", before, after)
	require.Less(t, int64(after)-int64(before), int64(2<<20),
		"a connection kept a buffer of a 4 MiB packet (heap %d B before, %d B after)", before, after)
}
