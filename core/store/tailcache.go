package store

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
)

// tailCache holds the newest bytes of the commit log in memory, so that
// readers at the tail (the consumers that keep up) are served without a
// system call, a page fault or the page cache: a backlog reader that
// streams old segments through the page cache cannot evict what they need.
// It is filled on append (write-through: the writer copies each chunk in
// after its write succeeded) and, at Open, from the end of the log.
//
// The bytes live in one anonymous mapping of capacity bytes, off the Go
// heap (the garbage collector neither scans nor paces on it), used as a
// ring: log offset o is at mem[o % capacity]. Its pages are touched, hence
// resident, only as the log grows into them. The capacity is a whole number
// of blocks, and the cached range [start, end) gives up whole blocks at its
// front, so the exclusive lock is taken once per block written, never per
// append.
//
// Concurrency: one writer (the store's writer goroutine; Open before it
// starts) calls fill; readers call view and readAt. Readers hold mu shared
// while they use cached bytes; the writer holds it exclusively only while
// it moves start past a block it is about to overwrite. Bytes in [start,
// end) are never written again, and readers never ask for bytes at or past
// the store's confirmed end, which end covers, so the writer appends at end
// while readers read below it without a lock between them.
type tailCache struct {
	mem        []byte
	capacity   int64 // len(mem): a multiple of blockBytes
	blockBytes int64

	mu    sync.RWMutex
	start atomic.Int64 // first cached offset; changed under mu held exclusively
	end   atomic.Int64 // one past the last cached byte; changed by the writer only
}

// tailCacheBlockBytes is the unit the cache gives up at its front. Smaller
// caches (tests) use an eighth of their size, at least a page.
const tailCacheBlockBytes = 1 << 20

// openTailCache maps the tail cache and fills it from the end of the log.
// Open calls it after recovery (the log is what it will stay) and before
// the writer starts. A read error leaves the cache empty at the end of the
// log: what it would have held is read from the segments instead.
func (s *Store) openTailCache() error {
	if s.opts.TailCacheBytes <= 0 {
		return nil
	}
	logMin, end := s.cl.bounds()
	c, err := newTailCache(s.opts.TailCacheBytes, end)
	if err != nil {
		return err
	}
	buf := make([]byte, min(c.capacity, 1<<20))
	for off := max(logMin, end-c.capacity); off < end; {
		_, segEnd, ok := s.cl.segmentBounds(off)
		n := min(int64(len(buf)), end-off, segEnd-off)
		if !ok || n <= 0 {
			break
		}
		if err := s.cl.readAt(buf[:n], off, end); err != nil {
			s.log.Warn().Err(err).Int64("log_offset", off).Msg("tail cache starts empty")
			c.fill(end, nil)
			break
		}
		c.fill(off, buf[:n])
		off += n
	}
	s.cl.cache = c
	return nil
}

// newTailCache maps a cache of at least size bytes (rounded up to whole
// blocks) whose range starts empty at off.
func newTailCache(size, off int64) (*tailCache, error) {
	block := int64(tailCacheBlockBytes)
	for block > 4096 && block*8 > size {
		block /= 2
	}
	capacity := (size + block - 1) / block * block
	mem, err := syscall.Mmap(-1, 0, int(capacity), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("map tail cache of %d bytes: %w", capacity, err)
	}
	c := &tailCache{mem: mem, capacity: capacity, blockBytes: block}
	c.start.Store(off)
	c.end.Store(off)
	return c, nil
}

// release unmaps the cache and empties it. The commit log calls it with its
// own lock held exclusively, so no view or readAt is in it.
func (c *tailCache) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mem != nil {
		_ = syscall.Munmap(c.mem)
		c.mem = nil
		c.start.Store(c.end.Load()) // empty
	}
}

// fill appends p, the log's bytes at off, evicting the oldest whole blocks
// as needed. off must be the cache's end; anything else (never expected:
// the log has no gaps) restarts the cache at off.
func (c *tailCache) fill(off int64, p []byte) {
	if off != c.end.Load() || off < c.start.Load() {
		c.mu.Lock()
		c.start.Store(off)
		c.end.Store(off)
		c.mu.Unlock()
	}
	newEnd := off + int64(len(p))
	if newEnd == off {
		return
	}
	// Keep the blocks of the last capacity bytes, counted in whole blocks
	// up to the one that holds the new end.
	lastBlock := (newEnd - 1) / c.blockBytes
	keep := (lastBlock - c.capacity/c.blockBytes + 1) * c.blockBytes
	if keep > c.start.Load() {
		c.mu.Lock()
		if keep > c.start.Load() { // dropBelow may have moved it meanwhile
			c.start.Store(keep)
		}
		c.mu.Unlock()
	}
	if off < keep { // p is longer than the cache: only its end is kept
		p = p[keep-off:]
		off = keep
	}
	for len(p) > 0 {
		pos := off % c.capacity
		n := copy(c.mem[pos:], p)
		p = p[n:]
		off += int64(n)
	}
	c.end.Store(newEnd)
}

// dropBelow forgets the bytes below off (retention deleted their segment).
func (c *tailCache) dropBelow(off int64) {
	if off <= c.start.Load() {
		return
	}
	c.mu.Lock()
	if off > c.end.Load() {
		off = c.end.Load()
	}
	if off > c.start.Load() {
		c.start.Store(off)
	}
	c.mu.Unlock()
}

// holds reports whether [off, off+n) is cached now (a hint: the writer may
// evict it right after).
func (c *tailCache) holds(off int64, n int) bool {
	return off >= c.start.Load() && off+int64(n) <= c.end.Load()
}

// view calls fn with the n cached bytes at off and reports true, or
// reports false without calling fn when they are not all cached. fn must
// not keep the slice: it is the cache's memory (or, for bytes that wrap
// around the ring's end, a copy).
func (c *tailCache) view(off int64, n int, fn func([]byte) error) (bool, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if off < c.start.Load() || off+int64(n) > c.end.Load() {
		return false, nil
	}
	pos := off % c.capacity
	if pos+int64(n) <= c.capacity {
		return true, fn(c.mem[pos : pos+int64(n)])
	}
	buf := make([]byte, n)
	k := copy(buf, c.mem[pos:])
	copy(buf[k:], c.mem)
	return true, fn(buf)
}

// readAt copies the cached bytes at off into p and reports true, or
// reports false when they are not all cached.
func (c *tailCache) readAt(p []byte, off int64) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if off < c.start.Load() || off+int64(len(p)) > c.end.Load() {
		return false
	}
	pos := off % c.capacity
	k := copy(p, c.mem[pos:])
	copy(p[k:], c.mem)
	return true
}
