package store

import (
	"errors"
	"fmt"
)

// recover brings consume queues and indexes in line with the commit log and
// finds the log's true end. The log is the truth: the scan starts at the
// checkpoint (everything before it is durable in the consume queues), cuts a
// torn or zero-filled tail at the last valid record, and re-dispatches every
// record after the checkpoint. A damaged record followed by valid ones is
// corruption, not a torn tail: it is reported and skipped, and the records
// after it are kept.
func (s *Store) recover(unclean bool) error {
	logMin, logEnd := s.cl.bounds()
	var cp checkpointMeta
	found, err := readMeta(s.fs, s.dir, fileCheckpoint, &cp)
	from := logMin
	switch {
	case err != nil:
		s.log.Warn().Err(err).Msg("checkpoint unreadable; rebuilding consume queues from the whole log")
	case found && cp.LogOffset > logEnd:
		// The log is shorter than what the checkpoint saw durable: data
		// the disk acknowledged is gone, or the file was cut by hand. Trust
		// nothing in the last segment.
		from = logMin
		if segs := s.cl.segmentList(); len(segs) > 0 {
			from = segs[len(segs)-1][0]
		}
		s.log.Error().Int64("checkpoint", cp.LogOffset).Int64("log_end", logEnd).
			Msg("commit log shorter than its checkpoint; re-dispatching the last segment")
	case found:
		from = max(logMin, cp.LogOffset)
	}
	if unclean {
		s.log.Warn().Int64("from", from).Int64("log_end", logEnd).Msg("unclean shutdown detected; recovering")
	}

	// Consume-queue entries at or past the scan start are rebuilt from the log.
	for _, t := range s.topicList() {
		for q, cq := range t.slots() {
			k, err := cq.searchOffset(func(e cqEntry) (bool, error) { return e.offset >= from || e.size <= 0, nil })
			if err != nil {
				return fmt.Errorf("recover %s/%d: %w", t.name, q, err)
			}
			if k < cq.max.Load() {
				if err := cq.truncate(k); err != nil {
					return err
				}
			}
		}
	}
	s.idx, err = openKeyIndex(s.fs, s.dir+"/"+dirIndex, s.opts.IndexSlots, s.opts.IndexEntries, from)
	if err != nil {
		return err
	}

	end, err := s.replay(from)
	if err != nil {
		return err
	}
	if end < logEnd {
		s.log.Warn().Int64("cut_at", end).Int64("dropped_bytes", logEnd-end).Msg("torn tail cut from the commit log")
		if err := s.cl.truncate(end); err != nil {
			return err
		}
	}
	// What survived in the file is now made durable before anything is
	// built on it.
	if segs := s.cl.segmentList(); len(segs) > 0 {
		seg, err := s.cl.active(0)
		if err != nil {
			return err
		}
		if err := seg.file.Sync(); err != nil {
			return fmt.Errorf("sync recovered segment: %w", err)
		}
	}

	logMin, logEnd = s.cl.bounds()
	clamped := false
	for _, t := range s.topicList() {
		for q, cq := range t.slots() {
			t.next[q] = cq.max.Load()
			if err := s.raiseMin(cq, logMin); err != nil {
				return err
			}
		}
		if clampEpochs(t) {
			s.log.Warn().Str("topic", t.name).Msg("a resize's epoch began past what the log kept; begun at the recovered ends")
			clamped = true
		}
	}
	if clamped {
		s.topicsMu.Lock()
		err := s.persistTopicsLocked()
		s.topicsMu.Unlock()
		if err != nil {
			return err
		}
	}
	s.nextOffset, s.activeBase = logEnd, logEnd
	if segs := s.cl.segmentList(); len(segs) > 0 {
		s.activeBase = segs[len(segs)-1][0]
	}
	s.written.Store(logEnd)
	s.synced.Store(logEnd)
	s.confirmed.Store(logEnd)
	s.lastStored = s.opts.Now().UnixNano()
	if err := s.checkpoint(); err != nil {
		return err
	}
	return nil
}

// replay scans the log from offset from, dispatching every valid record,
// and returns where valid data ends.
func (s *Store) replay(from int64) (int64, error) {
	segs := s.cl.segmentList()
	end := from
	buf := make([]byte, replayWindow)
	var disp []dispatchReq
	flush := func() error {
		if len(disp) == 0 {
			return nil
		}
		err := s.dispatch(disp)
		disp = disp[:0]
		return err
	}
	records := 0
	for si, sg := range segs {
		base, segEnd := sg[0], sg[1]
		if segEnd <= from {
			continue
		}
		last := si == len(segs)-1
		pos := max(from, base)
		for pos < segEnd {
			// Read a window starting at pos; a record never spans segments.
			n := min(int64(len(buf)), segEnd-pos)
			win := buf[:n]
			if err := s.cl.readAt(win, pos, segEnd); err != nil {
				return end, fmt.Errorf("recovery read at %d: %w", pos, err)
			}
			p := int64(0)
			for p < n {
				rec := win[p:]
				meta, err := checkRecord(rec)
				if err == nil && meta.clOffset != pos+p {
					err = fmt.Errorf("%w: record at %d claims offset %d", errBadRecord, pos+p, meta.clOffset)
				}
				if errors.Is(err, errShort) && pos+n < segEnd {
					if p > 0 {
						break // the record continues past this window: read on from it
					}
					// A record longer than the whole window: widen the
					// window to its length if the segment can hold it (a
					// longer claim is damage, handled below).
					if l, lerr := recordLen(rec); lerr == nil && pos+int64(l) <= segEnd {
						buf = make([]byte, l)
						break
					}
				}
				if err != nil {
					// Torn tail, or corruption in the middle?
					next, ok, rerr := s.resync(pos+p+1, segEnd)
					if rerr != nil {
						return end, rerr
					}
					if !ok {
						if last {
							return end, flush()
						}
						s.log.Error().Err(err).Int64("from", pos+p).Int64("to", segEnd).
							Str("segment", segmentName(base)).Msg("commit log corrupt to the end of a sealed segment; skipped")
						p = n
						pos = segEnd
						end = segEnd
						break
					}
					s.log.Error().Err(err).Int64("from", pos+p).Int64("to", next).
						Msg("commit log corrupt; damaged bytes skipped, later records kept")
					pos, p, n = next, 0, 0
					end = next
					break
				}
				if r, ok := s.replayReq(meta); ok {
					disp = append(disp, r)
				}
				if len(disp) >= 4096 {
					if err := flush(); err != nil {
						return end, err
					}
				}
				records++
				p += int64(meta.size)
				end = pos + p
			}
			pos += p
		}
	}
	if records > 0 {
		s.log.Info().Int("records", records).Int64("from", from).Int64("to", end).Msg("commit log replayed")
	}
	return end, flush()
}

// replayReq turns a recovered record into a dispatch request, creating its
// topic if topics.meta does not know it.
func (s *Store) replayReq(meta recordMeta) (dispatchReq, bool) {
	name := string(meta.topic)
	if s.deletedAt(name, meta.clOffset) {
		return dispatchReq{}, false // a deleted incarnation's record
	}
	t, err := s.topic(name, true, max(s.opts.DefaultQueues, meta.queue+1))
	if err != nil || meta.queue >= len(t.slots()) {
		s.log.Error().Err(err).Str("topic", name).Int("queue", meta.queue).Msg("recovered record has no queue; not indexed")
		return dispatchReq{}, false
	}
	r := dispatchReq{
		t: t, queue: meta.queue, qoff: meta.queueOffset, off: meta.clOffset,
		size: meta.size, tagHash: meta.tagHash, storedAt: meta.storedAt,
	}
	if len(meta.shardingKey) > 0 {
		r.keys = append(r.keys, keyHash(name, string(meta.shardingKey)))
	}
	_ = walkKeys(meta.keysBlock, func(k []byte) {
		if string(k) != string(meta.shardingKey) {
			r.keys = append(r.keys, keyHash(name, string(k)))
		}
	})
	return r, true
}

// resync looks for the next valid record in [from, segEnd): one whose
// header, checksum and self-declared offset all agree. It reads the region
// in windows and tests every byte position, which costs time only when the
// log is damaged.
func (s *Store) resync(from, segEnd int64) (int64, bool, error) {
	const win = 4 << 20
	buf := make([]byte, win+replayTail)
	for pos := from; pos < segEnd; pos += win {
		n := min(int64(len(buf)), segEnd-pos)
		b := buf[:n]
		if err := s.cl.readAt(b, pos, segEnd); err != nil {
			return 0, false, fmt.Errorf("resync read at %d: %w", pos, err)
		}
		for i := int64(0); i < min(win, n); i++ {
			if b[i] != byte(recordMagic>>24) {
				continue
			}
			meta, err := checkRecord(b[i:])
			if errors.Is(err, errShort) {
				// A candidate running past what was read: read it whole,
				// if the segment holds as much as it claims.
				meta, err = s.checkAt(pos+i, segEnd)
			}
			if err == nil && meta.clOffset == pos+i {
				return pos + i, true, nil
			}
		}
	}
	return 0, false, nil
}

// Recovery reads the log in windows of replayWindow bytes, widened for a
// record longer than that; resync reads replayTail bytes past its window so
// that most candidate records near a window's end need no second read.
const (
	replayWindow = 8 << 20
	replayTail   = 64 << 10
)

// checkAt reads and checks the record at off, which must end by segEnd. The
// length is bounded by the header check and by the segment before anything
// is allocated for it.
func (s *Store) checkAt(off, segEnd int64) (recordMeta, error) {
	var hdr [offCRC]byte
	if segEnd-off < offCRC {
		return recordMeta{}, fmt.Errorf("%w: %d bytes left in the segment", errShort, segEnd-off)
	}
	if err := s.cl.readAt(hdr[:], off, segEnd); err != nil {
		return recordMeta{}, err
	}
	n, err := recordLen(hdr[:])
	if err != nil {
		return recordMeta{}, err
	}
	if off+int64(n) > segEnd {
		return recordMeta{}, fmt.Errorf("%w: record of %d bytes at %d, the segment ends at %d", errShort, n, off, segEnd)
	}
	rec := make([]byte, n)
	if err := s.cl.readAt(rec, off, segEnd); err != nil {
		return recordMeta{}, err
	}
	return checkRecord(rec)
}

// raiseMin moves a queue's first readable offset up past entries whose
// records retention deleted.
func (s *Store) raiseMin(cq *consumeQueue, logMin int64) error {
	k, err := cq.searchOffset(func(e cqEntry) (bool, error) { return e.offset >= logMin, nil })
	if err != nil {
		return err
	}
	return cq.dropBefore(k)
}
