package auth

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
)

// lockedBuffer is a bytes.Buffer safe for concurrent use, to capture logs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// hashPassword returns a bcrypt hash at the minimum cost, to keep tests
// fast.
func hashPassword(t testing.TB, password string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	require.NoError(t, err)
	return string(h)
}

// credentialsYAML renders users as a credentials file.
func credentialsYAML(users ...User) string {
	var b strings.Builder
	b.WriteString("users:\n")
	for _, u := range users {
		fmt.Fprintf(&b, "  - username: %q\n    password_hash: %q\n", u.Username, u.PasswordHash)
		if u.ClientID != "" {
			fmt.Fprintf(&b, "    clientid: %q\n", u.ClientID)
		}
	}
	return b.String()
}

// writeAtomic replaces the file at path, as an operator's deploy would.
func writeAtomic(t testing.TB, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(data), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// newStatic writes data to a credentials file and opens it with a fast
// reload poll.
func newStatic(t testing.TB, data string, log zerolog.Logger) (*StaticFile, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "users.yaml")
	writeAtomic(t, path, data)
	s, err := NewStaticFile(path, 5*time.Millisecond, log)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s, path
}

func TestParseCredentials(t *testing.T) {
	hash := hashPassword(t, "pw")
	users, err := ParseCredentials([]byte(credentialsYAML(
		User{Username: "alice", PasswordHash: hash},
		User{Username: "bob", PasswordHash: hash, ClientID: "bob-1"})))
	require.NoError(t, err)
	require.Equal(t, map[string]User{
		"alice": {Username: "alice", PasswordHash: hash},
		"bob":   {Username: "bob", PasswordHash: hash, ClientID: "bob-1"},
	}, users)

	users, err = ParseCredentials(nil)
	require.NoError(t, err)
	require.Empty(t, users)

	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", "users:\n  - username: a\n    password: plain\n", "field password not found"},
		{"unknown top key", "user: []\n", "field user not found"},
		{"two documents", "users: []\n---\nusers: []\n", "more than one document"},
		{"not bcrypt", credentialsYAML(User{Username: "a", PasswordHash: "secret-ish"}), "not a bcrypt hash"},
		{"empty username", credentialsYAML(User{PasswordHash: hash}), "empty username"},
		{"wildcard username", credentialsYAML(User{Username: "a/#", PasswordHash: hash}), "forbidden character"},
		{"wildcard clientid", credentialsYAML(User{Username: "a", PasswordHash: hash, ClientID: "+"}), "forbidden character"},
		{"duplicate", credentialsYAML(User{Username: "a", PasswordHash: hash}, User{Username: "a", PasswordHash: hash}), "listed twice"},
		{"not yaml", "users: [", "yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCredentials([]byte(tc.yaml))
			require.ErrorIs(t, err, ErrCredentialsFile)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "secret-ish", "a hash never appears in an error")
		})
	}
}

func TestStaticFile(t *testing.T) {
	s, _ := newStatic(t, credentialsYAML(
		User{Username: "alice", PasswordHash: hashPassword(t, "alice-pw")},
		User{Username: "bob", PasswordHash: hashPassword(t, "bob-pw"), ClientID: "bob-1"},
	), zerolog.Nop())
	require.Equal(t, 2, s.Len())

	id, err := s.Authenticate(&Request{ClientID: "any", Username: "alice", Password: []byte("alice-pw")})
	require.NoError(t, err)
	require.Equal(t, Identity{ClientID: "any", Username: "alice", Provider: ProviderStatic}, id)
	_, err = s.Authenticate(&Request{ClientID: "bob-1", Username: "bob", Password: []byte("bob-pw")})
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		req  Request
		want error
	}{
		{"unknown user", Request{ClientID: "c", Username: "mallory", Password: []byte("x")}, ErrNotMine},
		{"empty username", Request{ClientID: "c", Password: []byte("alice-pw")}, ErrNotMine},
		{"empty password", Request{ClientID: "c", Username: "alice"}, ErrDenied},
		{"wrong password", Request{ClientID: "c", Username: "alice", Password: []byte("bob-pw")}, ErrDenied},
		{"password prefix", Request{ClientID: "c", Username: "alice", Password: []byte("alice-p")}, ErrDenied},
		{"client id binding", Request{ClientID: "bob-2", Username: "bob", Password: []byte("bob-pw")}, ErrDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Authenticate(&tc.req)
			require.ErrorIs(t, err, tc.want)
			if len(tc.req.Password) > 0 {
				require.NotContains(t, err.Error(), string(tc.req.Password), "a password never appears in an error")
			}
		})
	}
}

func TestStaticFileCache(t *testing.T) {
	s, _ := newStatic(t, credentialsYAML(User{Username: "alice", PasswordHash: hashPassword(t, "pw")}), zerolog.Nop())
	req := &Request{ClientID: "c", Username: "alice", Password: []byte("pw")}
	_, err := s.Authenticate(req)
	require.NoError(t, err)
	require.Equal(t, uint64(1), s.bcryptCalls.Load())
	require.Zero(t, s.cacheHits.Load())

	_, err = s.Authenticate(req)
	require.NoError(t, err)
	require.Equal(t, uint64(1), s.bcryptCalls.Load(), "the second connect skips bcrypt")
	require.Equal(t, uint64(1), s.cacheHits.Load())

	// A wrong password is never served from the cache, nor cached.
	for range 2 {
		_, err = s.Authenticate(&Request{ClientID: "c", Username: "alice", Password: []byte("pw2")})
		require.ErrorIs(t, err, ErrDenied)
	}
	require.Equal(t, uint64(3), s.bcryptCalls.Load())
	require.Equal(t, uint64(1), s.cacheHits.Load())
}

func TestStaticFileReload(t *testing.T) {
	var logs lockedBuffer
	s, path := newStatic(t, credentialsYAML(User{Username: "alice", PasswordHash: hashPassword(t, "old")}), zerolog.New(&logs))
	auth := func(user, pw string) error {
		_, err := s.Authenticate(&Request{ClientID: "c", Username: user, Password: []byte(pw)})
		return err
	}
	require.NoError(t, auth("alice", "old"))
	require.NoError(t, auth("alice", "old")) // now cached

	// A new password and a new user: the cached entry must stop counting.
	writeAtomic(t, path, credentialsYAML(
		User{Username: "alice", PasswordHash: hashPassword(t, "new")},
		User{Username: "carol", PasswordHash: hashPassword(t, "carol-pw")}))
	require.Eventually(t, func() bool { return s.reloads.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.ErrorIs(t, auth("alice", "old"), ErrDenied)
	require.NoError(t, auth("alice", "new"))
	require.NoError(t, auth("carol", "carol-pw"))

	// A broken file is logged and the loaded table kept.
	writeAtomic(t, path, "users:\n  - username: dave\n    password_hash: not-a-hash-at-all\n")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "credentials reload failed") },
		5*time.Second, 5*time.Millisecond)
	require.NotContains(t, logs.String(), "not-a-hash-at-all")
	require.Equal(t, uint64(1), s.reloads.Load())
	require.NoError(t, auth("alice", "new"))
	require.ErrorIs(t, auth("dave", "x"), ErrNotMine)

	// A later good file is picked up again.
	writeAtomic(t, path, credentialsYAML(User{Username: "dave", PasswordHash: hashPassword(t, "dave-pw")}))
	require.Eventually(t, func() bool { return s.reloads.Load() == 2 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, auth("dave", "dave-pw"))
	require.ErrorIs(t, auth("alice", "new"), ErrNotMine)
}

func TestNewStaticFileErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := NewStaticFile(filepath.Join(dir, "missing.yaml"), 0, zerolog.Nop())
	require.ErrorIs(t, err, os.ErrNotExist)

	bad := filepath.Join(dir, "bad.yaml")
	writeAtomic(t, bad, "users: 3\n")
	_, err = NewStaticFile(bad, 0, zerolog.Nop())
	require.ErrorIs(t, err, ErrCredentialsFile)
}

func TestStaticFileCloseIdempotent(t *testing.T) {
	s, _ := newStatic(t, "users: []\n", zerolog.Nop())
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
}

func FuzzLoadCredentials(f *testing.F) {
	f.Add([]byte(credentialsYAML(User{Username: "a", PasswordHash: "$2a$04$abcdefghijklmnopqrstuu5Vj5ZXzsd9KhrM7dUmWGmQLX0iJLkGe", ClientID: "a"})))
	f.Add([]byte("users: []\n"))
	f.Add([]byte("users:\n  - {username: x, password_hash: y, extra: z}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		users, err := ParseCredentials(data)
		if err != nil {
			require.ErrorIs(t, err, ErrCredentialsFile)
			return
		}
		for name, u := range users {
			require.Equal(t, name, u.Username)
			require.True(t, name != "" && ValidID(name) && ValidID(u.ClientID))
			_, err := bcrypt.Cost([]byte(u.PasswordHash))
			require.NoError(t, err)
		}
	})
}

func BenchmarkStaticFile(b *testing.B) {
	hash, err := bcrypt.GenerateFromPassword([]byte("pw"), 10)
	require.NoError(b, err)
	s, _ := newStatic(b, credentialsYAML(User{Username: "alice", PasswordHash: string(hash)}), zerolog.Nop())
	req := &Request{ClientID: "c", Username: "alice", Password: []byte("pw")}
	_, err = s.Authenticate(req) // fill the cache
	require.NoError(b, err)
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Authenticate(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("uncached/cost=10", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.cacheMu.Lock()
			clear(s.cache)
			s.cacheMu.Unlock()
			if _, err := s.Authenticate(req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestStaticFileConcurrentFirstConnects: connections arriving together
// with the same credentials, before any is cached, share one bcrypt (a
// fleet reconnecting after an outage must not cost one each); a wrong
// password among them is still refused.
func TestStaticFileConcurrentFirstConnects(t *testing.T) {
	// The default cost (tens of ms a check): the checks overlap.
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.DefaultCost)
	require.NoError(t, err)
	s, _ := newStatic(t, credentialsYAML(User{Username: "fleet", PasswordHash: string(h)}), zerolog.Nop())
	const n = 32
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			pw := "pw"
			if i == 0 {
				pw = "wrong"
			}
			_, errs[i] = s.Authenticate(&Request{ClientID: fmt.Sprintf("car-%d", i), Username: "fleet", Password: []byte(pw)})
		})
	}
	close(start)
	wg.Wait()
	require.ErrorIs(t, errs[0], ErrDenied)
	for i := 1; i < n; i++ {
		require.NoError(t, errs[i], "connection %d", i)
	}
	// One bcrypt for the wrong password and one for the right (a check
	// that missed the cache just before the first finished and called
	// after it left the group may run a second): never one each.
	require.LessOrEqual(t, s.bcryptCalls.Load(), uint64(3), "concurrent checks of the same credentials each ran bcrypt")
}
