package auth

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"golang.org/x/sync/singleflight"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"
)

// ProviderStatic is the Name of a StaticFile.
const ProviderStatic = "static"

// CacheEntries bounds a StaticFile's cache of verified passwords.
const CacheEntries = 100_000

// Log field names.
const (
	logFieldPath  = "path"
	logFieldUsers = "users"
)

// User is one entry of a credentials file.
type User struct {
	Username string `yaml:"username"`
	// PasswordHash is a bcrypt hash ("$2a$…"/"$2b$…"), as printed by
	// `ferrymq auth hash-password`.
	PasswordHash string `yaml:"password_hash"`
	// ClientID, when set, is the only client ID the user may connect with.
	ClientID string `yaml:"clientid,omitempty"`
}

// credentialsFile is the document a credentials file holds.
type credentialsFile struct {
	Users []User `yaml:"users"`
}

// ParseCredentials decodes and validates a credentials file:
//
//	users:
//	  - username: sensor-1
//	    password_hash: $2a$10$…
//	    clientid: sensor-1   # optional binding
//
// Decoding is strict: unknown keys and a second document are errors. Each
// username must be non-empty, unique and pass ValidID; each hash must be
// bcrypt. An empty file is an empty table. Errors wrap ErrCredentialsFile.
func ParseCredentials(data []byte) (map[string]User, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f credentialsFile
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrCredentialsFile, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more than one document", ErrCredentialsFile)
	}
	users := make(map[string]User, len(f.Users))
	var errs []error
	for i, u := range f.Users {
		switch {
		case u.Username == "":
			errs = append(errs, fmt.Errorf("user %d: empty username", i))
			continue
		case !ValidID(u.Username):
			errs = append(errs, fmt.Errorf("user %d: username holds a forbidden character", i))
			continue
		}
		if _, dup := users[u.Username]; dup {
			errs = append(errs, fmt.Errorf("user %q: listed twice", u.Username))
		}
		if _, err := bcrypt.Cost([]byte(u.PasswordHash)); err != nil {
			errs = append(errs, fmt.Errorf("user %q: password_hash is not a bcrypt hash", u.Username))
		}
		if !ValidID(u.ClientID) {
			errs = append(errs, fmt.Errorf("user %q: clientid holds a forbidden character", u.Username))
		}
		users[u.Username] = u
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrCredentialsFile, errors.Join(errs...))
	}
	return users, nil
}

// fileStamp identifies a version of a file cheaply.
type fileStamp struct {
	mtime time.Time
	size  int64
}

// cacheKey identifies a verified (username, password) pair. The password
// appears only as an HMAC-SHA-256 under a key drawn at start-up, so the
// cache is worthless outside the process.
type cacheKey struct {
	username string
	digest   [sha256.Size]byte
}

// StaticFile is a Provider of username/password users listed in a YAML
// credentials file (see ParseCredentials), reloaded when the file changes.
//
// bcrypt is slow by design, so successful verifications are cached: a
// repeated connect costs a map lookup and one HMAC-SHA-256. An entry
// remembers the hash it was verified against and only counts while the
// user still has that hash; the whole cache is dropped on reload and holds
// at most CacheEntries. Failures are never cached.
//
// A StaticFile is safe for concurrent use. Close stops its reload
// goroutine.
type StaticFile struct {
	path string
	log  zerolog.Logger
	key  [32]byte // keys cache digests

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once

	// stamp is the version last read (successfully or not); reload
	// goroutine only.
	stamp fileStamp

	mu    sync.RWMutex
	users map[string]User

	cacheMu sync.Mutex
	cache   map[cacheKey]string // → the hash the password verified against
	// verifying joins concurrent checks of one username, password and
	// hash: a fleet reconnecting with shared credentials costs one bcrypt,
	// not one per connection.
	verifying singleflight.Group

	// counters, for tests and metrics
	cacheHits   atomic.Uint64
	bcryptCalls atomic.Uint64
	reloads     atomic.Uint64
}

// NewStaticFile loads the credentials file at path and, if reload is
// positive, polls it every reload for a change of modification time or
// size. A changed file that fails to load is logged and the previous table
// kept. Close the StaticFile to stop polling.
func NewStaticFile(path string, reload time.Duration, log zerolog.Logger) (*StaticFile, error) {
	s := &StaticFile{path: path, log: log, cache: make(map[cacheKey]string)}
	if _, err := rand.Read(s.key[:]); err != nil {
		return nil, fmt.Errorf("cache key: %w", err)
	}
	stamp, users, err := loadCredentials(path)
	if err != nil {
		return nil, err
	}
	s.stamp, s.users = stamp, users
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if reload > 0 {
		s.wg.Go(func() { s.poll(ctx, reload) })
	}
	return s, nil
}

// loadCredentials reads and parses the file at path.
func loadCredentials(path string) (fileStamp, map[string]User, error) {
	f, err := os.Open(path)
	if err != nil {
		return fileStamp{}, nil, fmt.Errorf("credentials: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fileStamp{}, nil, fmt.Errorf("credentials: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fileStamp{}, nil, fmt.Errorf("credentials: %w", err)
	}
	users, err := ParseCredentials(data)
	if err != nil {
		return fileStamp{}, nil, fmt.Errorf("credentials %s: %w", path, err)
	}
	return fileStamp{mtime: fi.ModTime(), size: fi.Size()}, users, nil
}

func (s *StaticFile) poll(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.reloadIfChanged()
		}
	}
}

// reloadIfChanged reloads the file if its stamp changed since the last
// attempt. Called by the poll goroutine only.
func (s *StaticFile) reloadIfChanged() {
	fi, err := os.Stat(s.path)
	if err != nil {
		if s.stamp != (fileStamp{}) {
			s.log.Error().Err(err).Str(logFieldPath, s.path).Msg("credentials file unreadable, keeping the loaded users")
			s.stamp = fileStamp{}
		}
		return
	}
	stamp := fileStamp{mtime: fi.ModTime(), size: fi.Size()}
	if stamp == s.stamp {
		return
	}
	s.stamp = stamp
	stamp, users, err := loadCredentials(s.path)
	if err != nil {
		s.log.Error().Err(err).Str(logFieldPath, s.path).Msg("credentials reload failed, keeping the loaded users")
		return
	}
	s.stamp = stamp
	s.mu.Lock()
	s.users = users
	s.mu.Unlock()
	s.cacheMu.Lock()
	clear(s.cache)
	s.cacheMu.Unlock()
	s.reloads.Add(1)
	s.log.Info().Str(logFieldPath, s.path).Int(logFieldUsers, len(users)).Msg("credentials reloaded")
}

// Close stops the reload goroutine and waits for it. It is idempotent.
func (s *StaticFile) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.wg.Wait()
	})
	return nil
}

// Name returns "static".
func (s *StaticFile) Name() string { return ProviderStatic }

// Len returns the number of users loaded.
func (s *StaticFile) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.users)
}

// Authenticate recognises a request whose username is in the table and
// checks its password and client-ID binding.
func (s *StaticFile) Authenticate(r *Request) (Identity, error) {
	s.mu.RLock()
	u, ok := s.users[r.Username]
	s.mu.RUnlock()
	if !ok || r.Username == "" {
		return Identity{}, ErrNotMine
	}
	if len(r.Password) == 0 {
		return Identity{}, fmt.Errorf("%w: empty password", ErrDenied)
	}
	if u.ClientID != "" && u.ClientID != r.ClientID {
		return Identity{}, fmt.Errorf("%w: client id not bound to user %q", ErrDenied, r.Username)
	}
	key := cacheKey{username: r.Username, digest: s.digest(r.Password)}
	s.cacheMu.Lock()
	hash, hit := s.cache[key]
	s.cacheMu.Unlock()
	// The entry only counts for the hash it was verified against: a user
	// whose hash changed is verified afresh.
	if hit && hash == u.PasswordHash {
		s.cacheHits.Add(1)
		return Identity{ClientID: r.ClientID, Username: r.Username, Provider: ProviderStatic}, nil
	}
	flight := r.Username + "\x00" + string(key.digest[:]) + "\x00" + u.PasswordHash
	_, err, _ := s.verifying.Do(flight, func() (any, error) {
		s.bcryptCalls.Add(1)
		if err := bcrypt.CompareHashAndPassword([]byte(u.PasswordHash), r.Password); err != nil {
			return nil, err
		}
		s.cacheMu.Lock()
		if len(s.cache) >= CacheEntries {
			for k := range s.cache { // evict an arbitrary entry
				delete(s.cache, k)
				break
			}
		}
		s.cache[key] = u.PasswordHash
		s.cacheMu.Unlock()
		return nil, nil
	})
	if err != nil {
		return Identity{}, fmt.Errorf("%w: wrong password for user %q", ErrDenied, r.Username)
	}
	return Identity{ClientID: r.ClientID, Username: r.Username, Provider: ProviderStatic}, nil
}

// digest is the cache's keyed digest of a password.
func (s *StaticFile) digest(password []byte) [sha256.Size]byte {
	m := hmac.New(sha256.New, s.key[:])
	m.Write(password)
	var d [sha256.Size]byte
	m.Sum(d[:0])
	return d
}
