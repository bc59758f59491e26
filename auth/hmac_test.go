package auth

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	productSecret = []byte("product-secret")
	deviceSecret  = []byte("device-secret")
)

func newTestHMAC(t testing.TB, opts HMACOptions) *HMAC {
	t.Helper()
	if opts.ProductSecrets == nil {
		opts.ProductSecrets = map[string][]byte{"meter": productSecret}
		opts.DeviceSecrets = map[string][]byte{"meter:m-vip": deviceSecret}
	}
	h, err := NewHMAC(opts)
	require.NoError(t, err)
	return h
}

// hmacRequest builds the request of a device signing at ts, seen at now.
func hmacRequest(secret []byte, clientID, product, device string, ts, now time.Time) *Request {
	return &Request{
		ClientID: clientID,
		Username: HMACUsername(product, device, ts),
		Password: []byte(SignHMAC(secret, clientID, ts)),
		Now:      now,
	}
}

func TestHMAC(t *testing.T) {
	now := time.UnixMilli(1_767_225_600_123)
	h := newTestHMAC(t, HMACOptions{})

	id, err := h.Authenticate(hmacRequest(productSecret, "sn-1", "meter", "m-1", now.Add(-time.Minute), now))
	require.NoError(t, err)
	require.Equal(t, Identity{ClientID: "sn-1", Username: "meter:m-1", Provider: ProviderHMAC}, id)

	// A device secret wins over the product's.
	_, err = h.Authenticate(hmacRequest(deviceSecret, "sn-2", "meter", "m-vip", now, now))
	require.NoError(t, err)
	_, err = h.Authenticate(hmacRequest(productSecret, "sn-3", "meter", "m-vip", now, now))
	require.ErrorIs(t, err, ErrDenied)

	for _, tc := range []struct {
		name string
		req  *Request
		want error
	}{
		{"empty username", &Request{ClientID: "c", Password: []byte("x")}, ErrNotMine},
		{"plain username", &Request{ClientID: "c", Username: "alice", Password: []byte("x")}, ErrNotMine},
		{"unknown product", hmacRequest(productSecret, "c", "oven", "o-1", now, now), ErrNotMine},
		{"empty password", &Request{ClientID: "c", Username: HMACUsername("meter", "m-1", now), Now: now}, ErrDenied},
		{"wrong secret", hmacRequest([]byte("guess"), "c", "meter", "m-1", now, now), ErrDenied},
		{"expired timestamp", hmacRequest(productSecret, "c", "meter", "m-1", now.Add(-DefaultSkew-time.Millisecond), now), ErrDenied},
		{"future timestamp", hmacRequest(productSecret, "c", "meter", "m-1", now.Add(DefaultSkew+time.Millisecond), now), ErrDenied},
		{"garbage password", &Request{ClientID: "c", Username: HMACUsername("meter", "m-1", now), Password: []byte("!!!"), Now: now}, ErrDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.Authenticate(tc.req)
			require.ErrorIs(t, err, tc.want)
			require.NotContains(t, err.Error(), string(productSecret))
		})
	}

	t.Run("signed for another client id", func(t *testing.T) {
		req := hmacRequest(productSecret, "sn-victim", "meter", "m-1", now.Add(-2*time.Second), now)
		req.ClientID = "sn-attacker"
		_, err := h.Authenticate(req)
		require.ErrorIs(t, err, ErrDenied)
		require.ErrorContains(t, err, "bad signature")
	})
	t.Run("replay", func(t *testing.T) {
		ts := now.Add(-3 * time.Second)
		_, err := h.Authenticate(hmacRequest(productSecret, "sn-9", "meter", "m-9", ts, now))
		require.NoError(t, err)
		_, err = h.Authenticate(hmacRequest(productSecret, "sn-9", "meter", "m-9", ts, now.Add(time.Second)))
		require.ErrorIs(t, err, ErrDenied)
		require.ErrorContains(t, err, "replay")
		// A fresh timestamp is fine.
		_, err = h.Authenticate(hmacRequest(productSecret, "sn-9", "meter", "m-9", ts.Add(time.Millisecond), now))
		require.NoError(t, err)
	})
	t.Run("bad signatures do not poison the replay cache", func(t *testing.T) {
		ts := now.Add(-4 * time.Second)
		_, err := h.Authenticate(hmacRequest([]byte("guess"), "sn-10", "meter", "m-10", ts, now))
		require.ErrorIs(t, err, ErrDenied)
		_, err = h.Authenticate(hmacRequest(productSecret, "sn-10", "meter", "m-10", ts, now))
		require.NoError(t, err)
	})
}

func TestHMACReplayCacheBounded(t *testing.T) {
	now := time.UnixMilli(1_767_225_600_000)
	h := newTestHMAC(t, HMACOptions{ReplayEntries: 4, Skew: time.Second})
	for i := range 20 {
		ts := now.Add(time.Duration(i) * 100 * time.Millisecond)
		_, err := h.Authenticate(hmacRequest(productSecret, "c", "meter", "m", ts, ts))
		require.NoError(t, err)
		require.LessOrEqual(t, len(h.replay), 4)
	}
	off := newTestHMAC(t, HMACOptions{ReplayEntries: -1})
	for range 2 {
		_, err := off.Authenticate(hmacRequest(productSecret, "c", "meter", "m", now, now))
		require.NoError(t, err)
	}
}

func TestNewHMACOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts HMACOptions
		want string
	}{
		{"no secrets", HMACOptions{}, "no product or device secret"},
		{"empty secret", HMACOptions{ProductSecrets: map[string][]byte{"p": nil}}, "empty secret"},
		{"bad product", HMACOptions{ProductSecrets: map[string][]byte{"a:b": []byte("s")}}, "invalid name"},
		{"bad device key", HMACOptions{DeviceSecrets: map[string][]byte{"nocolon": []byte("s")}}, "want <product>:<device>"},
		{"negative skew", HMACOptions{ProductSecrets: map[string][]byte{"p": []byte("s")}, Skew: -time.Second}, "negative skew"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewHMAC(tc.opts)
			require.ErrorIs(t, err, ErrInvalidOptions)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "\"s\"")
		})
	}
}

func TestParseHMACUsername(t *testing.T) {
	p, d, ts, err := ParseHMACUsername("meter:m-1:1767225600123")
	require.NoError(t, err)
	require.Equal(t, []any{"meter", "m-1", int64(1767225600123)}, []any{p, d, ts.UnixMilli()})
	for _, s := range []string{
		"", "meter", "meter:m-1", "meter:m-1:", ":m-1:1", "meter::1", "meter:m-1:01", "meter:m-1:+1",
		"meter:m-1:-1", "meter:m-1:1e3", "meter:m-1:1:2", "me/ter:m-1:1", "meter:m#:1", "meter:m-1:1234567890123456",
	} {
		_, _, _, err := ParseHMACUsername(s)
		require.ErrorIs(t, err, ErrNotMine, "%q", s)
	}
}

func FuzzParseUsername(f *testing.F) {
	f.Add("meter:m-1:1767225600123")
	f.Add("meter:m-1:0")
	f.Add("a:b:01")
	f.Add("a:b:c:1")
	f.Fuzz(func(t *testing.T, s string) {
		p, d, ts, err := ParseHMACUsername(s)
		if err != nil {
			require.ErrorIs(t, err, ErrNotMine)
			return
		}
		// Accepted usernames are canonical: they round-trip exactly.
		require.Equal(t, s, HMACUsername(p, d, ts))
		require.True(t, validHMACName(p) && validHMACName(d))
		require.False(t, strings.ContainsAny(s, "+#/\x00"))
	})
}

func BenchmarkHMAC(b *testing.B) {
	h := newTestHMAC(b, HMACOptions{ReplayEntries: -1})
	now := time.UnixMilli(1_767_225_600_000)
	req := hmacRequest(productSecret, "sn-1", "meter", "m-1", now, now)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.Authenticate(req); err != nil {
			b.Fatal(err)
		}
	}
}
