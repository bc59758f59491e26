package session

import (
	"testing"

	"github.com/stretchr/testify/require"
)

const testNonce = 0x0123456789ABCDEF

func TestRecordRoundTrip(t *testing.T) {
	b := appendRecord(nil, testNonce, opPut, clientKey("car-7"), []byte("value"))
	b = appendRecord(b, testNonce, opDelete, subKey("car-7", "a/b"), nil)
	op, k, v, n, err := decodeRecord(b, testNonce)
	require.NoError(t, err)
	require.Equal(t, byte(opPut), op)
	require.Equal(t, clientKey("car-7"), k)
	require.Equal(t, "value", string(v))
	require.Equal(t, recordSize(clientKey("car-7"), []byte("value")), n)
	op, k, v, m, err := decodeRecord(b[n:], testNonce)
	require.NoError(t, err)
	require.Equal(t, byte(opDelete), op)
	require.Equal(t, subKey("car-7", "a/b"), k)
	require.Empty(t, v)
	require.Equal(t, len(b), n+m)
}

// Checks run magic → version → length bounds → CRC → body, and a record
// cut by the end of the data is torn, not corrupt.
func TestDecodeRecordChecks(t *testing.T) {
	good := appendRecord(nil, testNonce, opPut, clientKey("k"), []byte("value"))
	for name, c := range map[string]struct {
		mutate func([]byte) []byte
		want   error
	}{
		"empty":          {func([]byte) []byte { return nil }, ErrTorn},
		"bad magic":      {func(b []byte) []byte { b[0] = 0xF5; return b }, ErrCorrupt},
		"short header":   {func(b []byte) []byte { return b[:7] }, ErrTorn},
		"version 2":      {func(b []byte) []byte { b[1] = 2; return b }, ErrVersion},
		"length 0":       {func(b []byte) []byte { b[2], b[3], b[4], b[5] = 0, 0, 0, 0; return b }, ErrCorrupt},
		"huge length":    {func(b []byte) []byte { b[2] = 0x7F; return b }, ErrCorrupt},
		"cut body":       {func(b []byte) []byte { return b[:len(b)-1] }, ErrTorn},
		"bit flip":       {func(b []byte) []byte { b[len(b)-1] ^= 1; return b }, ErrCorrupt},
		"other nonce":    {func(b []byte) []byte { return appendRecord(nil, 7, opPut, clientKey("k"), []byte("value")) }, ErrCorrupt},
		"bad op":         {func(b []byte) []byte { b[recHeader] = 9; return fixCRC(b) }, ErrCorrupt},
		"key overrun":    {func(b []byte) []byte { b[recHeader+1], b[recHeader+2] = 0xFF, 0xFF; return fixCRC(b) }, ErrCorrupt},
		"delete w/value": {func(b []byte) []byte { b[recHeader] = opDelete; return fixCRC(b) }, ErrCorrupt},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, _, _, err := decodeRecord(c.mutate(append([]byte(nil), good...)), testNonce)
			require.ErrorIs(t, err, c.want)
		})
	}
}

func fixCRC(b []byte) []byte {
	c := recordCRC(testNonce, b)
	b[6], b[7], b[8], b[9] = byte(c>>24), byte(c>>16), byte(c>>8), byte(c)
	return b
}

func TestHeaderChecks(t *testing.T) {
	h := appendHeader(nil, testNonce)
	n, err := decodeHeader(h)
	require.NoError(t, err)
	require.Equal(t, uint64(testNonce), n)
	for name, c := range map[string]struct {
		mutate func([]byte) []byte
		want   error
	}{
		"short":           {func(b []byte) []byte { return b[:10] }, ErrCorrupt},
		"mochi-era log":   {func(b []byte) []byte { return append([]byte{0xF5}, b[1:]...) }, ErrNotSessionLog},
		"version 9":       {func(b []byte) []byte { b[4] = 9; return b }, ErrVersion},
		"nonce bit flip":  {func(b []byte) []byte { b[9] ^= 1; return b }, ErrCorrupt},
		"reserved is set": {func(b []byte) []byte { b[6] = 1; return b }, ErrCorrupt},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := decodeHeader(c.mutate(append([]byte(nil), h...)))
			require.ErrorIs(t, err, c.want)
		})
	}
}

// replay resyncs past damage and reports where a damaged tail starts.
func TestReplayResyncs(t *testing.T) {
	var b []byte
	var offs []int
	for _, id := range []string{"a", "b", "c"} {
		offs = append(offs, len(b))
		b = appendRecord(b, testNonce, opPut, clientKey(id), []byte{valueVersion})
	}
	b[offs[1]+recHeader+4] ^= 0xFF // damage b's key
	tail := len(b)
	b = append(b, appendRecord(nil, testNonce, opPut, clientKey("d"), []byte{1})[:12]...)
	var keys []string
	var bad []int64
	end := replay(b, 100, testNonce, func(_ byte, k string, _ []byte, off int64, _ int) {
		keys = append(keys, k)
	}, func(off int64, _ error) { bad = append(bad, off) })
	require.Equal(t, []string{clientKey("a"), clientKey("c")}, keys)
	require.Equal(t, []int64{100 + int64(offs[1]), 100 + int64(tail)}, bad)
	require.Equal(t, int64(100+tail), end, "the torn tail is where the next record goes")
}
