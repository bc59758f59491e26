package mqttbench

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPayloadRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name string
		size int
		s    Stamp
	}{
		{"smallest", PayloadHeaderBytes, Stamp{Publisher: 0, Seq: 0, SentUnixNano: 1}},
		{"typical", 256, Stamp{Publisher: 42, Seq: 123_456, SentUnixNano: 1_795_000_000_123_456_789}},
		{"largest fields", 1024, Stamp{Publisher: MaxPublishers - 1, Seq: math.MaxUint32, SentUnixNano: math.MaxInt64}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := make([]byte, c.size)
			fillPayload(b)
			EncodePayload(b, c.s)
			got, err := DecodePayload(b)
			require.NoError(t, err)
			require.Equal(t, c.s, got)
		})
	}
}

func TestPayloadLayout(t *testing.T) {
	b := make([]byte, 20)
	EncodePayload(b, Stamp{Publisher: 0x010203, Seq: 0x04050607, SentUnixNano: 0x08090a0b0c0d0e0f})
	want := []byte{0xB7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 0, 0, 0}
	require.Equal(t, want, b, "the header is part of the format")
}

func TestDecodePayloadRejects(t *testing.T) {
	good := make([]byte, PayloadHeaderBytes)
	EncodePayload(good, Stamp{Publisher: 1, Seq: 2, SentUnixNano: 3})
	with := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"nil", nil, ErrPayloadShort},
		{"one byte short", good[:PayloadHeaderBytes-1], ErrPayloadShort},
		{"text", []byte("hello, world, hello, world"), ErrPayloadMagic},
		{"zero time", with(func(b []byte) { binary.BigEndian.PutUint64(b[8:], 0) }), ErrPayloadTime},
		{"negative time", with(func(b []byte) { b[8] = 0x80 }), ErrPayloadTime},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodePayload(c.b)
			require.ErrorIs(t, err, c.want)
		})
	}
}

func TestEncodePayloadPanicsOnMisuse(t *testing.T) {
	require.Panics(t, func() { EncodePayload(make([]byte, PayloadHeaderBytes-1), Stamp{SentUnixNano: 1}) })
	require.Panics(t, func() { EncodePayload(make([]byte, PayloadHeaderBytes), Stamp{Publisher: MaxPublishers}) })
}

// FuzzDecodePayload: decoding never panics, and what decodes encodes back
// to the same header.
func FuzzDecodePayload(f *testing.F) {
	b := make([]byte, 64)
	fillPayload(b)
	EncodePayload(b, Stamp{Publisher: 7, Seq: 99, SentUnixNano: 1_795_000_000_000_000_000})
	f.Add(b)
	f.Add(b[:PayloadHeaderBytes])
	f.Add(b[:PayloadHeaderBytes-1])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodePayload(b)
		if err != nil {
			require.Zero(t, s)
			return
		}
		require.Less(t, s.Publisher, uint32(MaxPublishers))
		require.Positive(t, s.SentUnixNano)
		again := make([]byte, PayloadHeaderBytes)
		EncodePayload(again, s)
		require.Equal(t, b[:PayloadHeaderBytes], again)
	})
}
