package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// Cold reads: what Read serves from behind the tail cache. They bypass the
// segments' mappings — posix_fadvise(DONTNEED) leaves pages that a process
// maps, and madvise(DONTNEED) on a shared file mapping only unmaps them
// from this process, leaving them cached — and read with pread into a
// buffer of their own, with the kernel told that the segment is read
// sequentially and used once; after each Read the pages dropBehindLag and
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

// readCold reads the n bytes at global offset off (within one segment,
// below limit) with pread, into a new buffer. It holds the log's lock only
// to find the segment, never during the read: a read from the disk must not
// keep the writer from rolling or growing a segment. (A segment that
// retention closes meanwhile fails the read; an os.File outlives its Close
// until reads in flight return.)
func (cl *commitLog) readCold(off int64, n int, limit int64) ([]byte, error) {
	if off < 0 || n < 0 || off+int64(n) > limit {
		return nil, fmt.Errorf("%w: %d bytes at %d beyond %d", core.ErrMessageNotFound, n, off, limit)
	}
	cl.mu.RLock()
	i := cl.findLocked(off)
	if i < 0 {
		cl.mu.RUnlock()
		return nil, fmt.Errorf("%w: offset %d not in the log", core.ErrMessageNotFound, off)
	}
	sg := cl.segs[i]
	if off+int64(n) > sg.end() {
		cl.mu.RUnlock()
		return nil, fmt.Errorf("%w: %d bytes at %d cross the end of segment %s", core.ErrMessageNotFound, n, off, segmentName(sg.base))
	}
	cl.mu.RUnlock()
	if adv, ok := sg.file.(vfs.Advisor); ok && sg.coldHinted.CompareAndSwap(false, true) {
		// Hints for the file as a whole (its readahead state and its
		// pages' place in the LRU); only cold reads read through the file.
		_ = adv.Advise(0, 0, vfs.AdviseSequential)
		_ = adv.Advise(0, 0, vfs.AdviseNoReuse)
	}
	buf := make([]byte, n)
	k, err := sg.file.ReadAt(buf, off-sg.base)
	if k == n {
		return buf, nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return nil, fmt.Errorf("read segment %s at %d: %w", segmentName(sg.base), off-sg.base, err)
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
