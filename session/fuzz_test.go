package session

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// Fuzz targets: one per decoder. Each never panics on any input, and what
// it accepts is canonical — encoding it again gives the same bytes. Their
// seed corpora are checked in under testdata/fuzz/<target>/: seeds named
// ok-* decode, seeds named bad-* are refused; TestFuzzSeeds keeps them so
// (go test -run TestFuzzSeeds -update rewrites them from fuzzSeeds).

var update = flag.Bool("update", false, "rewrite the fuzz seed corpora under testdata/fuzz")

func FuzzDecodeRecord(f *testing.F) {
	addSeeds(f, "FuzzDecodeRecord")
	f.Fuzz(func(t *testing.T, b []byte) {
		op, k, v, n, err := decodeRecord(b, testNonce)
		if err != nil {
			return
		}
		require.Equal(t, b[:n], appendRecord(nil, testNonce, op, k, v))
	})
}

func FuzzReplay(f *testing.F) {
	addSeeds(f, "FuzzReplay")
	f.Fuzz(func(t *testing.T, b []byte) {
		last := int64(-1)
		end := replay(b, 0, testNonce, func(_ byte, k string, _ []byte, off int64, n int) {
			require.Greater(t, off, last, "in order")
			last = off
			_, got, _, m, err := decodeRecord(b[off:], testNonce)
			require.NoError(t, err)
			require.Equal(t, k, got)
			require.Equal(t, n, m)
		}, func(int64, error) {})
		require.LessOrEqual(t, end, int64(len(b)))
		require.GreaterOrEqual(t, end, last)
	})
}

func FuzzDecodeHeader(f *testing.F) {
	addSeeds(f, "FuzzDecodeHeader")
	f.Fuzz(func(t *testing.T, b []byte) {
		if nonce, err := decodeHeader(b); err == nil {
			require.Equal(t, b[:headerSize], appendHeader(nil, nonce))
		}
	})
}

func FuzzParseKey(f *testing.F) {
	addSeeds(f, "FuzzParseKey")
	f.Fuzz(func(t *testing.T, s string) {
		if k, err := parseKey(s); err == nil {
			require.Equal(t, s, k.String())
		}
	})
}

func FuzzDecodeClient(f *testing.F) {
	addSeeds(f, "FuzzDecodeClient")
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeClient("c", b)
		if err != nil {
			return
		}
		again, err := encodeClient(&c, freshClient(b))
		require.NoError(t, err)
		require.Equal(t, b, again)
	})
}

func FuzzDecodeSubscription(f *testing.F) {
	addSeeds(f, "FuzzDecodeSubscription")
	f.Fuzz(func(t *testing.T, b []byte) {
		filter, o, err := decodeSub(b)
		if err != nil {
			return
		}
		again, err := encodeSub(filter, o)
		require.NoError(t, err)
		require.Equal(t, b, again)
	})
}

func FuzzDecodeMessage(f *testing.F) {
	addSeeds(f, "FuzzDecodeMessage")
	f.Fuzz(func(t *testing.T, b []byte) {
		m, ids, err := decodeMessage(b)
		if err != nil {
			return
		}
		again, err := encodeMessage(m, ids)
		require.NoError(t, err)
		require.Equal(t, b, again)
	})
}

func FuzzDecodeRetained(f *testing.F) {
	addSeeds(f, "FuzzDecodeRetained")
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeRetained(b)
		if err != nil {
			return
		}
		again, err := encodeRetained(m)
		require.NoError(t, err)
		require.Equal(t, b, again)
	})
}

func FuzzDecodeOffline(f *testing.F) {
	addSeeds(f, "FuzzDecodeOffline")
	f.Fuzz(func(t *testing.T, b []byte) {
		if at, err := decodeOffline(b); err == nil {
			require.Equal(t, b, encodeOffline(at))
		}
	})
}

func FuzzDecodeMarker(f *testing.F) {
	addSeeds(f, "FuzzDecodeMarker")
	f.Fuzz(func(t *testing.T, b []byte) {
		if decodeMarker(b) == nil {
			require.Equal(t, markerValue, b)
		}
	})
}

// FuzzDecodeInbound: an inbound QoS 2 value that decodes encodes back to
// itself (a bare marker when answered).
func FuzzDecodeInbound(f *testing.F) {
	addSeeds(f, "FuzzDecodeInbound")
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := decodeInbound(b)
		switch {
		case err != nil:
		case id == 0:
			require.Equal(t, markerValue, b)
		default:
			require.Equal(t, b, encodeInbound(id))
		}
	})
}

func FuzzDecodeOwner(f *testing.F) {
	addSeeds(f, "FuzzDecodeOwner")
	f.Fuzz(func(t *testing.T, b []byte) {
		if o, err := decodeOwner(b); err == nil {
			require.Equal(t, b, encodeOwner(o))
			require.NotEmpty(t, o.node)
		}
	})
}

// FuzzStoreKey: a bucket key read with its value maps to a store key that
// maps back to it.
func FuzzStoreKey(f *testing.F) {
	addSeeds(f, "FuzzStoreKey")
	f.Fuzz(func(t *testing.T, bk string, value []byte) {
		if k, err := storeKey("dev", bk, value); err == nil {
			require.Equal(t, "dev", k.id)
			require.Equal(t, bk, bucketKey(k))
		}
	})
}

// fuzzDecoders run each target's decoder once, for TestFuzzSeeds.
var fuzzDecoders = map[string]func(args []any) error{
	"FuzzDecodeRecord": func(a []any) error { _, _, _, _, err := decodeRecord(a[0].([]byte), testNonce); return err },
	"FuzzReplay": func(a []any) error {
		b := a[0].([]byte)
		var bad error
		end := replay(b, 0, testNonce, func(byte, string, []byte, int64, int) {}, func(_ int64, err error) {
			if bad == nil {
				bad = err
			}
		})
		if bad == nil && end != int64(len(b)) {
			bad = fmt.Errorf("ends at %d of %d", end, len(b))
		}
		return bad
	},
	"FuzzDecodeHeader":       func(a []any) error { _, err := decodeHeader(a[0].([]byte)); return err },
	"FuzzParseKey":           func(a []any) error { _, err := parseKey(a[0].(string)); return err },
	"FuzzDecodeClient":       func(a []any) error { _, err := decodeClient("c", a[0].([]byte)); return err },
	"FuzzDecodeSubscription": func(a []any) error { _, _, err := decodeSub(a[0].([]byte)); return err },
	"FuzzDecodeMessage":      func(a []any) error { _, _, err := decodeMessage(a[0].([]byte)); return err },
	"FuzzDecodeRetained":     func(a []any) error { _, err := decodeRetained(a[0].([]byte)); return err },
	"FuzzDecodeOffline":      func(a []any) error { _, err := decodeOffline(a[0].([]byte)); return err },
	"FuzzDecodeMarker":       func(a []any) error { return decodeMarker(a[0].([]byte)) },
	"FuzzDecodeInbound":      func(a []any) error { _, err := decodeInbound(a[0].([]byte)); return err },
	"FuzzDecodeOwner":        func(a []any) error { _, err := decodeOwner(a[0].([]byte)); return err },
	"FuzzStoreKey":           func(a []any) error { _, err := storeKey("dev", a[0].(string), a[1].([]byte)); return err },
}

// fuzzSeeds are the seed corpora: name → file → arguments.
func fuzzSeeds() map[string]map[string][]any {
	must := func(b []byte, err error) []byte {
		if err != nil {
			panic(err)
		}
		return b
	}
	rec := appendRecord(nil, testNonce, opPut, clientKey("car-7"), must(encodeClient(&engine.ClientRecord{ID: "car-7", Protocol: 4, Expiry: 60}, true)))
	del := appendRecord(nil, testNonce, opDelete, clientKey("car-7"), nil)
	client := must(encodeClient(&engine.ClientRecord{ID: "c", Username: "u", Protocol: 5, Expiry: 300, Will: fullMessage(), WillDelay: 5, WillExpiry: 9}, false))
	sub := must(encodeSub("cars/+/cmd", topictree.Options{QoS: 2, NoLocal: true, RetainAsPublished: true, RetainHandling: 1, Identifier: 7}))
	msg := must(encodeMessage(fullMessage(), []uint32{3, 7}))
	ret := must(encodeRetained(fullMessage()))
	subDev := must(encodeSub("x/#", topictree.Options{QoS: 1}))
	with := func(b []byte, i int, v byte) []byte { b = append([]byte(nil), b...); b[i] = v; return b }
	return map[string]map[string][]any{
		"FuzzDecodeRecord": {
			"ok-put": {rec}, "ok-delete": {del},
			"bad-torn": {rec[:len(rec)-3]}, "bad-crc": {with(rec, len(rec)-1, rec[len(rec)-1]^1)},
			"bad-version": {with(rec, 1, 2)}, "bad-mochi-era": {with(rec, 0, 0xF5)},
		},
		"FuzzReplay": {
			"ok-two":            {append(append([]byte(nil), rec...), del...)},
			"bad-damaged-first": {append(with(rec, 12, 0), del...)},
			"bad-torn-tail":     {append(append([]byte(nil), rec...), del[:5]...)},
		},
		"FuzzDecodeHeader": {
			"ok-header": {appendHeader(nil, testNonce)}, "bad-nonce-flip": {with(appendHeader(nil, testNonce), 10, 0)},
			"bad-magic": {with(appendHeader(nil, testNonce), 0, 0xF5)}, "bad-version": {with(appendHeader(nil, testNonce), 4, 2)},
		},
		"FuzzParseKey": {
			"ok-client": {clientKey("car-7")}, "ok-sub": {subKey("car-7", "a/#")}, "ok-message": {pidKey(kMessage, "a\x00b", 7)},
			"ok-retained": {retainedKey("home/t")}, "bad-short-id": {"c\x00\x09ab"}, "bad-kind": {"z\x00\x00"},
			"bad-pid": {"m\x00\x01a\x07"},
		},
		"FuzzDecodeClient": {
			"ok-with-will": {client}, "ok-new": {must(encodeClient(&engine.ClientRecord{ID: "c", Protocol: 4, Expiry: 1}, true))},
			"bad-protocol": {with(client, 2, 9)}, "bad-flags": {with(client, 1, 0x80)}, "bad-cut": {client[:len(client)-1]},
			"bad-mochi-json": {[]byte(`{"id":"c","t":"client"}`)},
		},
		"FuzzDecodeSubscription": {
			"ok-v5-options": {sub}, "bad-qos-3": {with(sub, 1, 0x03)}, "bad-retain-handling-3": {with(sub, 1, 0x30)},
			"bad-empty-filter": {[]byte{valueVersion, 1, 0, 0, 0, 0, 0, 0}}, "bad-version": {with(sub, 0, 2)},
		},
		"FuzzDecodeMessage": {
			"ok-full": {msg}, "ok-plain": {must(encodeMessage(&engine.Message{Topic: "t", QoS: 1}, nil))},
			"bad-zero-sub-id": {must(encodeMessage(fullMessage(), []uint32{0}))}, "bad-trailing": {append(append([]byte(nil), msg...), 0)},
			"bad-huge-payload": {hugePayload(must(encodeMessage(&engine.Message{Topic: "t", QoS: 1}, nil)))},
		},
		"FuzzDecodeRetained": {
			"ok-full": {ret}, "bad-no-payload": {append([]byte{valueVersion}, must(encodeMessage(&engine.Message{Topic: "t"}, nil))[3:]...)},
			"bad-cut": {ret[:20]},
		},
		"FuzzDecodeOffline": {
			"ok-since": {encodeOffline(time.Unix(1_800_000_000, 5))}, "bad-negative": {[]byte{1, 0xFF, 0, 0, 0, 0, 0, 0, 0}},
			"bad-short": {[]byte{1, 0}},
		},
		"FuzzDecodeMarker": {"ok-marker": {markerValue}, "bad-empty": {[]byte{}}, "bad-long": {[]byte{1, 1}}},
		"FuzzDecodeInbound": {
			"ok-taken": {encodeInbound(1_800_000_000_000_000_001)}, "ok-answered": {markerValue},
			"bad-zero-id": {[]byte{1, 0, 0, 0, 0, 0, 0, 0, 0}}, "bad-short": {[]byte{1, 0, 0, 1}}, "bad-empty": {[]byte{}},
			"bad-trailing": {append(encodeInbound(5), 0)}, "bad-version": {[]byte{2, 0, 0, 0, 0, 0, 0, 0, 5}},
		},
		"FuzzDecodeOwner": {
			"ok-owner":      {encodeOwner(owner{gen: 1, inc: 2, since: 3, node: "gw-1", id: "dev"})},
			"ok-unicode":    {encodeOwner(owner{gen: 9, inc: 8, since: 7, node: "gw-ü", id: "車/🚗"})},
			"bad-truncated": {[]byte{ownerMagic, ownerVersion, 0xFF}},
			"bad-zero-node": {encodeOwner(owner{id: "dev"})},
			"bad-version":   {with(encodeOwner(owner{node: "n", id: "dev"}), 1, 2)},
		},
		"FuzzStoreKey": {
			"ok-client": {kvClient + token("dev"), []byte{1}}, "ok-sub": {kvSub + token("dev") + "." + token("x/#"), subDev},
			"ok-message":    {kvMessage + token("dev") + ".00ff", msg},
			"bad-upper-hex": {kvMessage + token("dev") + ".00FF", msg}, "bad-other-filter": {kvSub + token("dev") + "." + token("y"), subDev},
			"bad-other-client": {kvClient + token("eve"), []byte{1}},
		},
	}
}

// hugePayload sets the payload length of a plain message value (topic
// "t", no origin or ref) past the format's bound.
func hugePayload(b []byte) []byte {
	b = append([]byte(nil), b...)
	copy(b[27:31], []byte{0xFF, 0xFF, 0xFF, 0xFF})
	return b
}

// TestFuzzSeeds: every checked-in seed decodes (ok-*) or is refused
// (bad-*) as its name says, and every seed of fuzzSeeds is checked in.
func TestFuzzSeeds(t *testing.T) {
	seeds := fuzzSeeds()
	if *update {
		for name, files := range seeds {
			dir := filepath.Join("testdata", "fuzz", name)
			require.NoError(t, os.RemoveAll(dir))
			require.NoError(t, os.MkdirAll(dir, 0o755))
			for file, args := range files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, file), encodeCorpus(args), 0o644))
			}
		}
	}
	for name, decode := range fuzzDecoders {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", "fuzz", name)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err, "seed corpus of %s", name)
			require.Len(t, entries, len(seeds[name]), "the corpus is fuzzSeeds' (go test -run TestFuzzSeeds -update)")
			for _, e := range entries {
				b, err := os.ReadFile(filepath.Join(dir, e.Name()))
				require.NoError(t, err)
				args, err := decodeCorpus(b)
				require.NoError(t, err, e.Name())
				require.Equal(t, seeds[name][e.Name()], args, "%s differs from fuzzSeeds", e.Name())
				err = decode(args)
				switch {
				case strings.HasPrefix(e.Name(), "ok-"):
					require.NoError(t, err, e.Name())
				case strings.HasPrefix(e.Name(), "bad-"):
					require.Error(t, err, e.Name())
				default:
					t.Fatalf("seed %s: name it ok-… or bad-…", e.Name())
				}
			}
		})
	}
}

// encodeCorpus writes args in the go test fuzz v1 corpus format.
func encodeCorpus(args []any) []byte {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%s)\n", strconv.Quote(string(v)))
		case string:
			fmt.Fprintf(&b, "string(%s)\n", strconv.Quote(v))
		}
	}
	return b.Bytes()
}

// decodeCorpus reads what encodeCorpus writes.
func decodeCorpus(b []byte) ([]any, error) {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) == 0 || lines[0] != "go test fuzz v1" {
		return nil, fmt.Errorf("not a fuzz corpus file")
	}
	var out []any
	for _, l := range lines[1:] {
		switch {
		case strings.HasPrefix(l, "[]byte(") && strings.HasSuffix(l, ")"):
			s, err := strconv.Unquote(l[len("[]byte(") : len(l)-1])
			if err != nil {
				return nil, err
			}
			out = append(out, []byte(s))
		case strings.HasPrefix(l, "string(") && strings.HasSuffix(l, ")"):
			s, err := strconv.Unquote(l[len("string(") : len(l)-1])
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		default:
			return nil, fmt.Errorf("line %q", l)
		}
	}
	return out, nil
}

// addSeeds adds a target's checked-in seeds (go test -fuzz reads them from
// testdata/fuzz too; this keeps them in plain go test runs of the target).
func addSeeds(f *testing.F, name string) {
	for _, args := range fuzzSeeds()[name] {
		f.Add(args...)
	}
}
