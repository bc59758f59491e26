package auth

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"", true},
		{"sensor-1", true},
		{"Ünïcødé", true},
		{"a+b", false},
		{"a#", false},
		{"a/b", false},
		{"a\x00b", false},
		{"\xff\xfe", false},
	} {
		t.Run(fmt.Sprintf("%q", tc.s), func(t *testing.T) {
			require.Equal(t, tc.ok, ValidID(tc.s))
		})
	}
}

// stubProvider answers every request the same way and counts calls.
type stubProvider struct {
	name  string
	id    Identity
	err   error
	calls int
	seen  *Request
}

func (s *stubProvider) Name() string { return s.name }

func (s *stubProvider) Authenticate(r *Request) (Identity, error) {
	s.calls++
	s.seen = r
	return s.id, s.err
}

func TestChain(t *testing.T) {
	notMine := func(name string) *stubProvider {
		return &stubProvider{name: name, err: fmt.Errorf("%w: nope", ErrNotMine)}
	}
	t.Run("first recogniser decides", func(t *testing.T) {
		a, b, c := notMine("a"), &stubProvider{name: "b"}, &stubProvider{name: "c"}
		ch := &Chain{Providers: []Provider{a, b, c}}
		id, err := ch.Authenticate(&Request{ClientID: "c1", Username: "u1", Password: []byte("p")})
		require.NoError(t, err)
		require.Equal(t, Identity{ClientID: "c1", Username: "u1", Provider: "b"}, id)
		require.Equal(t, []int{1, 1, 0}, []int{a.calls, b.calls, c.calls})
		require.False(t, b.seen.Now.IsZero(), "the chain fixes Now for every provider")
	})
	t.Run("refusal stops the chain", func(t *testing.T) {
		a := &stubProvider{name: "a", err: fmt.Errorf("%w: wrong password", ErrDenied)}
		b := &stubProvider{name: "b"}
		_, err := (&Chain{Providers: []Provider{a, b}}).Authenticate(&Request{Username: "u", Password: []byte("p")})
		require.ErrorIs(t, err, ErrDenied)
		require.Zero(t, b.calls)
	})
	t.Run("other errors refuse", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := (&Chain{Providers: []Provider{&stubProvider{name: "a", err: boom}}}).Authenticate(&Request{})
		require.ErrorIs(t, err, boom)
	})
	t.Run("expired identity refused", func(t *testing.T) {
		now := time.Unix(1_700_000_000, 0)
		p := &stubProvider{name: "a", id: Identity{Expires: now}}
		_, err := (&Chain{Providers: []Provider{p}}).Authenticate(&Request{Now: now})
		require.ErrorIs(t, err, ErrDenied)
	})
	t.Run("nobody recognises", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			anonymous bool
			req       Request
			ok        bool
		}{
			{"anonymous off", false, Request{ClientID: "c"}, false},
			{"anonymous on", true, Request{ClientID: "c"}, true},
			{"anonymous on, username", true, Request{ClientID: "c", Username: "u"}, false},
			{"anonymous on, password", true, Request{ClientID: "c", Password: []byte("p")}, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ch := &Chain{Providers: []Provider{notMine("a")}, AllowAnonymous: tc.anonymous}
				id, err := ch.Authenticate(&tc.req)
				if !tc.ok {
					require.ErrorIs(t, err, ErrDenied)
					require.NotErrorIs(t, err, ErrNotMine)
					return
				}
				require.NoError(t, err)
				require.Equal(t, Identity{ClientID: "c", Provider: ProviderAnonymous}, id)
			})
		}
	})
	t.Run("forbidden characters", func(t *testing.T) {
		p := &stubProvider{name: "a"}
		ch := &Chain{Providers: []Provider{p}, AllowAnonymous: true}
		for _, r := range []Request{{ClientID: "#"}, {ClientID: "a/b"}, {Username: "+"}, {Username: "\xff"}} {
			_, err := ch.Authenticate(&r)
			require.ErrorIs(t, err, ErrDenied, "%+v", r)
		}
		require.Zero(t, p.calls)
	})
}
