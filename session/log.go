package session

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"
)

// The session log is a sequence of records, each a put or a delete of one
// key. The newest record of a key wins; compaction rewrites only the live
// ones. All integers are little-endian.
//
//	offset  size  field
//	0       1     magic 0xF5 (marks record starts, for resync past damage)
//	1       4     CRC-32C (Castagnoli) of bytes 9 … end
//	5       4     length of bytes 9 … end
//	9       1     op: 1 put, 2 delete
//	10      2     key length k
//	12      k     key
//	12+k    …     value (put only): mochi's storage record, JSON
//
// A record that fails its checks is skipped with a log line and the reader
// resyncs at the next magic byte that starts a valid record: one damaged
// session is dropped, the others load. These constants are part of the
// format.
const (
	recMagic  = 0xF5
	recHeader = 9
	opPut     = 1
	opDelete  = 2
	// maxRecord bounds one record (a session's inflight message holds at
	// most one MQTT packet: 1 MiB by default, 256 MiB at most).
	maxRecord = 256<<20 + 64<<10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errBadRecord is returned by decodeRecord for a record that fails its checks.
var errBadRecord = errors.New("session: bad record")

func appendRecord(b []byte, op byte, key string, value []byte) []byte {
	start := len(b)
	body := 3 + len(key) + len(value)
	b = append(b, recMagic, 0, 0, 0, 0, 0, 0, 0, 0, op)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(key)))
	b = append(b, key...)
	b = append(b, value...)
	binary.LittleEndian.PutUint32(b[start+5:], uint32(body))
	binary.LittleEndian.PutUint32(b[start+1:], crc32.Checksum(b[start+recHeader:], castagnoli))
	return b
}

// decodeRecord decodes the record at the start of b and returns its size.
// It never panics: lengths are checked before slicing.
func decodeRecord(b []byte) (op byte, key string, value []byte, n int, err error) {
	if len(b) < recHeader+3 {
		return 0, "", nil, 0, fmt.Errorf("%w: %d bytes left, header needs %d", errBadRecord, len(b), recHeader+3)
	}
	if b[0] != recMagic {
		return 0, "", nil, 0, fmt.Errorf("%w: magic %#x", errBadRecord, b[0])
	}
	body := int(binary.LittleEndian.Uint32(b[5:9]))
	if body < 3 || body > maxRecord || body > len(b)-recHeader {
		return 0, "", nil, 0, fmt.Errorf("%w: length %d out of bounds", errBadRecord, body)
	}
	rec := b[recHeader : recHeader+body]
	if crc32.Checksum(rec, castagnoli) != binary.LittleEndian.Uint32(b[1:5]) {
		return 0, "", nil, 0, fmt.Errorf("%w: checksum mismatch", errBadRecord)
	}
	op = rec[0]
	k := int(binary.LittleEndian.Uint16(rec[1:3]))
	if 3+k > len(rec) || (op != opPut && op != opDelete) || (op == opDelete && 3+k != len(rec)) {
		return 0, "", nil, 0, fmt.Errorf("%w: op %d key length %d", errBadRecord, op, k)
	}
	return op, string(rec[3 : 3+k]), rec[3+k:], recHeader + body, nil
}

// replay calls apply for every valid record of b in order and reports
// damaged spans (offset, error) through bad. It resyncs after damage at the
// next byte that starts a valid record.
func replay(b []byte, apply func(op byte, key string, value []byte, off int64), bad func(off int64, err error)) {
	for off := 0; off < len(b); {
		op, key, value, n, err := decodeRecord(b[off:])
		if err == nil {
			apply(op, key, value, int64(off))
			off += n
			continue
		}
		bad(int64(off), err)
		next := bytes.IndexByte(b[off+1:], recMagic)
		for next >= 0 {
			at := off + 1 + next
			if _, _, _, _, e := decodeRecord(b[at:]); e == nil {
				break
			}
			n2 := bytes.IndexByte(b[at+1:], recMagic)
			if n2 < 0 {
				next = -1
				break
			}
			next = at + 1 + n2 - (off + 1)
		}
		if next < 0 {
			return
		}
		off = off + 1 + next
	}
}

func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// logBackend keeps a Store's records in one append-only file (the format
// above): writes go to the page cache at once (a process crash loses
// nothing written) and are fsynced every Options.SyncInterval; the file is
// compacted when more than half of it is dead. A failed write or fsync is
// sticky: the backend refuses every later write, like nats-server's
// filestore, so the file never holds a hole.
type logBackend struct {
	s    *Store // for the live entries compaction moves
	dir  string
	path string
	log  zerolog.Logger

	f     *os.File
	bytes int64 // bytes in the file
	dirty bool
	err   error // sticky write error: the backend stops writing
	buf   []byte
}

// openLog reads dir/sessions.log (creating dir), indexes its records into
// s through apply and opens the file for appending after the last good
// record.
func openLog(s *Store, dir string) (*logBackend, error) {
	b := &logBackend{s: s, dir: dir, path: filepath.Join(dir, "sessions.log"), log: s.log}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	data, err := os.ReadFile(b.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("session: read %s: %w", b.path, err)
	}
	end := int64(len(data))
	var lastBad int64 = -1
	records := 0
	replay(data, func(op byte, key string, value []byte, off int64) {
		s.apply(op, key, value, entry{off, int32(recHeader + 3 + len(key) + len(value))})
		records++
		lastBad = -1
	}, func(off int64, err error) {
		if lastBad < 0 {
			lastBad = off
		}
		b.log.Warn().Err(err).Int64("offset", off).Str("file", b.path).Msg("session record damaged; skipped")
	})
	if lastBad >= 0 {
		end = lastBad // a torn tail: the next record is written where it began
	}
	if b.f, err = os.OpenFile(b.path, os.O_RDWR|os.O_CREATE, 0o644); err != nil {
		return nil, fmt.Errorf("session: open %s: %w", b.path, err)
	}
	if err := b.f.Truncate(end); err != nil {
		_ = b.f.Close()
		return nil, fmt.Errorf("session: cut torn tail of %s: %w", b.path, err)
	}
	b.bytes = end
	b.log.Info().Int("records", records).Int64("bytes", end).Int("sessions", len(s.sessions)).
		Int("parked", s.parked).Int("queued", s.queued).Int("retained", len(s.retained)).Msg("sessions loaded")
	return b, nil
}

func (b *logBackend) fail(err error) {
	if b.err == nil {
		b.err = err
		b.log.Error().Err(err).Str("file", b.path).Msg("session log write failed; sessions are no longer persisted")
	}
}

// put appends a put record (to the page cache: a process crash loses
// nothing; tick fsyncs) and returns where it is.
func (b *logBackend) put(key string, value []byte) (entry, error) {
	return b.write(opPut, key, value)
}

func (b *logBackend) del(key string, _ entry) error {
	_, err := b.write(opDelete, key, nil)
	return err
}

func (b *logBackend) write(op byte, key string, value []byte) (entry, error) {
	if b.err != nil {
		return entry{}, b.err
	}
	if len(key) > 0xFFFF {
		return entry{}, fmt.Errorf("%w: key of %d bytes", ErrValueTooLarge, len(key))
	}
	b.buf = appendRecord(b.buf[:0], op, key, value)
	if _, err := b.f.WriteAt(b.buf, b.bytes); err != nil {
		b.fail(err)
		return entry{}, err
	}
	e := entry{b.bytes, int32(len(b.buf))}
	b.bytes += int64(e.n)
	b.dirty = true
	return e, nil
}

// read reads and checks the record at e and returns its value.
func (b *logBackend) read(_ string, e entry) ([]byte, error) {
	buf := make([]byte, e.n)
	if _, err := b.f.ReadAt(buf, e.off); err != nil {
		return nil, fmt.Errorf("session: read record at %d: %w", e.off, err)
	}
	_, _, value, _, err := decodeRecord(buf)
	if err != nil {
		return nil, fmt.Errorf("session: record at %d: %w", e.off, err)
	}
	return value, nil
}

// release: the log holds no ownership.
func (b *logBackend) release(string) {}

// tick fsyncs what was written and compacts the file when more than half
// of it is dead.
func (b *logBackend) tick() {
	if b.dirty && b.err == nil {
		if err := b.f.Sync(); err != nil {
			b.fail(err)
		}
		b.dirty = false
	}
	if b.err == nil && b.bytes > 1<<20 && b.bytes > 2*b.s.live {
		if err := b.compact(); err != nil {
			b.log.Error().Err(err).Msg("session log compaction")
		}
	}
}

func (b *logBackend) size() int64 { return b.bytes }

func (b *logBackend) close() error { return errors.Join(b.f.Sync(), b.f.Close()) }

// compact rewrites the live records into a new file, swaps it in and
// moves every entry of the store to its new place.
func (b *logBackend) compact() error {
	tmp := b.path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	var out []byte
	moved := map[*entry]entry{}
	var rerr error
	b.s.eachEntryLocked(func(e *entry) {
		if rerr != nil || e.n == 0 {
			return
		}
		rec := make([]byte, e.n)
		if _, err := b.f.ReadAt(rec, e.off); err != nil {
			rerr = fmt.Errorf("read record at %d: %w", e.off, err)
			return
		}
		moved[e] = entry{int64(len(out)), e.n}
		out = append(out, rec...)
	})
	if rerr != nil {
		_ = f.Close()
		return rerr
	}
	if _, err := f.Write(out); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := os.Rename(tmp, b.path); err != nil {
		_ = f.Close()
		return err
	}
	if d, err := os.Open(b.dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	_ = b.f.Close()
	for e, n := range moved {
		*e = n
	}
	b.f, b.bytes, b.dirty = f, int64(len(out)), false
	b.s.live = int64(len(out))
	return nil
}
