package pop

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fuzzSecret keys the signer of the handle tests, so that seeds stay valid.
var fuzzSecret = []byte("ferrymq pop handle fuzz secret")

func TestHandleRoundTrip(t *testing.T) {
	s := newSigner(fuzzSecret)
	for _, h := range []handle{
		{queue: 0, offset: 0, gen: 1, deadline: time.Unix(1_800_000_000, 5).UnixNano(), group: "g", topic: "t"},
		{queue: 1023, offset: 1<<62 + 7, gen: 1<<64 - 1, deadline: -1, group: strings.Repeat("g", maxGroupLen), topic: "%RETRY%" + strings.Repeat("g", maxGroupLen)},
		{queue: 7, offset: 42, gen: 9, deadline: 1, group: "a.b_c-d", topic: strings.Repeat("t", maxTopicLen)},
	} {
		text := s.encode(h)
		require.LessOrEqual(t, len(text), handleEncoding.EncodedLen(handleMaxRaw))
		got, err := s.decode(text)
		require.NoError(t, err)
		require.Equal(t, h, got)
		_, err = newSigner([]byte("another secret")).decode(text)
		require.ErrorIs(t, err, ErrInvalidHandle)
	}
}

func FuzzDecodeHandle(f *testing.F) {
	s := newSigner(fuzzSecret)
	f.Add(s.encode(handle{queue: 3, offset: 99, gen: 12, deadline: 1_800_000_000_000_000_000, group: "g", topic: "orders"}))
	f.Add("")
	f.Add("AQ")
	f.Add(strings.Repeat("_", 400))
	f.Fuzz(func(t *testing.T, text string) {
		h, err := s.decode(text)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidHandle)
			return
		}
		again, err := s.decode(s.encode(h))
		require.NoError(t, err)
		require.Equal(t, h, again)
	})
}
