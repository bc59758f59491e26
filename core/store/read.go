package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// CreateTopic implements core.Broker.
func (s *Store) CreateTopic(ctx context.Context, cfg core.TopicConfig) (core.TopicInfo, error) {
	if s.closed.Load() {
		return core.TopicInfo{}, core.ErrClosed
	}
	if err := s.checkTopicName(cfg.Name); err != nil {
		return core.TopicInfo{}, err
	}
	if cfg.Queues < 0 || cfg.Queues > core.MaxQueues {
		return core.TopicInfo{}, fmt.Errorf("%w: %d queues, want 1 to %d", core.ErrInvalidMessage, cfg.Queues, core.MaxQueues)
	}
	q := cfg.Queues
	if q == 0 {
		q = s.opts.DefaultQueues
	}
	t, err := s.topic(cfg.Name, true, q)
	if err != nil {
		return core.TopicInfo{}, err
	}
	if n := t.writeQueues(); n != q {
		return core.TopicInfo{}, fmt.Errorf("%w: %s has %d queues, not %d", core.ErrTopicExists, cfg.Name, n, q)
	}
	return s.describe(t), nil
}

// Topic implements core.Broker.
func (s *Store) Topic(ctx context.Context, name string) (core.TopicInfo, error) {
	if s.closed.Load() {
		return core.TopicInfo{}, core.ErrClosed
	}
	t, err := s.topic(name, false, 0)
	if err != nil {
		return core.TopicInfo{}, err
	}
	return s.describe(t), nil
}

// Topics implements core.Broker.
func (s *Store) Topics(ctx context.Context) ([]core.TopicInfo, error) {
	if s.closed.Load() {
		return nil, core.ErrClosed
	}
	list := s.topicList()
	sort.Slice(list, func(i, j int) bool { return list[i].name < list[j].name })
	out := make([]core.TopicInfo, len(list))
	for i, t := range list {
		out[i] = s.describe(t)
	}
	return out, nil
}

func (s *Store) describe(t *topic) core.TopicInfo {
	lay := t.lay.Load()
	info := core.TopicInfo{Name: t.name, Queues: lay.queues, CreatedAt: t.created, Epochs: lay.epochs}
	for _, cq := range t.slots() {
		info.Ranges = append(info.Ranges, core.QueueRange{Min: cq.min.Load(), Max: cq.max.Load()})
	}
	// A retired queue retention emptied is gone for readers: the last ones
	// leave Ranges (they stay on disk, empty, for a later resize to reuse).
	for n := len(info.Ranges); n > lay.queues && info.Ranges[n-1].Min == info.Ranges[n-1].Max; n-- {
		info.Ranges = info.Ranges[:n-1]
	}
	return info
}

func (s *Store) queue(topicName string, q int) (*consumeQueue, error) {
	t, err := s.topic(topicName, false, 0)
	if err != nil {
		return nil, err
	}
	return t.queue(q)
}

func (t *topic) queue(q int) (*consumeQueue, error) {
	qs := t.slots()
	if q < 0 || q >= len(qs) {
		return nil, fmt.Errorf("%w: %s/%d (topic has %d)", core.ErrQueueNotFound, t.name, q, len(qs))
	}
	return qs[q], nil
}

// QueueHead implements core.QueueHeads: an atomic load, after a map lookup.
func (s *Store) QueueHead(topicName string, queue int) (int64, bool) {
	cq, err := s.queue(topicName, queue)
	if err != nil {
		return 0, false
	}
	return cq.max.Load(), true
}

// Read implements core.Broker.
func (s *Store) Read(ctx context.Context, req core.ReadRequest) (core.ReadResult, error) {
	var res core.ReadResult
	if s.closed.Load() {
		return res, core.ErrClosed
	}
	t, err := s.topic(req.Topic, false, 0)
	if err != nil {
		return res, err
	}
	cq, err := t.queue(req.Queue)
	if err != nil {
		return res, err
	}
	res, err = s.read(ctx, cq, req)
	if err != nil && cq.gone.Load() {
		return core.ReadResult{}, fmt.Errorf("%w: %q was deleted", core.ErrTopicNotFound, req.Topic)
	}
	// Loaded after the read: a message of a new epoch is appended only
	// after its epoch is in the layout, so this covers every one read.
	res.Epochs = len(t.lay.Load().epochs)
	return res, err
}

// read is Read on the queue cq of req.
func (s *Store) read(ctx context.Context, cq *consumeQueue, req core.ReadRequest) (core.ReadResult, error) {
	var res core.ReadResult
	maxCount := req.MaxCount
	if maxCount <= 0 {
		maxCount = 32
	}
	maxCount = min(maxCount, 4096)
	maxBytes := req.MaxBytes
	if maxBytes <= 0 {
		maxBytes = 4 << 20
	}
	var tags map[int64]bool
	if len(req.Tags) > 0 {
		tags = make(map[int64]bool, len(req.Tags))
		for _, tg := range req.Tags {
			tags[core.TagHash(tg)] = true
		}
	}

	rng := core.QueueRange{Min: cq.min.Load(), Max: cq.max.Load()}
	res.Range = rng
	off := req.Offset
	if off < rng.Min {
		off, res.Clamped = rng.Min, true
	} else if off > rng.Max {
		off, res.Clamped = rng.Max, true
	}
	res.NextOffset = off
	if off == rng.Max {
		return res, nil
	}
	// Entries below the log's first offset were removed by retention
	// (consume-queue files go in whole files, so a few may linger).
	logMin, _ := s.cl.bounds()

	type want struct {
		qoff int64
		e    cqEntry
	}
	var wants []want
	total := 0
	limit := s.confirmed.Load() // read before the entries: nothing past it is served
	if req.Until > 0 {
		if off >= req.Until {
			return res, nil
		}
		maxCount = int(min(int64(maxCount), req.Until-off))
	}
	entries, err := cq.read(off, maxCount, nil)
	if err != nil {
		return res, err
	}
	next := off
	// Records behind the tail cache are cold; a Read returns at most
	// ColdReadMaxBytes of them.
	cache := s.cl.cache
	var coldStart int64
	coldMax := maxBytes
	if cache != nil {
		coldStart = cache.start.Load()
		if s.opts.ColdReadMaxBytes > 0 {
			coldMax = min(maxBytes, s.opts.ColdReadMaxBytes)
		}
	}
	for i := 0; i < len(entries)/cqEntryLen; i++ {
		e := getCQEntry(entries[i*cqEntryLen:])
		if e.offset+int64(e.size) > limit {
			break
		}
		if e.offset < logMin {
			next++
			continue
		}
		if tags != nil && !tags[e.tagHash] {
			next++
			continue
		}
		if len(wants) > 0 && (total+int(e.size) > maxBytes || e.offset < coldStart && total+int(e.size) > coldMax) {
			break
		}
		wants = append(wants, want{qoff: next, e: e})
		total += int(e.size)
		next++
	}
	res.NextOffset = next
	if len(wants) == 0 {
		return res, nil
	}
	// Cold records are charged to the reader's budget first (this Read
	// waits if it is spent), then read (coldRecords).
	var exts []coldExtent
	var coldBytes int64
	for _, w := range wants {
		if w.e.offset < coldStart {
			exts = append(exts, coldExtent{w.e.offset, int(w.e.size)})
			coldBytes += int64(w.e.size)
		}
	}
	var cold *coldRecords
	if coldBytes > 0 {
		if err := s.budgets.charge(ctx, req.Reader, coldBytes); err != nil {
			res.NextOffset = off
			return res, fmt.Errorf("read %s/%d from %d: waiting for reader %q's cold-read budget: %w", req.Topic, req.Queue, off, req.Reader, err)
		}
		cold = newColdRecords(s.cl, limit, exts)
		defer func() {
			if cold.lo >= 0 {
				s.cl.dropBehind(cold.lo, cold.hi-cold.lo)
			}
			s.stats.coldDirectBytes.Add(cold.direct)
		}()
	}
	var sinceYield int64
	k := 0 // the next cold record
	for _, w := range wants {
		var m *core.StoredMessage
		if w.e.size < recordMinLen || int(w.e.size) > recordMaxLen {
			err := fmt.Errorf("%w: consume queue entry of %d bytes", errBadRecord, w.e.size)
			return s.partial(res, w.qoff, &core.CorruptError{Topic: req.Topic, Queue: req.Queue, QueueOffset: w.qoff, Err: err})
		}
		var err error
		if w.e.offset < coldStart {
			if sinceYield >= coldYieldBytes {
				// A backlog's Read is a long run of CPU work; goroutines that
				// serve the tail and are ready to run go first instead of
				// waiting for the scheduler's time slice (10 ms).
				runtime.Gosched()
				sinceYield = 0
			}
			sinceYield += int64(w.e.size)
			var rec []byte
			rec, err = cold.record(k)
			k++
			if err == nil {
				m, err = s.decodeAt(rec, w.e.offset) // m.Body keeps rec: the run's buffer, the Read's own
				s.cl.misses.Add(1)
				s.stats.coldReads.Add(1)
				s.stats.coldBytes.Add(int64(w.e.size))
			}
		} else {
			err = s.cl.view(w.e.offset, int(w.e.size), limit, func(rec []byte) error {
				var derr error
				m, derr = s.decodeAt(rec, w.e.offset)
				if derr == nil {
					m.Body = append([]byte(nil), m.Body...) // rec may be the cache or a mapping
				}
				return derr
			})
		}
		if err == nil && (m.Topic != req.Topic || m.Queue != req.Queue || m.QueueOffset != w.qoff) {
			err = fmt.Errorf("record at %d is %s/%d@%d, consume queue says %s/%d@%d",
				w.e.offset, m.Topic, m.Queue, m.QueueOffset, req.Topic, req.Queue, w.qoff)
		}
		if errors.Is(err, core.ErrMessageNotFound) {
			return s.partial(res, w.qoff, err)
		}
		if err != nil {
			cerr := &core.CorruptError{Topic: req.Topic, Queue: req.Queue, QueueOffset: w.qoff, Err: err}
			s.log.Error().Err(err).Str("topic", req.Topic).Int("queue", req.Queue).Int64("queue_offset", w.qoff).
				Int64("log_offset", w.e.offset).Msg("corrupt message not served")
			return s.partial(res, w.qoff, cerr)
		}
		if tags != nil && !slices.Contains(req.Tags, m.Tag) {
			continue // a tag-hash collision: the tag itself decides
		}
		res.Messages = append(res.Messages, m)
	}
	if cold != nil && len(cold.pooled) > 0 {
		// The cold messages' bodies are in pooled run buffers: the caller
		// may give them back once done with the bodies.
		if len(res.Messages) == 0 {
			cold.release()
		} else {
			res.Release = sync.OnceFunc(cold.release)
		}
	}
	return res, nil
}

// coldYieldBytes is how much a Read reads cold between yields of its
// processor.
const coldYieldBytes = 64 << 10

// partial ends a Read early at queue offset stop: messages before it are
// returned; the error is returned only when there are none.
func (s *Store) partial(res core.ReadResult, stop int64, err error) (core.ReadResult, error) {
	res.NextOffset = stop
	if len(res.Messages) > 0 {
		return res, nil
	}
	return res, err
}

func (s *Store) decodeAt(rec []byte, off int64) (*core.StoredMessage, error) {
	m, err := decodeRecord(rec, s.id)
	if err != nil {
		return nil, err
	}
	if m.CommitLogOffset != off {
		return nil, fmt.Errorf("%w: record at %d claims offset %d", errBadRecord, off, m.CommitLogOffset)
	}
	return m, nil
}

// Get implements core.Broker: one read at the place the ID names.
func (s *Store) Get(ctx context.Context, id core.MessageID) (*core.StoredMessage, error) {
	if s.closed.Load() {
		return nil, core.ErrClosed
	}
	if id.Kind() != core.IDKindCommitLog || id.StoreID() != s.id {
		return nil, fmt.Errorf("%w: %s is not an ID of this store", core.ErrMessageNotFound, id)
	}
	off, size := id.Offset(), id.Size()
	if size < recordMinLen || size > recordMaxLen || off < 0 {
		return nil, fmt.Errorf("%w: %s", core.ErrMessageNotFound, id)
	}
	var m *core.StoredMessage
	err := s.cl.view(off, size, s.confirmed.Load(), func(rec []byte) error {
		var derr error
		if m, derr = s.decodeAt(rec, off); derr != nil {
			return fmt.Errorf("%w: %w", core.ErrCorrupt, derr)
		}
		m.Body = append([]byte(nil), m.Body...) // rec may be a mapping
		return nil
	})
	if errors.Is(err, core.ErrCorrupt) {
		s.log.Error().Err(err).Str("id", id.String()).Msg("corrupt message not served")
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", id, err)
	}
	if s.deletedAt(m.Topic, off) {
		return nil, fmt.Errorf("%w: %s: its topic %s was deleted", core.ErrMessageNotFound, id, m.Topic)
	}
	return m, nil
}

// FindByKey implements core.Broker.
func (s *Store) FindByKey(ctx context.Context, topicName, key string, q core.KeyQuery) ([]*core.StoredMessage, error) {
	if s.closed.Load() {
		return nil, core.ErrClosed
	}
	if _, err := s.topic(topicName, false, 0); err != nil {
		return nil, err
	}
	if key == "" {
		return nil, fmt.Errorf("%w: empty key", core.ErrInvalidMessage)
	}
	maxN := q.Max
	if maxN <= 0 {
		maxN = 32
	}
	var begin, end int64
	if !q.Begin.IsZero() {
		begin = q.Begin.UnixNano()
	}
	if !q.End.IsZero() {
		end = q.End.UnixNano()
	}
	hits, err := s.idx.lookup(keyHash(topicName, key), begin, end, maxKeyIndexHops)
	if err != nil {
		return nil, err
	}
	limit := s.confirmed.Load()
	logMin, _ := s.cl.bounds()
	s.topicsMu.RLock()
	fence := s.tombstones[topicName] // records below it belong to a deleted incarnation
	s.topicsMu.RUnlock()
	logMin = max(logMin, fence)
	var out []*core.StoredMessage
	seen := map[int64]bool{}
	for _, h := range hits {
		if len(out) >= maxN || ctx.Err() != nil {
			break
		}
		if seen[h.offset] || h.offset < logMin || h.offset+int64(h.size) > limit {
			continue
		}
		seen[h.offset] = true
		buf := make([]byte, h.size)
		if err := s.cl.readAt(buf, h.offset, limit); err != nil {
			continue
		}
		m, err := s.decodeAt(buf, h.offset)
		if err != nil {
			s.log.Error().Err(err).Int64("log_offset", h.offset).Msg("corrupt message not served")
			continue
		}
		if m.Topic != topicName || !hasKey(m, key) {
			continue // a hash collision or a stale entry
		}
		out = append(out, m)
	}
	return out, nil
}

func hasKey(m *core.StoredMessage, key string) bool {
	if m.ShardingKey == key {
		return true
	}
	for _, k := range m.Keys {
		if k == key {
			return true
		}
	}
	return false
}

// OffsetAt implements core.Broker. The consume queue is the time index:
// store times never decrease along the commit log, so a binary search over a
// queue's entries that reads each probe's store time from the log finds the
// first message at or after t in O(log n) reads (as RocketMQ does).
func (s *Store) OffsetAt(ctx context.Context, topicName string, queue int, t time.Time) (int64, error) {
	if s.closed.Load() {
		return 0, core.ErrClosed
	}
	cq, err := s.queue(topicName, queue)
	if err != nil {
		return 0, err
	}
	want := t.UnixNano()
	limit := s.confirmed.Load()
	logMin, _ := s.cl.bounds()
	return cq.searchOffset(func(e cqEntry) (bool, error) {
		if e.offset < logMin {
			return false, nil
		}
		at, err := s.storedAtOf(e.offset, limit)
		if errors.Is(err, core.ErrMessageNotFound) {
			// Dispatched, not yet readable: newer than everything that is,
			// so not before t. (false here would break the search's order
			// and skip the newest messages of a queue.)
			return true, nil
		}
		return err == nil && at >= want, err
	})
}

// storedAtOf reads the store time of the record at log offset off, which
// must lie below limit: 8 bytes, without decoding the record.
func (s *Store) storedAtOf(off, limit int64) (int64, error) {
	var b [8]byte
	if err := s.cl.readAt(b[:], off+offStoredAt, limit); err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint64(b[:])), nil
}

// Backlog implements core.Broker: consume-queue offsets are dense, so the
// count is the span from from (or the queue's minimum) to its maximum.
func (s *Store) Backlog(_ context.Context, topicName string, queue int, from int64) (int64, error) {
	if s.closed.Load() {
		return 0, core.ErrClosed
	}
	cq, err := s.queue(topicName, queue)
	if err != nil {
		return 0, err
	}
	return max(cq.max.Load()-max(from, cq.min.Load()), 0), nil
}
