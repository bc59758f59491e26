package bucket

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/shadow"
)

// The seed corpus lives in testdata/fuzz/FuzzDecodeRecord: a valid
// record, one of a delete, wrong types, no event, cut and empty input.

// FuzzDecodeRecord: a bucket record decodes or is shadow.ErrCorrupt, and
// what decodes encodes back to a record that decodes alike.
func FuzzDecodeRecord(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err != nil {
			require.ErrorIs(t, err, shadow.ErrCorrupt)
			return
		}
		again, err := encodeRecord(r.Event, r.Appended)
		require.NoError(t, err)
		back, err := decodeRecord(again)
		require.NoError(t, err)
		require.Equal(t, r.Event.Version, back.Event.Version)
		require.Equal(t, r.Appended, back.Appended)
	})
}

// TestFuzzSeedHoldsAValidRecord keeps the corpus honest: its first seed
// decodes.
func TestFuzzSeedHoldsAValidRecord(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "fuzz", "FuzzDecodeRecord", "seed-00"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.Len(t, lines, 2)
	lit, ok := strings.CutPrefix(lines[1], "[]byte(")
	require.True(t, ok)
	b, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
	require.NoError(t, err)
	r, err := decodeRecord([]byte(b))
	require.NoError(t, err)
	require.True(t, r.Appended)
}
