package delay

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

func TestCancelLogTornTailAndDamage(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	keepAll := func(cancelEntry) bool { return true }
	l, live, damaged, err := openCancelLog(dir, keepAll)
	require.NoError(t, err)
	require.Empty(t, live)
	require.Zero(t, damaged)
	var want []cancelEntry
	for i := range 5 {
		e := cancelEntry{id: core.NewCommitLogID(7, int64(i)*100, 60), due: now.Add(time.Duration(i) * time.Hour).UnixNano()}
		require.NoError(t, l.append(e))
		want = append(want, e)
	}
	require.NoError(t, l.close())
	path := filepath.Join(dir, cancelFile)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Len(t, b, 5*cancelRecordLen)

	// A bit flip in record 2 and a torn sixth record.
	b[2*cancelRecordLen+10] ^= 0x40
	b = append(b, appendCancelRecord(nil, cancelEntry{id: core.NewCommitLogID(7, 999, 1)})[:13]...)
	require.NoError(t, os.WriteFile(path, b, 0o644))

	// Expired entries are dropped at open, and the file is rewritten.
	l, live, damaged, err = openCancelLog(dir, func(e cancelEntry) bool { return e.due != want[4].due })
	require.NoError(t, err)
	require.Equal(t, 1, damaged)
	require.Equal(t, []cancelEntry{want[0], want[1], want[3]}, live)
	require.NoError(t, l.close())
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Len(t, b, 3*cancelRecordLen)
}

func FuzzDecodeCancelLog(f *testing.F) {
	rec := appendCancelRecord(nil, cancelEntry{id: core.NewCommitLogID(1, 42, 100), due: 1_800_000_000_000_000_000})
	f.Add(rec)
	f.Add(append(rec, rec[:7]...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, whole, damaged := decodeCancelLog(b)
		if whole > len(b) || whole%cancelRecordLen != 0 {
			t.Fatalf("whole %d of %d bytes", whole, len(b))
		}
		if len(entries)+damaged != whole/cancelRecordLen {
			t.Fatalf("%d entries + %d damaged for %d records", len(entries), damaged, whole/cancelRecordLen)
		}
		var again []byte
		for _, e := range entries {
			again = appendCancelRecord(again, e)
		}
		if e2, _, d2 := decodeCancelLog(again); d2 != 0 || len(e2) != len(entries) {
			t.Fatalf("re-encoded entries do not decode")
		}
	})
}
