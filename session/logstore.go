package session

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Options configure a Store kept in the local log (Open).
type Options struct {
	// SyncInterval is how often written records are fsynced: a process
	// crash loses nothing written (every change is in the page cache at
	// once), a power loss at most this much. Default 200 ms.
	SyncInterval time.Duration
	// CompactBytes: the log is compacted (its live records rewritten into
	// a new file) once it is larger than this and more than half of it is
	// dead. Default 1 MiB.
	CompactBytes int64
	// SyncInbound fsyncs the record of an inbound QoS 2 publish (its
	// QoS2ID) before the publish goes on to the core (SyncInbound, with
	// group commit), so that a power loss after the core stored it cannot
	// lose the record its resend is looked up by. Worth it only when the
	// core fsyncs before it acknowledges (--flush sync); without it the
	// record is fsynced within SyncInterval.
	SyncInbound bool
	Logger      *zerolog.Logger
}

// Defaults of Options.
const (
	DefaultSyncInterval = 200 * time.Millisecond
	DefaultCompactBytes = 1 << 20
)

func (o Options) withDefaults() Options {
	if o.SyncInterval == 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.CompactBytes == 0 {
		o.CompactBytes = DefaultCompactBytes
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	if o.SyncInterval < 0 {
		errs = append(errs, fmt.Errorf("sync interval %s: want > 0", o.SyncInterval))
	}
	if o.CompactBytes < 0 {
		errs = append(errs, fmt.Errorf("compact bytes %d: want > 0", o.CompactBytes))
	}
	return errors.Join(errs...)
}

// logName is the log's file name in its folder; compaction writes
// compactName and renames it over.
const (
	logName     = "sessions.log"
	oldLogMagic = 0xF5 // the first byte of the mochi-based store's log (its record magic)
	compactName = "sessions.log.compact"
)

// logBackend keeps a Store's records in one append-only file: every write
// goes to the page cache at once, a background goroutine fsyncs every
// SyncInterval and compacts the file when more than half of it is dead. A
// failed write or fsync is sticky: the backend refuses every later write,
// like nats-server's filestore, so that the file never holds a hole.
//
// Its fields are guarded by Store.mu; f is swapped only under Store.swapMu
// too (an fsync runs without Store.mu, under swapMu).
type logBackend struct {
	s     *Store
	fs    fsys
	dir   string
	path  string
	nonce uint64
	opts  Options

	f      file
	size   int64 // bytes in the file
	synced int64 // bytes known durable
	dirty  bool
	err    error // sticky
	buf    []byte

	compactNow chan struct{}
}

// Open opens (creating them when missing) the folder dir and its session
// log dir/sessions.log, replays it into memory and starts the goroutines
// that fsync and compact it; Close stops them. A torn last record is cut
// off; a damaged record is skipped with a log line (its session, or the
// part of it that record held, is lost; the rest loads).
func Open(dir string, o Options) (*Store, error) {
	return openLog(dir, o, osFS{})
}

func openLog(dir string, o Options, fs fsys) (*Store, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("session: options: %w", err)
	}
	s := newStore(o.Logger)
	b := &logBackend{s: s, fs: fs, dir: dir, path: filepath.Join(dir, logName), opts: o, compactNow: make(chan struct{}, 1)}
	if err := fs.MkdirAll(dir); err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	data, err := fs.ReadFile(b.path)
	switch {
	case errors.Is(err, os.ErrNotExist) || (err == nil && len(data) == 0):
		if err := b.create(); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, fmt.Errorf("session: read %s: %w", b.path, err)
	case data[0] == oldLogMagic:
		// The mochi-based gateway's log: its records do not map onto the
		// engine's sessions, so it is set aside (kept, for an operator) and
		// its sessions are not resumed.
		old := b.path + ".v1"
		if err := fs.Rename(b.path, old); err != nil {
			return nil, fmt.Errorf("session: set aside the previous format's log: %w", err)
		}
		s.log.Warn().Str("file", old).Msg("session log of the previous (mochi-based) format set aside: its sessions are not resumed")
		if err := b.create(); err != nil {
			return nil, err
		}
	default:
		if err := b.replay(data); err != nil {
			return nil, err
		}
	}
	s.b, s.lg = b, b
	s.wg.Go(b.syncLoop)
	s.wg.Go(b.compactLoop)
	return s, nil
}

// create writes a new log holding its header: into a temporary file,
// synced, then renamed, so that a crash leaves either no log or a whole
// header.
func (b *logBackend) create() error {
	var nb [8]byte
	_, _ = rand.Read(nb[:])
	b.nonce = binary.BigEndian.Uint64(nb[:])
	tmp := filepath.Join(b.dir, compactName)
	f, err := b.fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("session: create %s: %w", tmp, err)
	}
	hdr := appendHeader(nil, b.nonce)
	if _, err = f.WriteAt(hdr, 0); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = b.fs.Rename(tmp, b.path)
	}
	if err == nil {
		err = b.fs.SyncDir(b.dir)
	}
	if err != nil {
		_ = f.Close()
		_ = b.fs.Remove(tmp)
		return fmt.Errorf("session: create %s: %w", b.path, err)
	}
	b.f, b.size, b.synced = f, int64(len(hdr)), int64(len(hdr))
	b.s.log.Info().Str(logFile, b.path).Msg("session log created")
	return nil
}

// replay indexes the records of data (the whole file) and opens the file
// for appending after the last good record.
func (b *logBackend) replay(data []byte) error {
	s := b.s
	nonce, err := decodeHeader(data)
	if err != nil {
		return fmt.Errorf("session: %s: %w", b.path, err)
	}
	b.nonce = nonce
	records, damaged := 0, 0
	end := replay(data[headerSize:], headerSize, nonce, func(op byte, k string, value []byte, off int64, n int) {
		records++
		pk, err := parseKey(k)
		if err != nil {
			damaged++
			s.log.Warn().Err(err).Int64(logOffset, off).Str(logFile, b.path).Msg("session record with a bad key; skipped")
			return
		}
		s.ix.apply(op, pk, value, loc{off, uint32(n)})
	}, func(off int64, err error) {
		damaged++
		ev := s.log.Warn()
		if errors.Is(err, ErrTorn) {
			ev = s.log.Info()
		}
		ev.Err(err).Int64(logOffset, off).Str(logFile, b.path).Msg("session record damaged; skipped")
	})
	f, err := b.fs.OpenFile(b.path)
	if err != nil {
		return fmt.Errorf("session: open %s: %w", b.path, err)
	}
	if end < int64(len(data)) {
		// A torn or damaged tail: the next record is written where it began.
		if err := f.Truncate(end); err != nil {
			_ = f.Close()
			return fmt.Errorf("session: cut the damaged tail of %s: %w", b.path, err)
		}
		s.log.Info().Int64(logOffset, end).Int64("cut", int64(len(data))-end).Str(logFile, b.path).Msg("session log tail cut")
	}
	b.f, b.size, b.synced = f, end, end
	s.log.Info().Int("records", records).Int("damaged", damaged).Int64("bytes", end).
		Int("sessions", len(s.ix.sessions)).Int("retained", len(s.ix.retained)).Msg("session log loaded")
	return nil
}

func (b *logBackend) fail(err error) {
	if b.err == nil {
		b.err = fmt.Errorf("%w: %w", ErrLogFailed, err)
		b.s.log.Error().Err(err).Str(logFile, b.path).Msg("session log write failed; sessions are no longer persisted")
	}
}

func (b *logBackend) put(_, k string, value []byte) (loc, error) { return b.write(opPut, k, value) }

func (b *logBackend) del(_, k string) error {
	_, err := b.write(opDelete, k, nil)
	return err
}

// drop writes one delete of the session's client key: replay drops the
// whole session.
func (b *logBackend) drop(ss *sess) error {
	_, err := b.write(opDelete, clientKey(ss.id), nil)
	return err
}

// write appends one record to the file (the page cache: the sync loop
// fsyncs it) and returns where it is.
func (b *logBackend) write(op byte, k string, value []byte) (loc, error) {
	if b.err != nil {
		return loc{}, b.err
	}
	n := recordSize(k, value)
	if len(k) > maxRecordKey || n-recHeader > maxRecordBody {
		return loc{}, fmt.Errorf("%w: a record of %d bytes", ErrValueTooLarge, n)
	}
	b.buf = appendRecord(b.buf[:0], b.nonce, op, k, value)
	if _, err := b.f.WriteAt(b.buf, b.size); err != nil {
		b.fail(err)
		return loc{}, b.err
	}
	at := loc{b.size, uint32(n)}
	b.size += int64(n)
	b.dirty = true
	if cap(b.buf) > 1<<20 {
		b.buf = nil // a large message's buffer is not kept
	}
	return at, nil
}

// readAt reads the record of key k at at and returns its value.
func (b *logBackend) readAt(k string, at loc) ([]byte, error) {
	buf := make([]byte, at.n)
	if _, err := b.f.ReadAt(buf, at.off); err != nil {
		return nil, fmt.Errorf("session: read record at %d: %w", at.off, err)
	}
	return checkRecord(buf, b.nonce, k, at)
}

// checkRecord decodes the record rec read at at and checks that it is the
// put of k.
func checkRecord(rec []byte, nonce uint64, k string, at loc) ([]byte, error) {
	op, got, value, n, err := decodeRecord(rec, nonce)
	switch {
	case err != nil:
		return nil, fmt.Errorf("session: record at %d: %w", at.off, err)
	case op != opPut || got != k || n != len(rec):
		return nil, fmt.Errorf("session: record at %d: %w: not the put of its key", at.off, ErrBadKey)
	}
	return value, nil
}

func (b *logBackend) load() ([]engine.StoredSession, []*engine.Message, error) {
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, ErrClosed
	}
	data := make([]byte, b.size)
	if _, err := b.f.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("session: read %s: %w", b.path, err)
	}
	get := func(k string, at loc) ([]byte, error) {
		if at.off < headerSize || at.off+int64(at.n) > int64(len(data)) {
			return nil, fmt.Errorf("session: record at %d: %w: past the end of the log", at.off, ErrCorrupt)
		}
		return checkRecord(data[at.off:at.off+int64(at.n)], b.nonce, k, at)
	}
	now := time.Now()
	sessions := make([]engine.StoredSession, 0, len(s.ix.sessions))
	for _, id := range slices.Sorted(maps.Keys(s.ix.sessions)) {
		st, bad, err := build(s.ix.sessions[id], get)
		for _, e := range bad {
			s.log.Warn().Err(e).Str(logClient, id).Msg("stored session record does not load; skipped")
		}
		if err != nil {
			s.log.Warn().Err(err).Str(logClient, id).Msg("stored session does not load; dropped")
			s.ix.dropSession(id)
			continue
		}
		if st.Offline.IsZero() {
			if at, ok := s.putLocked(id, offlineKey(id), encodeOffline(now), "offline"); ok {
				s.ix.putOffline(id, at)
			}
		}
		sessions = append(sessions, st)
	}
	retained := make([]*engine.Message, 0, len(s.ix.retained))
	for _, topic := range slices.Sorted(maps.Keys(s.ix.retained)) {
		k := retainedKey(topic)
		v, err := get(k, s.ix.retained[topic])
		var m *engine.Message
		if err == nil {
			m, err = decodeRetained(v)
		}
		if err == nil && m.Topic != topic {
			err = fmt.Errorf("%w: retained message of %q under %q", ErrBadKey, m.Topic, topic)
		}
		if err != nil {
			s.log.Warn().Err(err).Str("topic", topic).Msg("stored retained message does not load; dropped")
			s.ix.delRetained(topic)
			continue
		}
		if m.Expiry > 0 && now.Unix() >= m.Expiry {
			if s.delLocked("", k, "retained") {
				s.ix.delRetained(topic)
			}
			continue
		}
		retained = append(retained, m)
	}
	return sessions, retained, nil
}

func (b *logBackend) loadMessages(id string) ([]engine.StoredMessage, error) {
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.ix.sessions[id]
	if ss == nil {
		return nil, nil
	}
	msgs, bad := buildMessages(ss, b.readAt)
	return msgs, errors.Join(bad...)
}

// syncLoop fsyncs what was written every SyncInterval and asks for a
// compaction when the log is more than half dead, until Close.
func (b *logBackend) syncLoop() {
	t := time.NewTicker(b.opts.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-b.s.stop:
			return
		case <-t.C:
		}
		b.sync()
		b.s.mu.Lock()
		due := b.err == nil && b.size > b.opts.CompactBytes && b.size > 2*(b.s.ix.live+headerSize)
		b.s.mu.Unlock()
		if due {
			select {
			case b.compactNow <- struct{}{}:
			default:
			}
		}
	}
}

// syncNow fsyncs what was written before the call, unless an fsync since
// covered it: callers that arrive during one fsync share the next (group
// commit).
func (b *logBackend) syncNow() error {
	s := b.s
	s.mu.Lock()
	target, err := b.size, b.err
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return b.syncTo(target)
}

// sync fsyncs the file if anything was written since the last sync,
// without holding Store.mu (writes go on meanwhile).
func (b *logBackend) sync() { _ = b.syncTo(-1) }

// syncTo fsyncs the file if anything was written since the last sync and
// the last sync did not cover target bytes (-1: any); it returns the
// backend's error, the fsync's included. Store.mu is not held during the
// fsync: writes go on meanwhile.
func (b *logBackend) syncTo(target int64) error {
	s := b.s
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	s.mu.Lock()
	if b.err != nil || !b.dirty || (target >= 0 && b.synced >= target) {
		err := b.err
		s.mu.Unlock()
		return err
	}
	f, size := b.f, b.size
	b.dirty = false
	s.mu.Unlock()
	err := f.Sync()
	s.mu.Lock()
	if err != nil {
		b.fail(err)
	} else {
		b.synced = max(b.synced, size)
	}
	s.mu.Unlock()
	return err
}

func (b *logBackend) compactLoop() {
	for {
		select {
		case <-b.s.stop:
			return
		case <-b.compactNow:
			if err := b.compact(); err != nil {
				b.s.log.Error().Err(err).Str(logFile, b.path).Msg("session log compaction")
			}
		}
	}
}

// close syncs and closes the file (the goroutines have ended).
func (b *logBackend) close() error {
	s := b.s
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if b.err == nil && b.dirty {
		if err = b.f.Sync(); err != nil {
			b.fail(err)
		} else {
			b.synced, b.dirty = b.size, false
		}
	}
	return errors.Join(err, b.f.Close())
}
