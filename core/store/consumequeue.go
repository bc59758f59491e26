package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// cqEntryLen is the size of a consume-queue entry; part of the format:
//
//	off  size  field
//	0    8     commit-log offset of the record
//	8    4     record size
//	12   8     tag hash (core.TagHash)
const cqEntryLen = 20

type cqEntry struct {
	offset  int64
	size    int32
	tagHash int64
}

func putCQEntry(b []byte, e cqEntry) {
	binary.BigEndian.PutUint64(b[0:], uint64(e.offset))
	binary.BigEndian.PutUint32(b[8:], uint32(e.size))
	binary.BigEndian.PutUint64(b[12:], uint64(e.tagHash))
}

func getCQEntry(b []byte) cqEntry {
	return cqEntry{
		offset:  int64(binary.BigEndian.Uint64(b[0:])),
		size:    int32(binary.BigEndian.Uint32(b[8:])),
		tagHash: int64(binary.BigEndian.Uint64(b[12:])),
	}
}

// consumeQueue is the index of one (topic, queue): entry k describes the
// message at queue offset k. It lives in files of perFile entries each, named
// by the queue offset of their first entry (20 digits), under
// consumequeue/<topic>/<queue>/.
//
// The dispatcher (the store's writer goroutine) is the only writer. Readers
// see entries below max, which the writer advances after the bytes are in the
// file.
type consumeQueue struct {
	fs      vfs.FS
	dir     string
	perFile int64

	mu    sync.RWMutex // guards files; held shared for reads, exclusively to add or remove files
	files []*cqFile

	min atomic.Int64 // first readable offset (retention moves it up)
	max atomic.Int64 // one past the last readable offset
	// gone is set when its topic was deleted: a reader that got the queue
	// before the deletion answers "topic not found", not a read error.
	gone atomic.Bool

	// wmu guards the write side: entries added but not yet written to a
	// file (pend, starting at queue offset pendStart; entries below
	// pendStart are in files) and the file writes. Readers take it only to
	// copy entries still pending.
	wmu       sync.Mutex
	pend      []byte
	pendStart int64
	dirty     atomic.Bool // written since the last checkpoint sync
	mark      uint64      // dispatcher's scratch: last dispatch round that touched this queue
}

type cqFile struct {
	first int64
	f     vfs.File
}

func openConsumeQueue(fsys vfs.FS, dir string, perFile int) (*consumeQueue, error) {
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create consume queue dir: %w", err)
	}
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list consume queue: %w", err)
	}
	cq := &consumeQueue{fs: fsys, dir: dir, perFile: int64(perFile)}
	for _, name := range names {
		first, ok := parseOffsetName(name)
		if !ok {
			continue
		}
		f, err := fsys.OpenFile(filepath.Join(dir, name), osReadWrite, 0o644)
		if err != nil {
			cq.close()
			return nil, fmt.Errorf("open consume queue file %s: %w", name, err)
		}
		cq.files = append(cq.files, &cqFile{first: first, f: f})
	}
	sort.Slice(cq.files, func(i, j int) bool { return cq.files[i].first < cq.files[j].first })
	// The count of entries is what the last file holds; files before it are
	// full by construction. Recovery trims what the log does not back.
	if n := len(cq.files); n > 0 {
		last := cq.files[n-1]
		size, err := last.f.Size()
		if err != nil {
			cq.close()
			return nil, fmt.Errorf("stat consume queue file: %w", err)
		}
		cq.min.Store(cq.files[0].first)
		cq.max.Store(last.first + size/cqEntryLen)
	}
	cq.pendStart = cq.max.Load()
	return cq, nil
}

func (cq *consumeQueue) close() error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	var errs []error
	for _, f := range cq.files {
		if err := f.f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	cq.files = nil
	return errors.Join(errs...)
}

// fileForLocked returns the file holding entry k, or nil.
func (cq *consumeQueue) fileForLocked(k int64) *cqFile {
	i := sort.Search(len(cq.files), func(i int) bool { return cq.files[i].first > k }) - 1
	if i < 0 {
		return nil
	}
	return cq.files[i]
}

// read returns up to n entries from offset k (which must be ≥ min), stopping
// at max and at the end of a file; entries not yet written to the file
// (pend) follow those that are, in one answer. It returns the raw entry
// bytes.
func (cq *consumeQueue) read(k int64, n int, buf []byte) ([]byte, error) {
	limit := cq.max.Load()
	if k >= limit || n <= 0 {
		return buf[:0], nil
	}
	if int64(n) > limit-k {
		n = int(limit - k)
	}
	cq.wmu.Lock()
	if ps := cq.pendStart; k >= ps {
		p := int(k-ps) * cqEntryLen
		q := min(len(cq.pend), p+n*cqEntryLen)
		if p >= q {
			cq.wmu.Unlock()
			return buf[:0], nil
		}
		buf = append(buf[:0], cq.pend[p:q]...)
		cq.wmu.Unlock()
		return buf, nil
	}
	more := 0 // entries past the file's, to take from pend after it
	ps := cq.pendStart
	if int64(n) > ps-k {
		n, more = int(ps-k), n-int(ps-k)
	}
	cq.wmu.Unlock()
	buf, err := cq.readFile(k, n, buf)
	if err != nil || more == 0 || len(buf) != n*cqEntryLen {
		return buf, err // an error, or the file ended first
	}
	cq.wmu.Lock()
	if cq.pendStart == ps { // else pend went to the file meanwhile: a short read
		buf = append(buf, cq.pend[:min(len(cq.pend), more*cqEntryLen)]...)
	}
	cq.wmu.Unlock()
	return buf, nil
}

// readFile reads n entries from offset k from the files, stopping at the
// end of a file.
func (cq *consumeQueue) readFile(k int64, n int, buf []byte) ([]byte, error) {
	cq.mu.RLock()
	defer cq.mu.RUnlock()
	f := cq.fileForLocked(k)
	if f == nil {
		return buf[:0], fmt.Errorf("consume queue %s: offset %d below the first file", cq.dir, k)
	}
	if rem := f.first + cq.perFile - k; int64(n) > rem {
		n = int(rem)
	}
	if cap(buf) < n*cqEntryLen {
		buf = make([]byte, n*cqEntryLen)
	}
	buf = buf[:n*cqEntryLen]
	got, err := f.f.ReadAt(buf, (k-f.first)*cqEntryLen)
	if got < len(buf) {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return buf[:0], fmt.Errorf("read consume queue %s at %d: %w", cq.dir, k, err)
	}
	return buf, nil
}

// entry returns the entry at offset k.
func (cq *consumeQueue) entry(k int64) (cqEntry, error) {
	var b [cqEntryLen]byte
	got, err := cq.read(k, 1, b[:0:cqEntryLen])
	if err != nil {
		return cqEntry{}, err
	}
	if len(got) != cqEntryLen {
		return cqEntry{}, fmt.Errorf("consume queue %s: no entry at %d", cq.dir, k)
	}
	return getCQEntry(got), nil
}

// cqFlushBytes is how many pending entry bytes make add write them out;
// below it they wait for the next checkpoint (readers see them from memory,
// as they would see a page-cache mapping).
const cqFlushBytes = 64 << 10

// add appends an entry at queue offset k to the pending entries. Entries
// become readable at publish. Dispatcher only.
func (cq *consumeQueue) add(k int64, e cqEntry) error {
	cq.wmu.Lock()
	defer cq.wmu.Unlock()
	if len(cq.pend) > 0 && k != cq.pendStart+int64(len(cq.pend)/cqEntryLen) {
		// Not contiguous (recovery skipped damaged records): write what is
		// pending, then start after the gap.
		if err := cq.flushLocked(); err != nil {
			return err
		}
	}
	if len(cq.pend) == 0 {
		cq.pendStart = k
	}
	var b [cqEntryLen]byte
	putCQEntry(b[:], e)
	cq.pend = append(cq.pend, b[:]...)
	if len(cq.pend) >= cqFlushBytes {
		return cq.flushLocked()
	}
	return nil
}

// publish makes every added entry readable.
func (cq *consumeQueue) publish() {
	cq.wmu.Lock()
	cq.max.Store(cq.pendStart + int64(len(cq.pend)/cqEntryLen))
	cq.wmu.Unlock()
}

// flush writes pending entries to their files.
func (cq *consumeQueue) flush() error {
	cq.wmu.Lock()
	defer cq.wmu.Unlock()
	return cq.flushLocked()
}

func (cq *consumeQueue) flushLocked() error {
	for len(cq.pend) > 0 {
		k := cq.pendStart
		f, err := cq.fileFor(k)
		if err != nil {
			return err
		}
		room := (f.first + cq.perFile - k) * cqEntryLen
		chunk := cq.pend
		if int64(len(chunk)) > room {
			chunk = chunk[:room]
		}
		if _, err := f.f.WriteAt(chunk, (k-f.first)*cqEntryLen); err != nil {
			return fmt.Errorf("write consume queue %s at %d: %w", cq.dir, k, err)
		}
		cq.dirty.Store(true)
		n := int64(len(chunk) / cqEntryLen)
		cq.pendStart = k + n
		cq.pend = cq.pend[len(chunk):]
	}
	cq.pend = cq.pend[:0:cap(cq.pend)]
	if cap(cq.pend) == 0 {
		cq.pend = nil
	}
	return nil
}

// fileFor returns the file for entry k, creating it when k starts a new one.
func (cq *consumeQueue) fileFor(k int64) (*cqFile, error) {
	cq.mu.RLock()
	f := cq.fileForLocked(k)
	cq.mu.RUnlock()
	if f != nil && k < f.first+cq.perFile {
		return f, nil
	}
	first := k - k%cq.perFile
	if f != nil && f.first+cq.perFile > first {
		first = f.first + cq.perFile
	}
	path := filepath.Join(cq.dir, segmentName(first))
	file, err := cq.fs.OpenFile(path, osCreateNew, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create consume queue file: %w", err)
	}
	if err := cq.fs.SyncDir(cq.dir); err != nil {
		_ = file.Close()
		return nil, fmt.Errorf("sync consume queue dir: %w", err)
	}
	nf := &cqFile{first: first, f: file}
	cq.mu.Lock()
	cq.files = append(cq.files, nf)
	if len(cq.files) == 1 {
		cq.min.Store(first)
	}
	cq.mu.Unlock()
	return nf, nil
}

// sync makes written entries durable.
func (cq *consumeQueue) sync() error {
	if err := cq.flush(); err != nil {
		return err
	}
	if !cq.dirty.Swap(false) {
		return nil
	}
	cq.mu.RLock()
	defer cq.mu.RUnlock()
	// Only the last two files can have been written since the last sync at
	// any realistic rate; syncing all would cost an fsync per old file.
	start := max(0, len(cq.files)-2)
	for _, f := range cq.files[start:] {
		if err := f.f.Sync(); err != nil {
			cq.dirty.Store(true)
			return fmt.Errorf("sync consume queue %s: %w", cq.dir, err)
		}
	}
	return nil
}

// truncate drops entries from offset k on (recovery only, before the writer
// starts).
func (cq *consumeQueue) truncate(k int64) error {
	cq.wmu.Lock()
	defer cq.wmu.Unlock()
	cq.mu.Lock()
	defer cq.mu.Unlock()
	for len(cq.files) > 0 {
		f := cq.files[len(cq.files)-1]
		if f.first < k {
			if err := f.f.Truncate((k - f.first) * cqEntryLen); err != nil {
				return fmt.Errorf("truncate consume queue %s: %w", cq.dir, err)
			}
			break
		}
		_ = f.f.Close()
		if err := cq.fs.Remove(filepath.Join(cq.dir, segmentName(f.first))); err != nil {
			return fmt.Errorf("remove consume queue file: %w", err)
		}
		cq.files = cq.files[:len(cq.files)-1]
	}
	if len(cq.files) == 0 {
		cq.min.Store(k)
	}
	cq.max.Store(k)
	cq.pendStart = k
	cq.pend = nil
	cq.dirty.Store(true)
	return nil
}

// searchOffset returns the first queue offset in [min, max) whose entry
// satisfies pred (pred must be monotonic), or max if none does.
func (cq *consumeQueue) searchOffset(pred func(cqEntry) (bool, error)) (int64, error) {
	lo, hi := cq.min.Load(), cq.max.Load()
	for lo < hi {
		mid := lo + (hi-lo)/2
		e, err := cq.entry(mid)
		if err != nil {
			return 0, err
		}
		ok, err := pred(e)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}

// dropBefore removes whole files whose entries all lie below offset k and
// raises min to k. Retention only.
func (cq *consumeQueue) dropBefore(k int64) error {
	if k > cq.max.Load() {
		k = cq.max.Load()
	}
	if k <= cq.min.Load() {
		return nil
	}
	cq.mu.Lock()
	var drop []*cqFile
	for len(cq.files) > 1 && cq.files[1].first <= k {
		drop = append(drop, cq.files[0])
		cq.files = cq.files[1:]
	}
	cq.min.Store(k)
	cq.mu.Unlock()
	var errs []error
	for _, f := range drop {
		_ = f.f.Close()
		if err := cq.fs.Remove(filepath.Join(cq.dir, segmentName(f.first))); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// dirConsumeQueue holds one folder per topic, one per queue inside it.
const dirConsumeQueue = "consumequeue"

func queueDir(root, topic string, queue int) string {
	return filepath.Join(root, dirConsumeQueue, topic, strconv.Itoa(queue))
}
