package store

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/core/store/vfs"
)

const (
	osCreateTrunc = os.O_CREATE | os.O_TRUNC | os.O_WRONLY
	osReadOnly    = os.O_RDONLY
	osReadWrite   = os.O_RDWR
	osCreateNew   = os.O_CREATE | os.O_EXCL | os.O_RDWR
)

// segment is one commit-log file. Its name is its base offset, 20 digits,
// zero-padded, so that names sort in offset order. Bytes [0, size) hold whole
// records; the file is never preallocated.
type segment struct {
	base int64
	file vfs.File
	// size is the number of bytes written. Only the writer changes it (under
	// commitLog.mu for readers' sake).
	size int64
	// mem maps the segment read-only when the filesystem allows it (nil
	// otherwise). Readers copy from it under commitLog.mu held shared, and
	// only below the confirmed end of the log, which the file covers.
	mem []byte
	// coldHinted is set once the file was given the cold-read hints
	// (sequential, no reuse).
	coldHinted atomic.Bool

	// The file opened for direct reads (vfs.DirectOpener), at the first
	// cold read of a dense run; directMu guards these three.
	directMu     sync.Mutex
	direct       vfs.DirectFile
	directFailed bool // the filesystem refused it: buffered reads only
	closed       bool
}

// directFile returns the segment's file for direct reads, opening it on
// first use; nil when fsys has none, refused one, or the segment closed.
func (s *segment) directFile(fsys vfs.FS) vfs.DirectFile {
	d, ok := fsys.(vfs.DirectOpener)
	if !ok {
		return nil
	}
	s.directMu.Lock()
	defer s.directMu.Unlock()
	if s.direct == nil && !s.directFailed && !s.closed {
		f, err := d.OpenDirect(s.file.Name())
		if err != nil {
			s.directFailed = true
			return nil
		}
		s.direct = f
	}
	return s.direct
}

// mapSegment maps s for reading if its file supports it. Failure to map is
// not an error: reads fall back to pread.
func (s *segment) mapFor(segBytes int64) {
	m, ok := s.file.(vfs.Mapper)
	if !ok {
		return
	}
	size := max(segBytes, s.size)
	if b, err := m.MapRead(size); err == nil {
		s.mem = b
	}
}

// close unmaps and closes the segment's file.
func (s *segment) close() error {
	if s.mem != nil {
		_ = vfs.Unmap(s.mem)
		s.mem = nil
	}
	s.directMu.Lock()
	s.closed = true
	d := s.direct
	s.direct = nil
	s.directMu.Unlock()
	if d != nil {
		_ = d.Close()
	}
	return s.file.Close()
}

func segmentName(base int64) string { return fmt.Sprintf("%020d", base) }

// parseOffsetName parses a 20-digit file name; ok is false for anything else.
func parseOffsetName(name string) (int64, bool) {
	if len(name) != 20 {
		return 0, false
	}
	v, err := strconv.ParseInt(name, 10, 64)
	if err != nil || v < 0 {
		return 0, false
	}
	return v, true
}

func openSegment(fsys vfs.FS, dir string, base int64, create bool) (*segment, error) {
	path := filepath.Join(dir, segmentName(base))
	flag := osReadWrite
	if create {
		flag = osCreateNew
	}
	f, err := fsys.OpenFile(path, flag, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open segment %s: %w", segmentName(base), err)
	}
	size, err := f.Size()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("stat segment %s: %w", segmentName(base), err)
	}
	return &segment{base: base, file: f, size: size}, nil
}

func (s *segment) end() int64 { return s.base + s.size }
