package cluster

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range []message{
		{origin: "gw-1", id: 1, qos: 0},
		{origin: "gw 2\r\n", id: 1<<64 - 1, client: "car 1/ü\n", qos: 2, retain: true, expiry: 3600,
			format: 1, formatSet: true, contentType: "application/json; charset=utf-8", responseTopic: "reply/to\tme",
			correlation: []byte{0, 1, 0xff, '\n'},
			user:        []engine.UserProperty{{Key: "k=1", Value: "v,=2\r\n"}, {Key: "", Value: ""}, {Key: "k=1", Value: "again"}},
			served:      []string{"fmqmqtt.share.g.0011223344556677"}},
	} {
		h := m.header()
		for k, vs := range h {
			for _, v := range vs {
				require.NotContains(t, v, "\n", k)
				require.NotContains(t, v, "\r", k)
			}
		}
		got, err := decodeMessage(h)
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
}

func TestDecodeMessageRejects(t *testing.T) {
	ok := (&message{origin: "a", id: 7, qos: 1}).header()
	for name, change := range map[string]func(nats.Header){
		"no version":      func(h nats.Header) { delete(h, hdrVersion) },
		"other version":   func(h nats.Header) { h.Set(hdrVersion, "2") },
		"no origin":       func(h nats.Header) { delete(h, hdrOrigin) },
		"no id":           func(h nats.Header) { delete(h, hdrID) },
		"bad id":          func(h nats.Header) { h.Set(hdrID, "-1") },
		"qos 3":           func(h nats.Header) { h.Set(hdrQoS, "3") },
		"bad escape":      func(h nats.Header) { h.Set(hdrClient, "%zz") },
		"bad expiry":      func(h nats.Header) { h.Set(hdrExpiry, "4294967296") },
		"bad correlation": func(h nats.Header) { h.Set(hdrCorrelation, "!!") },
		"user without =":  func(h nats.Header) { h.Add(hdrUser, "k") },
	} {
		h := nats.Header{}
		for k, v := range ok {
			h[k] = append([]string(nil), v...)
		}
		change(h)
		_, err := decodeMessage(h)
		require.ErrorIs(t, err, ErrBadMessage, name)
	}
}

// FuzzDecodeMessage: headers as another node (or anyone on the subject)
// may send them never panic the decoder, and what decodes encodes back to
// the same message.
func FuzzDecodeMessage(f *testing.F) {
	f.Add("1", "gw-1", "42", "1", "car%201", "k=v", "AAE=", "60")
	f.Add("1", "", "", "9", "%", "=", "*", "x")
	f.Fuzz(func(t *testing.T, version, origin, id, qos, client, user, corr, expiry string) {
		h := nats.Header{hdrVersion: {version}, hdrOrigin: {origin}, hdrID: {id}, hdrQoS: {qos}, hdrClient: {client},
			hdrCorrelation: {corr}, hdrExpiry: {expiry}, hdrUser: strings.Split(user, "\x00")}
		m, err := decodeMessage(h)
		if err != nil {
			return
		}
		again, err := decodeMessage(m.header())
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if m.origin != again.origin || m.id != again.id || m.qos != again.qos || m.client != again.client ||
			string(m.correlation) != string(again.correlation) || len(m.user) != len(again.user) {
			t.Fatalf("%+v != %+v", m, again)
		}
	})
}
