package session

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

func fullMessage() *engine.Message {
	return &engine.Message{Topic: "cars/7/cmd", Payload: []byte("unlock"), QoS: 2, Retain: true, Origin: "backend",
		Ref: "012499e7000000000000013500000093", Created: 1_700_000_000_123_456_789, Expiry: 4_000_000_000,
		Props: &engine.Props{PayloadFormat: 1, PayloadFormatSet: true, ContentType: "text/plain", ResponseTopic: "cars/7/resp",
			CorrelationData: []byte{1, 2, 3}, User: []engine.UserProperty{{Key: "a", Value: "1"}, {Key: "a", Value: "2"}}}}
}

func TestValuesRoundTrip(t *testing.T) {
	t.Run("client", func(t *testing.T) {
		for _, c := range []engine.ClientRecord{
			{ID: "car-7", Username: "fleet", Protocol: 4, Expiry: 604800},
			{ID: "car-8", Protocol: 5, Expiry: 60, Will: fullMessage(), WillDelay: 5, WillExpiry: 30},
			{ID: "\x00odd id", Protocol: 3, Expiry: 1, Will: &engine.Message{Topic: "w", QoS: 1}},
		} {
			for _, fresh := range []bool{false, true} {
				v, err := encodeClient(&c, fresh)
				require.NoError(t, err)
				require.Equal(t, fresh, freshClient(v))
				got, err := decodeClient(c.ID, v)
				require.NoError(t, err)
				require.Equal(t, c, got)
			}
		}
	})
	t.Run("subscription", func(t *testing.T) {
		for _, o := range []topictree.Options{{QoS: 1}, {QoS: 2, NoLocal: true, RetainAsPublished: true, RetainHandling: 2, Identifier: maxSubID}} {
			v, err := encodeSub("cars/+/cmd", o)
			require.NoError(t, err)
			f, got, err := decodeSub(v)
			require.NoError(t, err)
			require.Equal(t, "cars/+/cmd", f)
			require.Equal(t, o, got)
		}
	})
	t.Run("message", func(t *testing.T) {
		for _, ids := range [][]uint32{nil, {7}, {1, maxSubID}} {
			m := fullMessage()
			v, err := encodeMessage(m, ids)
			require.NoError(t, err)
			got, gotIDs, err := decodeMessage(v)
			require.NoError(t, err)
			require.Equal(t, m, got)
			require.Equal(t, ids, gotIDs)
		}
		plain := &engine.Message{Topic: "t", Payload: nil, QoS: 1}
		v, err := encodeMessage(plain, nil)
		require.NoError(t, err)
		got, _, err := decodeMessage(v)
		require.NoError(t, err)
		require.Equal(t, plain, got)
	})
	t.Run("retained", func(t *testing.T) {
		m := fullMessage()
		v, err := encodeRetained(m)
		require.NoError(t, err)
		got, err := decodeRetained(v)
		require.NoError(t, err)
		require.Equal(t, m, got)
		_, err = encodeRetained(&engine.Message{Topic: "t"})
		require.ErrorIs(t, err, ErrBadValue, "an empty retained message is a delete")
	})
	t.Run("offline and marker", func(t *testing.T) {
		at := time.Unix(0, 1_700_000_000_987_654_321)
		got, err := decodeOffline(encodeOffline(at))
		require.NoError(t, err)
		require.True(t, at.Equal(got))
		require.NoError(t, decodeMarker(markerValue))
	})
	t.Run("inbound", func(t *testing.T) {
		id, err := decodeInbound(encodeInbound(1_800_000_000_000_000_123))
		require.NoError(t, err)
		require.Equal(t, uint64(1_800_000_000_000_000_123), id)
		id, err = decodeInbound(markerValue)
		require.NoError(t, err)
		require.Zero(t, id, "a bare marker: answered")
		b := encodeInbound(77)
		for n := 2; n < len(b); n++ {
			_, err := decodeInbound(b[:n])
			require.ErrorIs(t, err, ErrBadValue, "cut at %d", n)
		}
		_, err = decodeInbound(append(b, 0))
		require.ErrorIs(t, err, ErrBadValue, "a trailing byte")
		_, err = decodeInbound([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0})
		require.ErrorIs(t, err, ErrBadValue, "QoS2ID 0")
		_, err = decodeInbound([]byte{2, 0, 0, 0, 0, 0, 0, 0, 1})
		require.ErrorIs(t, err, ErrVersion)
	})
}

// Every decoder refuses what is not one of its values — short, long,
// another version, out-of-range fields — with a clear error, never a
// panic.
func TestDecodersRefuseMalformedValues(t *testing.T) {
	client, _ := encodeClient(&engine.ClientRecord{ID: "c", Protocol: 5, Expiry: 9, Will: fullMessage()}, true)
	sub, _ := encodeSub("a/#", topictree.Options{QoS: 1, Identifier: 3})
	msg, _ := encodeMessage(fullMessage(), []uint32{4})
	ret, _ := encodeRetained(fullMessage())
	decoders := map[string]struct {
		good   []byte
		decode func([]byte) error
	}{
		"client":       {client, func(b []byte) error { _, err := decodeClient("c", b); return err }},
		"subscription": {sub, func(b []byte) error { _, _, err := decodeSub(b); return err }},
		"message":      {msg, func(b []byte) error { _, _, err := decodeMessage(b); return err }},
		"retained":     {ret, func(b []byte) error { _, err := decodeRetained(b); return err }},
		"offline":      {encodeOffline(time.Unix(5, 0)), func(b []byte) error { _, err := decodeOffline(b); return err }},
		"marker":       {markerValue, decodeMarker},
	}
	for name, d := range decoders {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, d.decode(d.good))
			for n := range len(d.good) {
				require.ErrorIs(t, d.decode(d.good[:n]), ErrBadValue, "cut at %d", n)
			}
			require.ErrorIs(t, d.decode(append(append([]byte(nil), d.good...), 0)), ErrBadValue, "a trailing byte")
			other := append([]byte(nil), d.good...)
			other[0] = valueVersion + 1
			require.ErrorIs(t, d.decode(other), ErrVersion)
			mochi := []byte(`{"id":"c"}`)
			require.Error(t, d.decode(mochi), "the mochi store's JSON")
		})
	}
	bad := map[string]func() error{
		"message QoS 3": func() error {
			b := append([]byte(nil), msg...)
			b[7] |= 3 // the message flags follow the version and one subscription identifier
			_, _, err := decodeMessage(b)
			return err
		},
		"subscription reserved bits": func() error {
			b := append([]byte(nil), sub...)
			b[1] |= 0xC0
			_, _, err := decodeSub(b)
			return err
		},
		"client protocol 9": func() error {
			b := append([]byte(nil), client...)
			b[2] = 9
			_, err := decodeClient("c", b)
			return err
		},
		"retained without payload": func() error {
			v, _ := encodeMessage(&engine.Message{Topic: "t"}, nil)
			_, err := decodeRetained(append([]byte{valueVersion}, v[3:]...))
			return err
		},
	}
	for name, f := range bad {
		require.ErrorIs(t, f(), ErrBadValue, name)
	}
}

func TestEncodersRefuseWhatDoesNotFit(t *testing.T) {
	long := strings.Repeat("x", 1<<16)
	_, err := encodeMessage(&engine.Message{Topic: long, QoS: 1}, nil)
	require.ErrorIs(t, err, ErrValueTooLarge)
	_, err = encodeClient(&engine.ClientRecord{ID: "c", Protocol: 4, Username: long}, false)
	require.ErrorIs(t, err, ErrValueTooLarge)
	_, err = encodeSub("f", topictree.Options{QoS: 3})
	require.ErrorIs(t, err, ErrBadValue)
}

func TestKeysRoundTrip(t *testing.T) {
	for _, id := range []string{"car-7", "", "a\x00b", "ünï/c.d", strings.Repeat("l", 300)} {
		for _, k := range []key{
			{kind: kClient, id: id}, {kind: kOffline, id: id}, {kind: kSub, id: id, sub: "a/\x00/#"},
			{kind: kMessage, id: id, pid: 0xBEEF}, {kind: kReleased, id: id, pid: 1}, {kind: kInbound, id: id, pid: 65535},
			{kind: kRetained, id: "r/" + id},
		} {
			got, err := parseKey(k.String())
			require.NoError(t, err)
			require.Equal(t, k, got)
		}
	}
	for _, bad := range []string{"", "c", "c\x00", "c\x00\x05ab", "c\x00\x01ab", "s\x00\x01a", "m\x00\x01a\x00", "x\x00\x00"} {
		_, err := parseKey(bad)
		require.ErrorIs(t, err, ErrBadKey, "%q", bad)
	}
}
