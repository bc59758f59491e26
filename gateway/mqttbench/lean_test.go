package mqttbench

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAppendConnect(t *testing.T) {
	got := appendConnect(nil, "dev-1", 300, true, "", "")
	want := []byte{
		0x10, 17, // CONNECT, remaining length 10 + 2 + 5
		0, 4, 'M', 'Q', 'T', 'T', 4, // protocol name, level 3.1.1
		0x02,       // clean session
		0x01, 0x2C, // keep alive 300 s
		0, 5, 'd', 'e', 'v', '-', '1',
	}
	require.Equal(t, want, got)
	require.Equal(t, byte(0x00), appendConnect(nil, "x", 0, false, "", "")[9], "no flags without clean session")
}

func TestAppendVarint(t *testing.T) {
	// The boundaries of MQTT 3.1.1 §2.2.3, table 2.4.
	for _, c := range []struct {
		n    int
		want []byte
	}{
		{0, []byte{0x00}},
		{127, []byte{0x7F}},
		{128, []byte{0x80, 0x01}},
		{16_383, []byte{0xFF, 0x7F}},
		{16_384, []byte{0x80, 0x80, 0x01}},
		{2_097_151, []byte{0xFF, 0xFF, 0x7F}},
		{2_097_152, []byte{0x80, 0x80, 0x80, 0x01}},
		{268_435_455, []byte{0xFF, 0xFF, 0xFF, 0x7F}},
	} {
		require.Equal(t, c.want, appendVarint(nil, c.n), "n=%d", c.n)
	}
	long := appendConnect(nil, string(make([]byte, 200)), 60, true, "", "")
	require.Equal(t, []byte{0x10, 0xD4, 0x01}, long[:3], "remaining length 212 takes two bytes")
}

func TestParseConnack(t *testing.T) {
	for _, c := range []struct {
		name string
		b    [4]byte
		want error
	}{
		{"accepted", [4]byte{0x20, 0x02, 0x00, 0x00}, nil},
		{"accepted, session present", [4]byte{0x20, 0x02, 0x01, 0x00}, nil},
		{"not authorized", [4]byte{0x20, 0x02, 0x00, 0x05}, ErrConnackRefused},
		{"unknown code", [4]byte{0x20, 0x02, 0x00, 0x86}, ErrConnackRefused},
		{"not a CONNACK", [4]byte{0x30, 0x02, 0x00, 0x00}, ErrConnackMalformed},
		{"wrong length", [4]byte{0x20, 0x03, 0x00, 0x00}, ErrConnackMalformed},
		{"reserved flags", [4]byte{0x20, 0x02, 0x02, 0x00}, ErrConnackMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := parseConnack(c.b)
			if c.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, c.want)
		})
	}
	require.ErrorContains(t, parseConnack([4]byte{0x20, 0x02, 0x00, 0x05}), "not authorized")
}

func TestSourceSpreading(t *testing.T) {
	d := &leanDialer{source: netip.MustParseAddr("127.0.0.2"), perSource: 10_000}
	require.Equal(t, "127.0.0.2", d.sourceOf(0).String())
	require.Equal(t, "127.0.0.2", d.sourceOf(9_999).String())
	require.Equal(t, "127.0.0.3", d.sourceOf(10_000).String())
	require.Equal(t, "127.0.1.1", d.sourceOf(255*10_000).String(), "carries into the next byte")
	require.Equal(t, 2, d.sources(15_000))
	require.Equal(t, 1, d.sources(10_000))
	none := &leanDialer{perSource: 10}
	require.False(t, none.sourceOf(5).IsValid())
	require.Equal(t, 1, none.sources(100))
}
