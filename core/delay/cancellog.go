package delay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// The cancel log, <dir>/cancelled.log, holds one fixed-size record per
// cancellation, appended and fsynced before Cancel returns:
//
//	offset  size  field
//	     0     4  CRC-32C (Castagnoli) of bytes 4–27
//	     4    16  message ID of the original delayed message
//	    20     8  its due time, unix nanoseconds (big-endian)
//
// A short last record is a torn append and is cut off when the log is
// opened; a record whose CRC does not match is skipped and reported. At open
// the log is rewritten (temporary file, fsync, rename, fsync of the folder)
// with only the cancellations still worth keeping. These constants are part
// of the format.
const (
	cancelFile      = "cancelled.log"
	cancelRecordLen = 28
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// cancelEntry is one cancellation.
type cancelEntry struct {
	id  core.MessageID
	due int64 // unix ns
}

func appendCancelRecord(b []byte, e cancelEntry) []byte {
	var r [cancelRecordLen]byte
	copy(r[4:20], e.id[:])
	binary.BigEndian.PutUint64(r[20:], uint64(e.due))
	binary.BigEndian.PutUint32(r[:4], crc32.Checksum(r[4:], crcTable))
	return append(b, r[:]...)
}

// errBadCancelRecord marks a record whose CRC does not match.
var errBadCancelRecord = errors.New("cancel record checksum mismatch")

// decodeCancelLog parses a cancel log's bytes. It returns the valid entries,
// the length of the whole records (a torn tail is cut there) and how many
// damaged records it skipped. It never panics.
func decodeCancelLog(b []byte) (entries []cancelEntry, whole int, damaged int) {
	whole = len(b) - len(b)%cancelRecordLen
	for off := 0; off+cancelRecordLen <= whole; off += cancelRecordLen {
		r := b[off : off+cancelRecordLen]
		if binary.BigEndian.Uint32(r[:4]) != crc32.Checksum(r[4:], crcTable) {
			damaged++
			continue
		}
		var e cancelEntry
		copy(e.id[:], r[4:20])
		e.due = int64(binary.BigEndian.Uint64(r[20:]))
		entries = append(entries, e)
	}
	return entries, whole, damaged
}

// cancelStore is where the Service records cancellations: the cancel log,
// or a CancelStore from the options.
type cancelStore interface {
	append(e cancelEntry) error
	close() error
}

// sharedCancels adapts Options.Cancels.
type sharedCancels struct{ CancelStore }

func (c sharedCancels) append(e cancelEntry) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Add(ctx, e.id, e.dueTime()); err != nil {
		return fmt.Errorf("%w: %w", ErrCancelLog, err)
	}
	return nil
}

func (sharedCancels) close() error { return nil }

// cancelLog is the open cancel log. Not safe for concurrent use: the Service
// calls it under its mutex.
type cancelLog struct {
	path string
	f    *os.File
	// failed is sticky: after a failed write or fsync the file's state is
	// unknown, so no further record is appended.
	failed error
}

// openCancelLog loads dir's cancel log, keeps the entries keep accepts,
// rewrites the log with only those and opens it for appending.
func openCancelLog(dir string, keep func(cancelEntry) bool) (*cancelLog, []cancelEntry, int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, 0, fmt.Errorf("create %s: %w", dir, err)
	}
	path := filepath.Join(dir, cancelFile)
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, 0, fmt.Errorf("read %s: %w", path, err)
	}
	all, _, damaged := decodeCancelLog(b)
	live := all[:0]
	for _, e := range all {
		if keep(e) {
			live = append(live, e)
		}
	}
	var out []byte
	for _, e := range live {
		out = appendCancelRecord(out, e)
	}
	tmp := path + ".tmp"
	if err := writeSynced(tmp, out); err != nil {
		return nil, nil, 0, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, nil, 0, fmt.Errorf("replace %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return nil, nil, 0, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("open %s: %w", path, err)
	}
	return &cancelLog{path: path, f: f}, live, damaged, nil
}

// append writes one record and fsyncs it.
func (l *cancelLog) append(e cancelEntry) error {
	if l.failed != nil {
		return fmt.Errorf("%w: %w", ErrCancelLog, l.failed)
	}
	if _, err := l.f.Write(appendCancelRecord(nil, e)); err != nil {
		l.failed = fmt.Errorf("write %s: %w", l.path, err)
		return fmt.Errorf("%w: %w", ErrCancelLog, l.failed)
	}
	if err := l.f.Sync(); err != nil {
		l.failed = fmt.Errorf("sync %s: %w", l.path, err)
		return fmt.Errorf("%w: %w", ErrCancelLog, l.failed)
	}
	return nil
}

func (l *cancelLog) close() error {
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", l.path, err)
	}
	return nil
}

func writeSynced(path string, b []byte) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close %s: %w", path, cerr)
		}
	}()
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// dueTime converts a record's due field.
func (e cancelEntry) dueTime() time.Time { return time.Unix(0, e.due) }
