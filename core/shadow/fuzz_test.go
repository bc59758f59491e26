package shadow

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The seed corpora live in testdata/fuzz/FuzzDecodeRequest,
// testdata/fuzz/FuzzDecodeEvent and testdata/fuzz/FuzzDecodeSnapshot:
// valid inputs, cut ones, wrong types, absurd nesting and lengths.

// FuzzDecodeRequest: any bytes give an update or ErrBadRequest /
// ErrTooLarge, never a panic; an update applies to an empty document and
// to one with state, and the result is within the limits or refused.
func FuzzDecodeRequest(f *testing.F) {
	lim := Limits{MaxBytes: 512, MaxDepth: 4}
	s, err := newService(Options{Limits: lim})
	require.NoError(f, err)
	base := &Event{ClientID: "d", Op: OpUpdate, Version: 3, Shadow: &Document{Version: 3,
		State: State{Desired: map[string]any{"a": json.Number("1"), "o": map[string]any{"x": "y"}}}}}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, sec := range []Section{Desired, Reported} {
			u, err := DecodeRequest(b, sec, lim)
			if err != nil {
				require.True(t, errors.Is(err, ErrBadRequest) || errors.Is(err, ErrTooLarge), "%v", err)
				continue
			}
			for _, cur := range []*Event{nil, base} {
				ev, err := s.apply(cur, "d", u, 1)
				if err != nil {
					require.True(t, errors.Is(err, ErrTooLarge) || errors.Is(err, ErrVersionConflict) || errors.Is(err, ErrBadRequest), "%v", err)
					continue
				}
				require.LessOrEqual(t, ev.Shadow.stateBytes(), lim.MaxBytes)
				body, err := EncodeEvent(ev)
				require.NoError(t, err)
				back, err := DecodeEvent(body)
				require.NoError(t, err, "an accepted event decodes")
				require.Equal(t, ev.Version, back.Version)
			}
		}
	})
}

// FuzzDecodeEvent: a stored or consumed event decodes or is ErrCorrupt.
func FuzzDecodeEvent(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := DecodeEvent(b)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		require.NotEmpty(t, ev.ClientID)
		require.GreaterOrEqual(t, ev.Version, int64(1))
	})
}

// FuzzDecodeDocument: a document answer decodes or is ErrCorrupt.
func FuzzDecodeDocument(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDocument(b)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		require.GreaterOrEqual(t, d.Version, int64(1))
	})
}

// FuzzDecodeSnapshot: the snapshot file decodes or is ErrCorrupt. Each
// input is tried as a body behind a sound header too, so that the fuzzer
// gets past the CRC.
func FuzzDecodeSnapshot(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, in := range [][]byte{b, withHeader(b)} {
			s, err := decodeSnapshot(in)
			if err != nil {
				require.ErrorIs(t, err, ErrCorrupt)
				continue
			}
			for _, o := range s.Offsets {
				require.GreaterOrEqual(t, o, int64(0))
			}
		}
	})
}

// withHeader puts a sound header in front of body.
func withHeader(body []byte) []byte {
	out, _ := encodeSnapshot(&snapshotBody{})
	out = out[:snapshotHeader]
	fixed, _ := encodeSnapshotBody(body)
	return append(out[:8:8], fixed...)
}

// encodeSnapshotBody is the length, CRC and body of a raw body.
func encodeSnapshotBody(body []byte) ([]byte, error) {
	out := make([]byte, 8, 8+len(body))
	putLenCRC(out, body)
	return append(out, body...), nil
}

// TestFuzzSeedsHoldValidInputs keeps the corpora honest: the first seed
// of each decodes (a corpus of only bad inputs would never reach the
// decoders' later checks).
func TestFuzzSeedsHoldValidInputs(t *testing.T) {
	for name, decode := range map[string]func([]byte) error{
		"FuzzDecodeRequest":  func(b []byte) error { _, err := DecodeRequest(b, Reported, Limits{}); return err },
		"FuzzDecodeEvent":    func(b []byte) error { _, err := DecodeEvent(b); return err },
		"FuzzDecodeDocument": func(b []byte) error { _, err := DecodeDocument(b); return err },
		"FuzzDecodeSnapshot": func(b []byte) error { _, err := decodeSnapshot(b); return err },
	} {
		raw, err := os.ReadFile(filepath.Join("testdata", "fuzz", name, "seed-00"))
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		require.Len(t, lines, 2, name)
		lit, ok := strings.CutPrefix(lines[1], "[]byte(")
		require.True(t, ok, name)
		b, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
		require.NoError(t, err, name)
		require.NoError(t, decode([]byte(b)), name)
	}
}
