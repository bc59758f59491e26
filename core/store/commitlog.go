package store

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// commitLog is the list of segments. Offsets are global byte positions: a
// segment's base plus the position in its file. Consecutive segments abut:
// a new segment starts where the previous one ended, so there are no gaps
// (a record that would not fit starts the next segment instead).
//
// Lock order: Store.appendMu, then commitLog.mu, then tailCache.mu.
type commitLog struct {
	fs       vfs.FS
	dir      string
	segBytes int64

	mu   sync.RWMutex // guards segs and each segment's size
	segs []*segment   // ascending by base; the last one is active

	// cache holds the newest bytes of the log (nil: off). Set by Open
	// before the writer starts and never changed after; close releases its
	// memory under mu (held exclusively, so no view is in it), and from
	// then on there are no segments, so no read gets as far as it.
	cache *tailCache
	// hits and misses count the records view served from the tail cache
	// and from the segments.
	hits, misses atomic.Int64
	// dropLag and dropAlign shape cold reads' drop-behind (dropBehindLag,
	// dropBehindAlign; tests set less). Set at open.
	dropLag, dropAlign int64
}

func openCommitLog(fsys vfs.FS, dir string, segBytes int64) (*commitLog, error) {
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create commit log dir: %w", err)
	}
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list commit log: %w", err)
	}
	cl := &commitLog{fs: fsys, dir: dir, segBytes: segBytes, dropLag: dropBehindLag, dropAlign: dropBehindAlign}
	for _, name := range names {
		base, ok := parseOffsetName(name)
		if !ok {
			continue
		}
		seg, err := openSegment(fsys, dir, base, false)
		if err != nil {
			cl.close()
			return nil, err
		}
		seg.mapFor(segBytes)
		cl.segs = append(cl.segs, seg)
	}
	sort.Slice(cl.segs, func(i, j int) bool { return cl.segs[i].base < cl.segs[j].base })
	for i := 1; i < len(cl.segs); i++ {
		if prev := cl.segs[i-1]; prev.end() > cl.segs[i].base {
			cl.close()
			return nil, fmt.Errorf("%w: segment %s overlaps %s", core.ErrCorrupt, segmentName(prev.base), segmentName(cl.segs[i].base))
		}
	}
	return cl, nil
}

func (cl *commitLog) close() error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.cache != nil {
		cl.cache.release() // the pointer stays: readers load it without the lock
	}
	var errs []error
	for _, s := range cl.segs {
		if err := s.close(); err != nil {
			errs = append(errs, fmt.Errorf("close segment %s: %w", segmentName(s.base), err))
		}
	}
	cl.segs = nil
	return errors.Join(errs...)
}

// bounds returns the first offset still stored and the end of the log.
func (cl *commitLog) bounds() (minOff, maxOff int64) {
	cl.mu.RLock()
	defer cl.mu.RUnlock()
	if len(cl.segs) == 0 {
		return 0, 0
	}
	return cl.segs[0].base, cl.segs[len(cl.segs)-1].end()
}

// diskBytes returns the total size of all segments.
func (cl *commitLog) diskBytes() int64 {
	cl.mu.RLock()
	defer cl.mu.RUnlock()
	var n int64
	for _, s := range cl.segs {
		n += s.size
	}
	return n
}

// findLocked returns the index of the segment holding off, or -1.
func (cl *commitLog) findLocked(off int64) int {
	i := sort.Search(len(cl.segs), func(i int) bool { return cl.segs[i].base > off }) - 1
	if i < 0 || off >= cl.segs[i].end() {
		return -1
	}
	return i
}

// segmentForLocked returns the segment that holds the n bytes at global
// offset off, below limit (the confirmed end of the log); ErrMessageNotFound
// if they are not in the log or cross a segment's end. cl.mu is held.
func (cl *commitLog) segmentForLocked(off int64, n int, limit int64) (*segment, error) {
	if off < 0 || n < 0 || off+int64(n) > limit {
		return nil, fmt.Errorf("%w: %d bytes at %d beyond %d", core.ErrMessageNotFound, n, off, limit)
	}
	i := cl.findLocked(off)
	if i < 0 {
		return nil, fmt.Errorf("%w: offset %d not in the log", core.ErrMessageNotFound, off)
	}
	s := cl.segs[i]
	if off+int64(n) > s.end() {
		return nil, fmt.Errorf("%w: %d bytes at %d cross the end of segment %s", core.ErrMessageNotFound, n, off, segmentName(s.base))
	}
	return s, nil
}

// readAt reads len(p) bytes at global offset off, which must lie within one
// segment. limit caps what is readable (the confirmed end of the log).
func (cl *commitLog) readAt(p []byte, off, limit int64) error {
	cl.mu.RLock()
	defer cl.mu.RUnlock()
	s, err := cl.segmentForLocked(off, len(p), limit)
	if err != nil {
		return err
	}
	if cl.cache != nil && cl.cache.readAt(p, off) {
		return nil
	}
	if pos := off - s.base; s.mem != nil && pos+int64(len(p)) <= int64(len(s.mem)) {
		if err := viewMapped(s.mem[pos:pos+int64(len(p))], func(b []byte) error { copy(p, b); return nil }); err != nil {
			return fmt.Errorf("read segment %s at %d: %w", segmentName(s.base), pos, err)
		}
		return nil
	}
	n, err := s.file.ReadAt(p, off-s.base)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("read segment %s at %d: %w", segmentName(s.base), off-s.base, err)
}

// view calls fn with the n bytes at global offset off (within one segment,
// below limit). From the tail cache fn sees the cache's memory; on a mapped
// segment the mapping itself, under the read lock and with faults turned
// into errors; so it must not keep the slice. Otherwise the bytes are read
// into a buffer first.
func (cl *commitLog) view(off int64, n int, limit int64, fn func([]byte) error) error {
	cl.mu.RLock()
	// Checked before anything is allocated: n may come from a message ID.
	sg, err := cl.segmentForLocked(off, n, limit)
	if err != nil {
		cl.mu.RUnlock()
		return err
	}
	if cl.cache != nil {
		hit, err := cl.cache.view(off, n, fn)
		if hit {
			cl.mu.RUnlock()
			cl.hits.Add(1)
			return err
		}
	}
	cl.misses.Add(1)
	if pos := off - sg.base; sg.mem != nil && pos+int64(n) <= int64(len(sg.mem)) {
		err := viewMapped(sg.mem[pos:pos+int64(n)], fn)
		cl.mu.RUnlock()
		return err
	}
	cl.mu.RUnlock()
	buf := make([]byte, n)
	if err := cl.readAt(buf, off, limit); err != nil {
		return err
	}
	return fn(buf)
}

// viewMapped runs fn on bytes of a mapping with faults turned into errors:
// an I/O error under a mapped page raises SIGBUS, which must not kill the
// process.
func viewMapped(b []byte, fn func([]byte) error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			err = fmt.Errorf("fault reading mapped segment: %v", r)
		}
	}()
	return fn(b)
}

// segmentBounds returns (base, end) of the segment that holds off, or ok false.
func (cl *commitLog) segmentBounds(off int64) (base, end int64, ok bool) {
	cl.mu.RLock()
	defer cl.mu.RUnlock()
	i := cl.findLocked(off)
	if i < 0 {
		return 0, 0, false
	}
	return cl.segs[i].base, cl.segs[i].end(), true
}

// active returns the last segment, creating the first one at base if the log
// is empty.
func (cl *commitLog) active(base int64) (*segment, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if n := len(cl.segs); n > 0 {
		return cl.segs[n-1], nil
	}
	return cl.rollLocked(base)
}

// roll seals the active segment (fsync) and starts a new one at base.
func (cl *commitLog) roll(base int64) (*segment, error) {
	cl.mu.RLock()
	var last *segment
	if n := len(cl.segs); n > 0 {
		last = cl.segs[n-1]
	}
	cl.mu.RUnlock()
	if last != nil {
		// Seal: only the active segment can ever have a torn tail.
		if err := last.file.Sync(); err != nil {
			return nil, fmt.Errorf("sync segment %s before roll: %w", segmentName(last.base), err)
		}
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.rollLocked(base)
}

func (cl *commitLog) rollLocked(base int64) (*segment, error) {
	seg, err := openSegment(cl.fs, cl.dir, base, true)
	if err != nil {
		return nil, err
	}
	if err := cl.fs.SyncDir(cl.dir); err != nil {
		_ = seg.close()
		return nil, fmt.Errorf("sync commit log dir: %w", err)
	}
	seg.mapFor(cl.segBytes)
	cl.segs = append(cl.segs, seg)
	return seg, nil
}

// truncate cuts the log at off: later segments are removed and the one
// holding off is shortened. Used by recovery only.
func (cl *commitLog) truncate(off int64) error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for len(cl.segs) > 0 {
		s := cl.segs[len(cl.segs)-1]
		if s.base < off || (s.base == off && len(cl.segs) == 1) {
			break
		}
		// Entire segment beyond the cut.
		_ = s.close()
		if err := cl.fs.Remove(filepath.Join(cl.dir, segmentName(s.base))); err != nil {
			return fmt.Errorf("remove segment %s past the cut: %w", segmentName(s.base), err)
		}
		cl.segs = cl.segs[:len(cl.segs)-1]
	}
	if len(cl.segs) == 0 {
		return nil
	}
	s := cl.segs[len(cl.segs)-1]
	if s.end() <= off {
		return cl.fs.SyncDir(cl.dir)
	}
	if err := s.file.Truncate(off - s.base); err != nil {
		return fmt.Errorf("truncate segment %s at %d: %w", segmentName(s.base), off-s.base, err)
	}
	if err := s.file.Sync(); err != nil {
		return fmt.Errorf("sync truncated segment %s: %w", segmentName(s.base), err)
	}
	s.size = off - s.base
	return cl.fs.SyncDir(cl.dir)
}

// removeOldest deletes the first segment; it never removes the active one.
func (cl *commitLog) removeOldest() (removed *segment, err error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if len(cl.segs) < 2 {
		return nil, nil
	}
	s := cl.segs[0]
	cl.segs = cl.segs[1:]
	if cl.cache != nil {
		cl.cache.dropBelow(cl.segs[0].base) // it serves no byte of a deleted segment
	}
	_ = s.file.Close()
	if err := cl.fs.Remove(filepath.Join(cl.dir, segmentName(s.base))); err != nil {
		return s, fmt.Errorf("remove segment %s: %w", segmentName(s.base), err)
	}
	return s, nil
}

// segmentList returns a snapshot of the segments' (base, end).
func (cl *commitLog) segmentList() [][2]int64 {
	cl.mu.RLock()
	defer cl.mu.RUnlock()
	out := make([][2]int64, len(cl.segs))
	for i, s := range cl.segs {
		out[i] = [2]int64{s.base, s.end()}
	}
	return out
}
