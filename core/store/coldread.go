package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"

	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// Cold reads: what Read serves from behind the tail cache. They bypass the
// segments' mappings — posix_fadvise(DONTNEED) leaves pages that a process
// maps, and madvise(DONTNEED) on a shared file mapping only unmaps them
// from this process, leaving them cached — and read into a buffer of their
// own: records that fill most of what a read must cover (large ones, or
// small ones of one queue side by side) directly, around the page cache
// (O_DIRECT, coldRecords); the others with pread, the kernel told that the
// segment is read sequentially and used once. After each Read the pages dropBehindLag and
// more behind what it read leave the page cache (posix_fadvise DONTNEED),
// so a reader replaying a backlog larger than memory keeps about
// dropBehindLag of it cached instead of pushing out what everyone else uses
// (consume queues, indexes, the writer's pages). Each reader's cold bytes
// are charged to its budget first (readBudgets).

// dropBehindLag is how far behind a cold read its drop-behind starts. The
// queues of one topic are interleaved in the log, so the members of a group
// that read them side by side read the same pages within a few MiB of each
// other: dropping right behind one of them would make the others read those
// pages from the disk again. It also bounds the page cache one cold reader
// keeps (besides the kernel's readahead).
const dropBehindLag = 16 << 20

// coldRun bounds the runs coldRecords reads at once: records of a Read
// closer than coldRunGap to each other are read together (up to
// coldRunMax), if they fill at least half of what is read.
const (
	coldRunGap = 64 << 10
	coldRunMax = 1 << 20
)

// coldExtent is a cold record of a Read: where it is and its size.
type coldExtent struct {
	off  int64
	size int
}

// coldRecords reads the cold records of one Read, in the order it serves
// them (ascending offsets, as a queue's are): each call to record returns
// one, from the run read last if it holds it. A run is a single record
// read with pread (through the page cache, with the sequential and
// no-reuse hints and the drop-behind after the Read), or — when records
// lie close together and fill at least half of their span — one read of
// the span; where the filesystem allows, a run that fills half of its
// page-aligned span is read directly (O_DIRECT): no copy through the page
// cache, nothing evicted, nothing to drop behind. Large records (a
// backlog of 64 KiB messages) are read that way one by one; small ones
// interleaved with other queues' go through the page cache, whose
// readahead the readers of the other queues share.
type coldRecords struct {
	cl    *commitLog
	limit int64
	exts  []coldExtent

	buf    []byte // the run read last
	bufOff int64  // the log offset of buf[0]
	// pooled are the buffers taken from coldBufs for this Read's runs.
	pooled []*[]byte

	// lo and hi bound what the Read went over (-1: nothing yet): after
	// it, dropBehind drops what lies far enough behind — pages its
	// buffered reads brought in, and the writer's pages of records a
	// cold reader has passed (direct reads leave those where they are).
	lo, hi int64
	direct int64 // bytes read directly
}

func newColdRecords(cl *commitLog, limit int64, exts []coldExtent) *coldRecords {
	return &coldRecords{cl: cl, limit: limit, exts: exts, lo: -1, hi: -1}
}

// coldBufSize is the size of the pooled buffers runs are read into: a
// run's page-aligned span at most (coldRunMax and an aligned block on
// either side). A larger run (one large record) gets a buffer of its own.
const coldBufSize = coldRunMax + 2*vfs.DirectAlign

// coldBufs holds run buffers a Read's caller released (ReadResult.Release):
// a replay read one per run, and allocating and zeroing each afresh — and
// collecting them — was a fifth of the server's CPU while it replayed.
var coldBufs = sync.Pool{New: func() any {
	coldBufsMade.Add(1)
	b := vfs.AlignedBuffer(coldBufSize)
	return &b
}}

// coldBufsTaken and coldBufsMade count the buffers runs took from coldBufs
// and those it had to make (tests: taken > made when some were reused).
var coldBufsTaken, coldBufsMade atomic.Int64

// take returns an aligned buffer of n bytes for a run: a pooled one, which
// the Read's release gives back, if n fits.
func (c *coldRecords) take(n int) []byte {
	if n > coldBufSize {
		return vfs.AlignedBuffer(n)
	}
	p := coldBufs.Get().(*[]byte)
	coldBufsTaken.Add(1)
	if c.pooled == nil {
		c.pooled = make([]*[]byte, 0, 4)
	}
	c.pooled = append(c.pooled, p)
	return (*p)[:n:n]
}

// release gives the pooled buffers back: nothing of what the Read
// returned from them may be used afterwards.
func (c *coldRecords) release() {
	for _, p := range c.pooled {
		coldBufs.Put(p)
	}
	c.pooled = nil
}

// record returns the bytes of exts[k], reading its run if need be.
func (c *coldRecords) record(k int) ([]byte, error) {
	e := c.exts[k]
	end := e.off + int64(e.size)
	if c.buf != nil && e.off >= c.bufOff && end <= c.bufOff+int64(len(c.buf)) {
		return c.buf[e.off-c.bufOff : end-c.bufOff : end-c.bufOff], nil
	}
	c.cl.mu.RLock()
	sg, err := c.cl.segmentForLocked(e.off, e.size, c.limit)
	var segEnd int64
	if err == nil {
		segEnd = sg.end()
	}
	c.cl.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	// The run: the records after k that are close, in the same segment,
	// below the limit.
	useful := int64(e.size)
	for j := k + 1; j < len(c.exts); j++ {
		x := c.exts[j]
		xEnd := x.off + int64(x.size)
		if x.off < end || x.off-end > coldRunGap || xEnd-e.off > coldRunMax || xEnd > min(segEnd, c.limit) {
			break
		}
		end, useful = xEnd, useful+int64(x.size)
	}
	pos, span := e.off-sg.base, end-e.off
	if d := sg.directFile(c.cl.fs); d != nil {
		lo := pos &^ (vfs.DirectAlign - 1)
		hi := min((pos+span+vfs.DirectAlign-1)&^(vfs.DirectAlign-1), (segEnd-sg.base+vfs.DirectAlign-1)&^(vfs.DirectAlign-1))
		if 2*useful >= hi-lo {
			buf := c.take(int(hi - lo))
			got, err := d.ReadAt(buf, lo)
			if int64(got) >= pos+span-lo { // the file may end in the last block
				c.buf, c.bufOff = buf[pos-lo:pos-lo+span], e.off
				c.direct += span
				c.passed(e.off, end)
				return c.buf[:e.size:e.size], nil
			}
			if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EINVAL) {
				return nil, fmt.Errorf("read segment %s at %d (direct): %w", segmentName(sg.base), lo, err)
			}
			// Refused or short: read it through the page cache instead.
		}
	}
	if 2*useful < span {
		end, span = e.off+int64(e.size), int64(e.size) // sparse: this record alone
	}
	if adv, ok := sg.file.(vfs.Advisor); ok && sg.coldHinted.CompareAndSwap(false, true) {
		_ = adv.Advise(0, 0, vfs.AdviseSequential)
		_ = adv.Advise(0, 0, vfs.AdviseNoReuse)
	}
	buf := c.take(int(span))
	n, err := sg.file.ReadAt(buf, pos)
	if int64(n) != span {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("read segment %s at %d: %w", segmentName(sg.base), pos, err)
	}
	c.buf, c.bufOff = buf, e.off
	c.passed(e.off, end)
	return c.buf[:e.size:e.size], nil
}

// passed notes that the Read went over [from, to) of the log.
func (c *coldRecords) passed(from, to int64) {
	if c.lo < 0 {
		c.lo = from
	}
	c.hi = to
}

// dropBehind advises the kernel to drop the cached pages of the log in
// [lo-lag-window, lo-lag), where lo is the lowest offset a cold Read just
// read, lag the commit log's dropLag and window twice the span it read (at
// least 4 MiB), so consecutive Reads of a reader cover what it passed. The
// range lies below the tail cache's start by at least lag, so it never
// holds the page the writer appends to.
func (cl *commitLog) dropBehind(lo, span int64) {
	window := max(2*span, 4<<20)
	hi := lo - cl.dropLag
	if hi <= 0 {
		return
	}
	cl.dropPages(max(hi-window, 0), hi)
}

// dropPages advises the kernel to drop the cached pages of the log in
// [from, to) (DONTNEED), segment by segment, the lock held only to list
// the segments. Within a file the range is cut at multiples of dropAlign
// (its start moved back, its end forward only to the end of a segment):
// the page cache holds a file in folios of up to 2 MiB, aligned to their
// size, and the kernel drops only those wholly in the range — a range cut
// anywhere else would leave the folios across its ends, and ranges that
// slide along with a reader would never hold them whole. DONTNEED drops
// only clean folios that are not mapped.
func (cl *commitLog) dropPages(from, to int64) {
	type piece struct {
		adv       vfs.Advisor
		off, size int64
	}
	var todo []piece
	cl.mu.RLock()
	for i := max(cl.findLocked(from), 0); i < len(cl.segs); i++ {
		sg := cl.segs[i]
		if sg.base >= to {
			break
		}
		a, b := max(from, sg.base)-sg.base, min(to, sg.end())-sg.base
		a &^= cl.dropAlign - 1
		if b < sg.size {
			b &^= cl.dropAlign - 1
		}
		if adv, ok := sg.file.(vfs.Advisor); ok && a < b {
			todo = append(todo, piece{adv, a, b - a})
		}
	}
	cl.mu.RUnlock()
	for _, p := range todo {
		_ = p.adv.Advise(p.off, p.size, vfs.AdviseDontNeed)
	}
}

// dropBehindAlign is the commit log's dropAlign: the largest folio the
// page cache makes (a PMD, 2 MiB on x86-64 and arm64 with 4 KiB pages).
const dropBehindAlign = 2 << 20

// readBudgets are the token buckets cold reads are charged to: one per
// reader (core.ReadRequest.Reader; "" is every reader that gives no name),
// made on its first cold read and forgotten after readerIdle without one,
// and, if set, one for all readers together. A reader whose bucket is empty
// waits in its own Read; tail-cache hits are never charged, so readers at
// the tail and the writer never wait for a budget.
type readBudgets struct {
	perReader rate.Limit // 0: unlimited
	burst     int
	all       *rate.Limiter // nil: no limit for all readers together

	mu        sync.Mutex
	readers   map[string]*readerBudget
	lastSweep time.Time

	delayed atomic.Int64 // Reads that had to wait (until their bytes came or their ctx ended)
	waited  atomic.Int64 // ns waited in all
}

type readerBudget struct {
	lim  *rate.Limiter
	used time.Time // last charge; guarded by readBudgets.mu
}

// readerIdle is how long a reader's bucket is kept without a cold read.
const readerIdle = time.Minute

// newReadBudgets returns budgets of perReader bytes/s for each reader and
// all bytes/s for all of them; a value ≤ 0 is no limit.
func newReadBudgets(perReader, all int64) *readBudgets {
	b := &readBudgets{readers: map[string]*readerBudget{}}
	if perReader > 0 {
		b.perReader = rate.Limit(perReader)
		b.burst = budgetBurst(perReader)
	}
	if all > 0 {
		b.all = rate.NewLimiter(rate.Limit(all), budgetBurst(all))
	}
	return b
}

// budgetBurst is a bucket's depth: a tenth of a second at its rate (at
// least 256 KiB), so that a reader that was idle starts at once and a
// steady one is smoothed over 100 ms. Larger charges are taken a burst at
// a time.
func budgetBurst(perSec int64) int {
	return int(min(max(perSec/10, 256<<10), 1<<30))
}

// limited reports whether cold reads are budgeted at all.
func (b *readBudgets) limited() bool { return b.perReader > 0 || b.all != nil }

// charge takes n bytes from reader's budget and the common one, waiting
// until both have them, or until ctx ends: then ctx's error is returned and
// the piece it waited for given back.
func (b *readBudgets) charge(ctx context.Context, reader string, n int64) error {
	if !b.limited() || n <= 0 {
		return nil
	}
	var own *rate.Limiter
	if b.perReader > 0 {
		own = b.reader(reader)
	}
	var waited time.Duration
	defer func() {
		if waited > 0 {
			b.delayed.Add(1)
			b.waited.Add(int64(waited))
		}
	}()
	lims := []*rate.Limiter{own, b.all}
	for n > 0 {
		piece := n // at most the smaller burst, from both buckets
		for _, lim := range lims {
			if lim != nil {
				piece = min(piece, int64(lim.Burst()))
			}
		}
		now := time.Now()
		var rs [2]*rate.Reservation
		var delay time.Duration
		for i, lim := range lims {
			if lim != nil {
				rs[i] = lim.ReserveN(now, int(piece))
				delay = max(delay, rs[i].DelayFrom(now))
			}
		}
		if delay <= 0 {
			n -= piece
			continue
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
			waited += delay
			n -= piece
		case <-ctx.Done():
			t.Stop()
			waited += time.Since(now)
			for _, r := range rs {
				if r != nil {
					r.CancelAt(now)
				}
			}
			return ctx.Err()
		}
	}
	return nil
}

// reader returns name's bucket, making it on first use; buckets unused
// for readerIdle go on the way.
func (b *readBudgets) reader(name string) *rate.Limiter {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.lastSweep) > readerIdle {
		for k, r := range b.readers {
			if now.Sub(r.used) > readerIdle {
				delete(b.readers, k)
			}
		}
		b.lastSweep = now
	}
	r := b.readers[name]
	if r == nil {
		r = &readerBudget{lim: rate.NewLimiter(b.perReader, b.burst)}
		b.readers[name] = r
	}
	r.used = now
	return r.lim
}
