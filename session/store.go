package session

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/rs/zerolog"
)

// Options configure a Store.
type Options struct {
	// SyncInterval is how often written records are fsynced (a process
	// crash loses nothing written; a power loss at most this much).
	// Default 200 ms.
	SyncInterval time.Duration
	Logger       *zerolog.Logger
}

// Store persists MQTT sessions — clients with their will, subscriptions,
// outbound QoS 1/2 messages not yet acknowledged (including those queued
// for an offline client), and retained messages — in dir/sessions.log, and
// gives them back to mochi at start. It is a mochi storage hook; safe for
// concurrent use.
type Store struct {
	mqtt.HookBase

	dir  string
	path string
	opts Options
	log  zerolog.Logger

	mu      sync.Mutex // guards everything below
	f       *os.File
	size    int64                      // bytes in the file
	live    int64                      // bytes of live records
	offsets map[string]entry           // key → its live record
	keysOf  map[string]map[string]bool // client ID → its subscription and inflight keys
	loaded  map[string][]byte
	dirty   bool
	err     error // sticky write error: the store stops writing
	buf     []byte

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

type entry struct{ off, n int64 }

// Key prefixes.
const (
	kClient   = "c/"
	kSub      = "s/"
	kInflight = "i/"
	kRetained = "r/"
)

// Open loads dir/sessions.log (creating dir) and starts the syncer.
func Open(dir string, o Options) (*Store, error) {
	if o.SyncInterval <= 0 {
		o.SyncInterval = 200 * time.Millisecond
	}
	s := &Store{dir: dir, path: filepath.Join(dir, "sessions.log"), opts: o, log: zerolog.Nop(),
		offsets: map[string]entry{}, keysOf: map[string]map[string]bool{}, loaded: map[string][]byte{}, stop: make(chan struct{})}
	if o.Logger != nil {
		s.log = o.Logger.With().Str("component", "session").Logger()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	data, err := os.ReadFile(s.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("session: read %s: %w", s.path, err)
	}
	end := int64(len(data))
	var lastBad int64 = -1
	replay(data, func(op byte, key string, value []byte, off int64) {
		n := int64(recHeader + 3 + len(key) + len(value))
		if old, ok := s.offsets[key]; ok {
			s.live -= old.n
		}
		if op == opDelete {
			delete(s.offsets, key)
			delete(s.loaded, key)
			s.untrack(key)
			return
		}
		s.track(key)
		s.offsets[key] = entry{off, n}
		s.loaded[key] = value
		s.live += n
		lastBad = -1
	}, func(off int64, err error) {
		if lastBad < 0 {
			lastBad = off
		}
		s.log.Warn().Err(err).Int64("offset", off).Str("file", s.path).Msg("session record damaged; skipped")
	})
	if lastBad >= 0 {
		end = lastBad // a torn tail: the next record is written where it began
	}
	if s.f, err = os.OpenFile(s.path, os.O_RDWR|os.O_CREATE, 0o644); err != nil {
		return nil, fmt.Errorf("session: open %s: %w", s.path, err)
	}
	if err := s.f.Truncate(end); err != nil {
		_ = s.f.Close()
		return nil, fmt.Errorf("session: cut torn tail of %s: %w", s.path, err)
	}
	s.size = end
	s.log.Info().Int("records", len(s.offsets)).Int64("bytes", end).Msg("sessions loaded")
	s.wg.Go(s.syncLoop)
	return s, nil
}

// Close syncs and closes the log; safe to call twice.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		close(s.stop)
		s.wg.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		err = errors.Join(s.f.Sync(), s.f.Close())
	})
	return err
}

func (s *Store) syncLoop() {
	t := time.NewTicker(s.opts.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		if s.dirty && s.err == nil {
			if err := s.f.Sync(); err != nil {
				s.fail(err)
			}
			s.dirty = false
		}
		if s.err == nil && s.size > 1<<20 && s.size > 2*s.live {
			if err := s.compactLocked(); err != nil {
				s.log.Error().Err(err).Msg("session log compaction")
			}
		}
		s.mu.Unlock()
	}
}

func (s *Store) fail(err error) {
	if s.err == nil {
		s.err = err
		s.log.Error().Err(err).Str("file", s.path).Msg("session log write failed; sessions are no longer persisted")
	}
}

// put and del write one record (to the page cache: a process crash loses
// nothing; the syncer fsyncs).
func (s *Store) put(key string, v storage.Serializable) {
	b, err := v.MarshalBinary()
	if err != nil {
		s.log.Error().Err(err).Str("key", key).Msg("encode session record")
		return
	}
	s.write(opPut, key, b)
}

func (s *Store) del(key string) {
	s.mu.Lock()
	_, ok := s.offsets[key]
	s.mu.Unlock()
	if ok {
		s.write(opDelete, key, nil)
	}
}

func (s *Store) write(op byte, key string, value []byte) {
	if len(key) > 0xFFFF {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	s.buf = appendRecord(s.buf[:0], op, key, value)
	if _, err := s.f.WriteAt(s.buf, s.size); err != nil {
		s.fail(err)
		return
	}
	n := int64(len(s.buf))
	if old, ok := s.offsets[key]; ok {
		s.live -= old.n
	}
	if op == opPut {
		s.offsets[key] = entry{s.size, n}
		s.live += n
		s.track(key)
	} else {
		delete(s.offsets, key)
		s.untrack(key)
	}
	s.size += n
	s.dirty = true
}

// compactLocked rewrites the live records into a new file and swaps it in.
func (s *Store) compactLocked() error {
	tmp := s.path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	var out []byte
	offsets := make(map[string]entry, len(s.offsets))
	for key, e := range s.offsets {
		rec := make([]byte, e.n)
		if _, err := s.f.ReadAt(rec, e.off); err != nil {
			_ = f.Close()
			return fmt.Errorf("read record %q: %w", key, err)
		}
		offsets[key] = entry{int64(len(out)), e.n}
		out = append(out, rec...)
	}
	if _, err := f.Write(out); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := os.Rename(tmp, s.path); err != nil {
		_ = f.Close()
		return err
	}
	if d, err := os.Open(s.dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	_ = s.f.Close()
	s.f, s.offsets, s.size, s.live, s.dirty = f, offsets, int64(len(out)), int64(len(out)), false
	return nil
}

func clientKey(id string) string { return kClient + id }

func subKey(id, filter string) string { return kSub + id + "\x00" + filter }

func inflightKey(id string, pid uint16) string {
	return kInflight + id + "\x00" + string(binary.BigEndian.AppendUint16(nil, pid))
}

func retainedKey(topic string) string { return kRetained + topic }

// ownerOf returns the client ID a subscription or inflight key belongs to.
func ownerOf(key string) (string, bool) {
	if !strings.HasPrefix(key, kSub) && !strings.HasPrefix(key, kInflight) {
		return "", false
	}
	id, _, ok := strings.Cut(key[2:], "\x00")
	return id, ok
}

func (s *Store) track(key string) {
	if id, ok := ownerOf(key); ok {
		m := s.keysOf[id]
		if m == nil {
			m = map[string]bool{}
			s.keysOf[id] = m
		}
		m[key] = true
	}
}

func (s *Store) untrack(key string) {
	if id, ok := ownerOf(key); ok {
		delete(s.keysOf[id], key)
		if len(s.keysOf[id]) == 0 {
			delete(s.keysOf, id)
		}
	}
}

// delClient removes a client and everything of it.
func (s *Store) delClient(id string) {
	s.mu.Lock()
	keys := make([]string, 0, len(s.keysOf[id]))
	for k := range s.keysOf[id] {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	for _, k := range keys {
		s.del(k)
	}
	s.del(clientKey(id))
}

// loadedWith returns and forgets the values loaded at Open under prefix.
func (s *Store) loadedWith(prefix string) [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]byte
	for k, v := range s.loaded {
		if strings.HasPrefix(k, prefix) {
			out = append(out, v)
			delete(s.loaded, k)
		}
	}
	return out
}
