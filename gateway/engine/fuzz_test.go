package engine_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// FuzzEngine drives a real engine over a real connection with a sequence
// of packets: a CONNECT (MQTT 3.1.1 or 5, chosen by the first byte),
// then the rest of the input as the client's byte stream — any mix of
// valid, truncated and malformed packets. Whatever it is, the engine must
// not crash, must end or keep the connection without hanging, and must
// still serve a fresh client afterwards. The seed corpus
// (testdata/fuzz/FuzzEngine) holds sequences of valid packets (subscribe,
// publish at every QoS with their acks, retained, topic aliases, will,
// ping, unsubscribe, disconnect) and variants broken at one point.
//
//	go test -run '^$' -fuzz FuzzEngine -fuzztime 60s ./gateway/engine/
func FuzzEngine(f *testing.F) {
	for _, s := range seedSequences() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		addr := fuzzEngine(t)
		if len(in) == 0 {
			return
		}
		connect := connectV4("fuzz")
		if in[0]&1 == 1 {
			connect = connectV5("fuzz")
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write(append(connect, in[1:]...)); err != nil {
			return // the engine closed the connection early: fine
		}
		// Read what comes until the engine closes or goes quiet.
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, _ = io.Copy(io.Discard, c)
		_ = c.Close()

		// A fresh client is still served.
		h, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		_ = h.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := h.Write(append(connectV4("healthy"), 0xC0, 0)); err != nil {
			t.Fatal(err)
		}
		var got [6]byte
		if _, err := io.ReadFull(h, got[:]); err != nil {
			t.Fatalf("a fresh client got no CONNACK and PINGRESP: %v", err)
		}
		if got[0] != 0x20 || got[4] != 0xD0 {
			t.Fatalf("a fresh client got %x", got)
		}
	})
}

var (
	fuzzOnce sync.Once
	fuzzAddr string
)

// fuzzEngine is one engine for the whole fuzz run (starting one per input
// would dominate the run); it is shut down when the test binary's last
// fuzz test ends — goleak is not run by the fuzzer's workers.
func fuzzEngine(t *testing.T) string {
	fuzzOnce.Do(func() {
		e, err := engine.New(engine.Options{Listeners: []engine.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}},
			MaxPacketBytes: 64 << 10, MaxQueued: 64, MaxQueuedOnline: 64, ConnectTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(); err != nil {
			t.Fatal(err)
		}
		fuzzAddr = e.Addr("tcp").String()
		fuzzShutdown = func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.Shutdown(ctx)
		}
	})
	return fuzzAddr
}

var fuzzShutdown = func() {}

// seedSequences are the seed corpus: valid packet sequences and broken ones.
func seedSequences() [][]byte {
	sub4 := packet(0x82, []byte{0, 1}, str("a/#"), []byte{2})
	sub5 := packet(0x82, []byte{0, 1, 0}, str("a/#"), []byte{2})
	pub0 := packet(0x30, str("a/b"), []byte("zero"))
	pub1 := packet(0x32, str("a/b"), []byte{0, 2}, []byte("one"))
	pub2 := packet(0x34, str("a/b"), []byte{0, 3}, []byte("two"))
	rel := packet(0x62, []byte{0, 3})
	ret := packet(0x31, str("a/r"), []byte("kept"))
	ack := packet(0x40, []byte{0, 1})
	rec := packet(0x50, []byte{0, 2})
	comp := packet(0x70, []byte{0, 2})
	ping := []byte{0xC0, 0}
	unsub4 := packet(0xA2, []byte{0, 4}, str("a/#"))
	disc := []byte{0xE0, 0}
	pub5 := packet(0x32, str("a/b"), []byte{0, 2, 0}, []byte("one"))
	alias := packet(0x30, str("a/alias"), []byte{3, 0x23, 0, 1}, []byte("set"))
	useAlias := packet(0x30, str(""), []byte{3, 0x23, 0, 1}, []byte("use"))
	v4 := func(ps ...[]byte) []byte { return append([]byte{0}, bytes.Join(ps, nil)...) }
	v5 := func(ps ...[]byte) []byte { return append([]byte{1}, bytes.Join(ps, nil)...) }
	seeds := [][]byte{
		v4(sub4, pub0, pub1, pub2, rel, ret, ack, rec, comp, ping, unsub4, disc),
		v5(sub5, pub5, alias, useAlias, ping, disc),
		v4(sub4, pub1[:len(pub1)-1]),                     // truncated
		v4(pub1, pub1, pub1, rel, rel),                   // duplicates
		v5(sub5, []byte{0x82, 0x04, 0, 1, 0, 0}),         // filter length overruns
		v4([]byte{0x30, 0xFF, 0xFF, 0xFF, 0x7F}),         // 268 MB announced
		v5(packet(0x30, str(""), []byte{3, 0x23, 0, 9})), // unknown alias
		v4(packet(0x10, str("MQTT"), []byte{4, 2, 0, 60}, str("again"))),
		v5(packet(0xF0, []byte{0x18, 0})), // AUTH
		v4(ping, ping, ping, ping),
	}
	return seeds
}

var update = flag.Bool("update", false, "rewrite the checked-in fuzz seed corpus")

// TestFuzzSeedsCheckedIn keeps testdata/fuzz/FuzzEngine the seeds above
// (go test -run TestFuzzSeedsCheckedIn -update ./gateway/engine/ rewrites
// it).
func TestFuzzSeedsCheckedIn(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzEngine")
	seeds := seedSequences()
	if *update {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for i, s := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644))
		}
	}
	for i, s := range seeds {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)))
		require.NoError(t, err, "run with -update")
		require.Equal(t, fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s), string(b), "seed %d", i)
	}
}
