package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"path/filepath"
	"sort"
	"sync"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// The key index maps (topic, key) to commit-log locations. It is a chain of
// hash files in the style of RocketMQ's IndexFile, each named by the
// commit-log offset of its first entry (20 digits) under index/:
//
//	header (64 bytes)
//	  off  size  field
//	  0    4     magic "FMQI"
//	  4    1     version (1)
//	  5    1     sealed: 1 once the slot table and count are final
//	  6    2     reserved
//	  8    4     slot count S
//	  12   4     entry capacity C
//	  16   4     entry count (valid when sealed)
//	  20   4     reserved
//	  24   8     first commit-log offset indexed
//	  32   8     last commit-log offset indexed
//	  40   8     first store time (unix ns)
//	  48   8     last store time (unix ns)
//	  56   4     CRC-32C of bytes [0, 56)
//	  60   4     reserved
//	slot table: S × u32, entry number + 1 of the newest entry in the slot, 0 = empty
//	entries: C × 32 bytes
//	  0    8     key hash (FNV-1a 64 of topic, 0x00, key)
//	  8    8     commit-log offset
//	  16   8     store time (unix ns)
//	  24   4     previous entry in the same slot, number + 1, 0 = none
//	  28   4     record size
//
// Only sealed files have a slot table on disk; the active file keeps its slots
// in memory and rebuilds them from its entries on open. Every hit is confirmed
// against the commit log, so a stale or colliding entry is never served.
const (
	indexMagic     uint32 = 0x464D5149 // "FMQI"
	indexVersion          = 1
	indexHeaderLen        = 64
	indexEntryLen         = 32

	// indexFlushBytes is how many pending entry bytes make add write them;
	// below it they wait for the checkpoint (lookups read them from memory).
	indexFlushBytes = 64 << 10
)

type indexEntry struct {
	hash     uint64
	offset   int64
	storedAt int64
	prev     uint32
	size     uint32
}

func keyHash(topic string, key string) uint64 {
	h := core.FNV64a(core.FNV64Offset, topic)
	h = core.FNV64a(h, "\x00")
	return core.FNV64a(h, key)
}

type indexFile struct {
	first    int64 // name
	f        vfs.File
	slots    int
	capacity int

	// Header fields.
	sealed             bool
	count              int
	firstOff, lastOff  int64
	firstTime, lastTim int64

	// Active file only.
	mem     []uint32 // slot table
	flushed int      // entries written to the file
	pend    []byte   // entries count-flushed not yet written
}

// newSlotTable makes an active file's in-memory slot table (4 MiB at the
// default 1 Mi slots) resident at once: it is the index's fixed cost, paid
// when the store opens (the spare) rather than faulted in page by page by
// the first keys, where it looked like a cost per key (~270 B each for the
// first 15,000, a connect storm's presence events) that vanishes at scale
// (4 B each at a million). Like RocketMQ's warmed mapped files, memory the
// store will use is taken up front, so what grows later is what grows.
func newSlotTable(n int) []uint32 {
	t := make([]uint32, n)
	const perPage = 4096 / 4
	for i := 0; i < n; i += perPage {
		t[i] = 0
	}
	return t
}

func (x *indexFile) slotPos(slot int) int64 { return indexHeaderLen + int64(slot)*4 }
func (x *indexFile) entryPos(n int) int64 {
	return indexHeaderLen + int64(x.slots)*4 + int64(n)*indexEntryLen
}

func (x *indexFile) header() []byte {
	b := make([]byte, indexHeaderLen)
	be := binary.BigEndian
	be.PutUint32(b[0:], indexMagic)
	b[4] = indexVersion
	if x.sealed {
		b[5] = 1
	}
	be.PutUint32(b[8:], uint32(x.slots))
	be.PutUint32(b[12:], uint32(x.capacity))
	be.PutUint32(b[16:], uint32(x.count))
	be.PutUint64(b[24:], uint64(x.firstOff))
	be.PutUint64(b[32:], uint64(x.lastOff))
	be.PutUint64(b[40:], uint64(x.firstTime))
	be.PutUint64(b[48:], uint64(x.lastTim))
	be.PutUint32(b[56:], crc32.Checksum(b[:56], castagnoli))
	return b
}

func (x *indexFile) parseHeader(b []byte) error {
	be := binary.BigEndian
	if len(b) < indexHeaderLen {
		return fmt.Errorf("index header: %d bytes", len(b))
	}
	if m := be.Uint32(b); m != indexMagic {
		return fmt.Errorf("index header: bad magic %#08x", m)
	}
	if b[4] != indexVersion {
		return fmt.Errorf("index header: unknown version %d", b[4])
	}
	if want, got := be.Uint32(b[56:]), crc32.Checksum(b[:56], castagnoli); want != got {
		return fmt.Errorf("index header: checksum %#08x, computed %#08x", want, got)
	}
	x.sealed = b[5] == 1
	x.slots = int(be.Uint32(b[8:]))
	x.capacity = int(be.Uint32(b[12:]))
	x.count = int(be.Uint32(b[16:]))
	x.firstOff = int64(be.Uint64(b[24:]))
	x.lastOff = int64(be.Uint64(b[32:]))
	x.firstTime = int64(be.Uint64(b[40:]))
	x.lastTim = int64(be.Uint64(b[48:]))
	if x.slots < 1 || x.slots > 1<<28 || x.capacity < 1 || x.capacity > 1<<28 || x.count > x.capacity {
		return fmt.Errorf("index header: slots %d, capacity %d, count %d out of range", x.slots, x.capacity, x.count)
	}
	return nil
}

func putIndexEntry(b []byte, e indexEntry) {
	be := binary.BigEndian
	be.PutUint64(b[0:], e.hash)
	be.PutUint64(b[8:], uint64(e.offset))
	be.PutUint64(b[16:], uint64(e.storedAt))
	be.PutUint32(b[24:], e.prev)
	be.PutUint32(b[28:], e.size)
}

func getIndexEntry(b []byte) indexEntry {
	be := binary.BigEndian
	return indexEntry{
		hash:     be.Uint64(b[0:]),
		offset:   int64(be.Uint64(b[8:])),
		storedAt: int64(be.Uint64(b[16:])),
		prev:     be.Uint32(b[24:]),
		size:     be.Uint32(b[28:]),
	}
}

// keyIndex is the chain of index files. The writer goroutine adds entries;
// lookups may run concurrently.
type keyIndex struct {
	fs       vfs.FS
	dir      string
	slots    int
	capacity int

	mu    sync.RWMutex // guards files and the active file's in-memory state
	files []*indexFile // ascending; the last may be active (unsealed)
	spare []uint32     // zeroed slot table for the next active file
	dirty bool
}

func openKeyIndex(fsys vfs.FS, dir string, slots, capacity int, cut int64) (*keyIndex, error) {
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create index dir: %w", err)
	}
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list index: %w", err)
	}
	ki := &keyIndex{fs: fsys, dir: dir, slots: slots, capacity: capacity}
	for _, name := range names {
		first, ok := parseOffsetName(name)
		if !ok {
			continue
		}
		x, err := ki.openFile(first, cut)
		if err != nil {
			// The index is derived data: a damaged file is dropped and
			// lookups fall back to what remains. Recovery re-indexes from
			// the checkpoint on.
			_ = fsys.Remove(filepath.Join(dir, name))
			continue
		}
		if x == nil {
			continue
		}
		ki.files = append(ki.files, x)
	}
	sort.Slice(ki.files, func(i, j int) bool { return ki.files[i].first < ki.files[j].first })
	if n := len(ki.files); n == 0 || ki.files[n-1].sealed {
		ki.spare = newSlotTable(slots)
	}
	// Every file but the last must be sealed.
	for i, x := range ki.files {
		if !x.sealed && i < len(ki.files)-1 {
			if err := ki.sealLocked(x); err != nil {
				ki.close()
				return nil, err
			}
		}
	}
	return ki, nil
}

// openFile opens an index file. An unsealed file is loaded: its entries up to
// the first one at or past cut (or the first invalid one) are kept, the rest
// cut off, and the slot table rebuilt. A file whose first entry is past cut is
// removed (nil, nil).
func (ki *keyIndex) openFile(first, cut int64) (*indexFile, error) {
	path := filepath.Join(ki.dir, segmentName(first))
	f, err := ki.fs.OpenFile(path, osReadWrite, 0o644)
	if err != nil {
		return nil, err
	}
	x := &indexFile{first: first, f: f}
	hb := make([]byte, indexHeaderLen)
	if _, err := f.ReadAt(hb, 0); err != nil {
		_ = f.Close()
		return nil, err
	}
	if err := x.parseHeader(hb); err != nil {
		_ = f.Close()
		return nil, err
	}
	if x.sealed && x.lastOff < cut {
		return x, nil
	}
	if first >= cut {
		_ = f.Close()
		return nil, ki.fs.Remove(path)
	}
	// Load entries (sealed files crossing the cut are reopened as active).
	x.sealed = false
	x.mem = newSlotTable(x.slots)
	size, err := f.Size()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	avail := int((size - x.entryPos(0)) / indexEntryLen)
	avail = max(0, min(avail, x.capacity))
	buf := make([]byte, 64<<10)
	n := 0
	x.count = 0
	x.firstTime, x.lastTim, x.firstOff, x.lastOff = 0, 0, 0, 0
load:
	for n < avail {
		k := min(len(buf)/indexEntryLen, avail-n)
		chunk := buf[:k*indexEntryLen]
		if _, err := f.ReadAt(chunk, x.entryPos(n)); err != nil && !errors.Is(err, io.EOF) {
			_ = f.Close()
			return nil, err
		}
		for i := 0; i < k; i++ {
			e := getIndexEntry(chunk[i*indexEntryLen:])
			if e.storedAt == 0 || e.offset >= cut || e.offset < x.lastOff || e.size == 0 {
				break load
			}
			ki.linkLocked(x, e)
			n++
		}
	}
	x.flushed = x.count
	if err := f.Truncate(x.entryPos(x.count)); err != nil {
		_ = f.Close()
		return nil, err
	}
	if _, err := f.WriteAt(x.header(), 0); err != nil {
		_ = f.Close()
		return nil, err
	}
	return x, nil
}

// linkLocked adds e to x's in-memory slot chain and header fields (entry
// bytes are the caller's business).
func (ki *keyIndex) linkLocked(x *indexFile, e indexEntry) {
	slot := int(e.hash % uint64(x.slots))
	e.prev = x.mem[slot]
	x.mem[slot] = uint32(x.count + 1)
	if x.count == 0 {
		x.firstOff, x.firstTime = e.offset, e.storedAt
	}
	x.lastOff, x.lastTim = e.offset, e.storedAt
	x.count++
}

func (ki *keyIndex) close() error {
	ki.mu.Lock()
	defer ki.mu.Unlock()
	var errs []error
	for _, x := range ki.files {
		if err := x.f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	ki.files = nil
	return errors.Join(errs...)
}

// add indexes one key of a record. Writer only.
func (ki *keyIndex) add(hash uint64, offset int64, size int, storedAt int64) error {
	ki.mu.Lock()
	defer ki.mu.Unlock()
	x, err := ki.activeLocked(offset)
	if err != nil {
		return err
	}
	e := indexEntry{hash: hash, offset: offset, storedAt: storedAt, size: uint32(size)}
	slot := int(hash % uint64(x.slots))
	e.prev = x.mem[slot]
	var b [indexEntryLen]byte
	putIndexEntry(b[:], e)
	x.pend = append(x.pend, b[:]...)
	ki.linkLocked(x, e)
	ki.dirty = true
	if len(x.pend) >= indexFlushBytes {
		return ki.flushLocked()
	}
	return nil
}

func (ki *keyIndex) activeLocked(offset int64) (*indexFile, error) {
	if n := len(ki.files); n > 0 {
		x := ki.files[n-1]
		if !x.sealed && x.count < x.capacity {
			return x, nil
		}
		if !x.sealed {
			if err := ki.flushLocked(); err != nil {
				return nil, err
			}
			if err := ki.sealLocked(x); err != nil {
				return nil, err
			}
		}
	}
	path := filepath.Join(ki.dir, segmentName(offset))
	f, err := ki.fs.OpenFile(path, osCreateNew, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create index file: %w", err)
	}
	mem := ki.spare
	if len(mem) != ki.slots {
		mem = newSlotTable(ki.slots)
	}
	ki.spare = nil
	x := &indexFile{first: offset, f: f, slots: ki.slots, capacity: ki.capacity, mem: mem}
	if _, err := f.WriteAt(x.header(), 0); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("write index header: %w", err)
	}
	if err := ki.fs.SyncDir(ki.dir); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("sync index dir: %w", err)
	}
	ki.files = append(ki.files, x)
	return x, nil
}

func (ki *keyIndex) flushLocked() error {
	n := len(ki.files)
	if n == 0 {
		return nil
	}
	x := ki.files[n-1]
	if len(x.pend) == 0 {
		return nil
	}
	if _, err := x.f.WriteAt(x.pend, x.entryPos(x.flushed)); err != nil {
		return fmt.Errorf("write index entries: %w", err)
	}
	x.flushed += len(x.pend) / indexEntryLen
	x.pend = x.pend[:0]
	return nil
}

// sealLocked writes the slot table and the final header, then syncs.
func (ki *keyIndex) sealLocked(x *indexFile) error {
	st := make([]byte, 4*x.slots)
	for i, v := range x.mem {
		binary.BigEndian.PutUint32(st[4*i:], v)
	}
	if _, err := x.f.WriteAt(st, x.slotPos(0)); err != nil {
		return fmt.Errorf("write index slots: %w", err)
	}
	if err := x.f.Sync(); err != nil {
		return fmt.Errorf("sync index file: %w", err)
	}
	x.sealed = true
	if _, err := x.f.WriteAt(x.header(), 0); err != nil {
		return fmt.Errorf("write index header: %w", err)
	}
	if err := x.f.Sync(); err != nil {
		return fmt.Errorf("sync index file: %w", err)
	}
	clear(x.mem)
	ki.spare, x.mem = x.mem, nil
	return nil
}

// sync makes written entries durable (checkpoint).
func (ki *keyIndex) sync() error {
	ki.mu.Lock()
	if !ki.dirty || len(ki.files) == 0 {
		ki.mu.Unlock()
		return nil
	}
	if err := ki.flushLocked(); err != nil {
		ki.mu.Unlock()
		return err
	}
	ki.dirty = false
	x := ki.files[len(ki.files)-1]
	ki.mu.Unlock()
	if err := x.f.Sync(); err != nil {
		ki.mu.Lock()
		ki.dirty = true
		ki.mu.Unlock()
		return fmt.Errorf("sync index: %w", err)
	}
	return nil
}

// indexHit is a candidate location for a key.
type indexHit struct {
	offset   int64
	size     int
	storedAt int64
}

// lookup returns candidate locations of hash stored in [begin, end] (unix ns,
// 0 = unbounded), oldest first, walking at most maxHops entries.
func (ki *keyIndex) lookup(hash uint64, begin, end int64, maxHops int) ([]indexHit, error) {
	ki.mu.RLock()
	defer ki.mu.RUnlock()
	var out []indexHit
	hops := 0
	for _, x := range ki.files {
		if x.count == 0 {
			continue
		}
		if (end != 0 && x.firstTime > end) || (begin != 0 && x.lastTim < begin) {
			continue
		}
		slot := int(hash % uint64(x.slots))
		var next uint32
		if x.sealed {
			var b [4]byte
			if _, err := x.f.ReadAt(b[:], x.slotPos(slot)); err != nil {
				return out, fmt.Errorf("read index slot: %w", err)
			}
			next = binary.BigEndian.Uint32(b[:])
		} else {
			next = x.mem[slot]
		}
		var hits []indexHit
		for next != 0 && hops < maxHops {
			hops++
			i := int(next - 1)
			if i >= x.count {
				break // a stale slot past the cut
			}
			var e indexEntry
			if !x.sealed && i >= x.flushed {
				p := (i - x.flushed) * indexEntryLen
				e = getIndexEntry(x.pend[p:])
			} else {
				var b [indexEntryLen]byte
				if _, err := x.f.ReadAt(b[:], x.entryPos(i)); err != nil {
					return out, fmt.Errorf("read index entry: %w", err)
				}
				e = getIndexEntry(b[:])
			}
			if e.prev >= next {
				break // a chain must go backwards; anything else is damage
			}
			next = e.prev
			if e.hash != hash || (begin != 0 && e.storedAt < begin) || (end != 0 && e.storedAt > end) {
				continue
			}
			hits = append(hits, indexHit{offset: e.offset, size: int(e.size), storedAt: e.storedAt})
		}
		for i := len(hits) - 1; i >= 0; i-- {
			out = append(out, hits[i])
		}
		if hops >= maxHops {
			break
		}
	}
	return out, nil
}

// dropBefore removes sealed files whose entries all point below offset.
func (ki *keyIndex) dropBefore(offset int64) error {
	ki.mu.Lock()
	var drop []*indexFile
	for len(ki.files) > 1 && ki.files[0].sealed && ki.files[0].lastOff < offset {
		drop = append(drop, ki.files[0])
		ki.files = ki.files[1:]
	}
	ki.mu.Unlock()
	var errs []error
	for _, x := range drop {
		_ = x.f.Close()
		if err := ki.fs.Remove(filepath.Join(ki.dir, segmentName(x.first))); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
