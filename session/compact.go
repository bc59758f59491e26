package session

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
)

// copyChunk bounds one read of compaction's copy.
const copyChunk = 4 << 20

// compact rewrites the log's live records into a new file and swaps it in.
// The bulk of the copy runs without Store.mu — writes go on, appended to
// the old file — and only what was written meanwhile is copied under the
// lock, at the swap. Records keep their order (replay depends on it) and
// their bytes (the new file has the old one's nonce). The new file is
// synced before it is renamed over the old one, and the folder after: a
// crash at any point leaves one whole log, the old or the new.
func (b *logBackend) compact() error {
	s := b.s
	s.mu.Lock()
	if b.err != nil || s.closed {
		s.mu.Unlock()
		return nil
	}
	old, end, before := b.f, b.size, b.size
	var live []loc
	s.ix.eachLoc(func(l *loc) { live = append(live, *l) })
	s.mu.Unlock()
	slices.SortFunc(live, func(x, y loc) int { return cmp.Compare(x.off, y.off) })

	tmp := filepath.Join(b.dir, compactName)
	nf, err := b.fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	abort := func(err error) error {
		_ = nf.Close()
		_ = b.fs.Remove(tmp)
		return err
	}
	if _, err := nf.WriteAt(appendHeader(nil, b.nonce), 0); err != nil {
		return abort(fmt.Errorf("write %s: %w", tmp, err))
	}
	pos := int64(headerSize)
	moved := make(map[int64]int64, len(live))
	buf := make([]byte, 0, copyChunk)
	for i := 0; i < len(live); {
		start, stop, j := live[i].off, live[i].off+int64(live[i].n), i
		for j+1 < len(live) && live[j+1].off == stop && stop-start < copyChunk {
			j++
			stop += int64(live[j].n)
		}
		if err := copyRange(old, nf, start, stop, pos, &buf); err != nil {
			return abort(err)
		}
		for _, l := range live[i : j+1] {
			moved[l.off] = pos + (l.off - start)
		}
		pos += stop - start
		i = j + 1
	}
	if err := nf.Sync(); err != nil {
		return abort(fmt.Errorf("sync %s: %w", tmp, err))
	}

	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.err != nil || s.closed {
		return abort(nil)
	}
	tail := b.size - end
	if err := copyRange(b.f, nf, end, b.size, pos, &buf); err != nil {
		return abort(err)
	}
	if err := nf.Sync(); err != nil {
		return abort(fmt.Errorf("sync %s: %w", tmp, err))
	}
	var lost error
	s.ix.eachLoc(func(l *loc) {
		if l.off >= end {
			return
		}
		if _, ok := moved[l.off]; !ok {
			lost = fmt.Errorf("live record at %d not copied", l.off)
		}
	})
	if lost != nil {
		return abort(lost) // cannot happen: a live record older than the snapshot was live in it
	}
	if err := b.fs.Rename(tmp, b.path); err != nil {
		return abort(fmt.Errorf("rename %s: %w", tmp, err))
	}
	s.ix.eachLoc(func(l *loc) {
		if l.off < end {
			l.off = moved[l.off]
		} else {
			l.off = pos + (l.off - end)
		}
	})
	_ = old.Close()
	b.f, b.size, b.synced, b.dirty = nf, pos+tail, pos+tail, false
	if err := b.fs.SyncDir(b.dir); err != nil {
		// A crash could bring the old file back, without what is written
		// from now on: stop writing.
		b.fail(fmt.Errorf("sync folder %s after compaction: %w", b.dir, err))
		return err
	}
	s.log.Info().Int64("before", before).Int64("after", b.size).Str(logFile, b.path).Msg("session log compacted")
	return nil
}

// copyRange copies [start, stop) of from to to at pos, in chunks.
func copyRange(from, to file, start, stop, pos int64, buf *[]byte) error {
	for start < stop {
		n := min(stop-start, copyChunk)
		b := (*buf)[:n]
		if _, err := from.ReadAt(b, start); err != nil {
			return fmt.Errorf("read log at %d: %w", start, err)
		}
		if _, err := to.WriteAt(b, pos); err != nil {
			return fmt.Errorf("write compacted log at %d: %w", pos, err)
		}
		start, pos = start+n, pos+n
	}
	return nil
}
