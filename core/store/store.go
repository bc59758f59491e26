package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// Store is the embedded commit-log engine. It implements core.Broker.
type Store struct {
	opts Options
	dir  string
	fs   vfs.FS
	log  zerolog.Logger
	id   uint32
	// cqFileEntries is entries per consume-queue file, as store.meta fixed it.
	cqFileEntries int
	lock          *dirLock

	cl  *commitLog
	idx *keyIndex

	topicsMu sync.RWMutex // guards topics and tombstones; creation and deletion persist topics.meta under it
	topics   map[string]*topic
	// tombstones: per deleted topic name, the commit-log offset below which
	// its records belong to a deleted incarnation and are never served,
	// indexed or dispatched again.
	tombstones map[string]int64
	deleteMu   sync.Mutex // one DeleteTopic at a time

	// appendMu guards the append state below. Lock order: appendMu, then
	// commitLog.mu / keyIndex.mu / consumeQueue.mu.
	appendMu   sync.Mutex
	nextOffset int64 // end of the log including pending bytes
	activeBase int64 // base of the segment that receives pending bytes
	lastStored int64 // store time of the last record, unix ns
	pend       *batch
	spare      *batch
	largeUsed  bool  // a record over chunkBytes was appended since the last trimLarge
	failErr    error // sticky: set once a write or fsync failed
	closing    bool

	written   atomic.Int64 // bytes handed to the OS
	synced    atomic.Int64 // bytes fsynced
	confirmed atomic.Int64 // readable end: durable under the policy, dispatched

	// arrival is closed and replaced whenever new messages become
	// readable; topicArrival likewise per topic, for topics someone waits on.
	arrivalMu    sync.Mutex
	arrival      chan struct{}
	topicArrival map[string]chan struct{}

	offsetsMu    sync.Mutex
	offsets      map[offsetKey]int64
	offsetsDirty bool

	kick chan struct{}

	// overlapping (set by the writer under appendMu, read by it):
	// produces overlapped in the last cycle — it served more than one, or
	// the next batch began while it ran — so the next batch is worth
	// waiting for (Options.GroupCommitDelay). A lone producer that waits
	// for each ack is never kept waiting.
	overlapping bool

	dispatchRound uint64   // owned by the dispatching goroutine
	touched       []*topic // topics the last dispatch wrote; dispatcher only

	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
	closed    atomic.Bool

	lastCheckpoint int64
	stats          stats

	// budgets are the cold-read budgets.
	budgets *readBudgets
}

type stats struct {
	fsyncs     atomic.Int64
	messages   atomic.Int64
	cycles     atomic.Int64
	fsyncTimes fsyncTimes
	coldReads  atomic.Int64
	coldBytes  atomic.Int64
	// coldDirectBytes: the part of the cold reads read directly (O_DIRECT)
	coldDirectBytes atomic.Int64
}

// Stats are counters since Open.
type Stats struct {
	// Messages is the number of records appended.
	Messages int64
	// Fsyncs is the number of commit-log fsyncs.
	Fsyncs int64
	// WriteCycles is the number of writer cycles (one write call each).
	WriteCycles int64
	// CommitLogBytes is the size of all commit-log segments on disk.
	CommitLogBytes int64
	// FsyncCounts counts commit-log fsyncs by duration: FsyncCounts[i] those
	// that took at most FsyncBuckets[i] (and more than the bucket before),
	// the last entry those beyond every bound. Not cumulative.
	FsyncCounts []int64
	// FsyncTime is the time all commit-log fsyncs took.
	FsyncTime time.Duration

	// TailCacheBytes is the tail cache's size (0: off).
	TailCacheBytes int64
	// TailCacheHits and TailCacheMisses count the records Read and Get
	// took from the tail cache and from behind it.
	TailCacheHits, TailCacheMisses int64
	// ColdReads and ColdReadBytes count the records Read read from behind
	// the tail cache (pread, drop-behind, budgeted) and their bytes.
	ColdReads, ColdReadBytes int64
	// ColdReadDirectBytes is the part of ColdReadBytes read around the
	// page cache (O_DIRECT, dense runs of records).
	ColdReadDirectBytes int64
	// ColdReadDelays counts the Reads that waited for a cold-read budget;
	// ColdReadDelay is the time they waited in all.
	ColdReadDelays int64
	ColdReadDelay  time.Duration
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	counts, sum := s.stats.fsyncTimes.snapshot()
	st := Stats{Messages: s.stats.messages.Load(), Fsyncs: s.stats.fsyncs.Load(), WriteCycles: s.stats.cycles.Load(),
		CommitLogBytes: s.cl.diskBytes(), FsyncCounts: counts, FsyncTime: sum,
		TailCacheHits: s.cl.hits.Load(), TailCacheMisses: s.cl.misses.Load(),
		ColdReads: s.stats.coldReads.Load(), ColdReadBytes: s.stats.coldBytes.Load(), ColdReadDirectBytes: s.stats.coldDirectBytes.Load(),
		ColdReadDelays: s.budgets.delayed.Load(), ColdReadDelay: time.Duration(s.budgets.waited.Load())}
	if c := s.cl.cache; c != nil {
		st.TailCacheBytes = c.capacity
	}
	return st
}

// Failure is the error that made the store refuse writes (it wraps
// core.ErrStoreFailed and the write or fsync error behind it), nil while
// it accepts them. Once set it stays until the store is opened again: after
// a failed write or fsync nobody knows what the file holds, so only
// recovery's scan may say (nats-server's filestore does the same).
func (s *Store) Failure() error {
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	return s.failErr
}

type topic struct {
	name    string
	created time.Time
	// qs holds every queue that can be read: the ones producers write to
	// and those a resize retired (read it with slots). It only grows, by
	// ResizeTopic, which stores a longer copy.
	qs   atomic.Pointer[[]*consumeQueue]
	next []int64 // next queue offset per queue; guarded by Store.appendMu
	// lay is the queue count producers use and the epochs behind it;
	// replaced, never changed, under Store.appendMu (resize.go).
	lay     atomic.Pointer[layout]
	rr      atomic.Uint32
	mark    uint64 // dispatcher's scratch: last dispatch round that wrote this topic
	deleted bool   // set by DeleteTopic; guarded by Store.appendMu
}

// batch is what producers have appended and the writer has not yet written.
type batch struct {
	chunks  []chunk
	disp    []dispatchReq
	waiters []*waiter
	end     int64
}

// chunk is a run of records contiguous in the log, written with one
// write. A batch's records go into chunks of at most chunkBytes whose
// buffers are kept for later cycles: a batch that grows copies at most a
// chunk, never all it holds (one growing buffer spent half the CPU of a
// QoS 0 fan-in copying itself).
type chunk struct {
	off    int64 // global offset of buf[0]
	newSeg bool  // buf starts a new segment at off
	buf    []byte
}

// chunkBytes bounds a batch's chunks; a new chunk starts at chunkStart
// and grows up to it (a lone record larger than it has a chunk of its own,
// let go once no such record came for a checkpoint interval: trimLarge).
const (
	chunkBytes = 256 << 10
	chunkStart = 16 << 10
)

type dispatchReq struct {
	t        *topic
	queue    int
	qoff     int64
	off      int64
	size     int
	tagHash  int64
	storedAt int64
	keys     []uint64
}

// waiterPool recycles waiters whose producer received its answer (one that
// gave up on its context is left to the garbage collector: the writer will
// still send to it).
var waiterPool = sync.Pool{New: func() any { return &waiter{ch: make(chan error, 1)} }}

type waiter struct {
	end int64
	ch  chan error
	cb  func(error) // set instead of ch by ProduceAsync; runs on the writer goroutine
}

func (b *batch) reset() {
	for i := range b.chunks {
		b.chunks[i].buf = b.chunks[i].buf[:0]
	}
	b.chunks = b.chunks[:0]
	clear(b.disp)
	b.disp = b.disp[:0]
	clear(b.waiters)
	b.waiters = b.waiters[:0]
}

// dropLarge lets go of the buffers larger than chunkBytes (a large
// record's own) that b keeps for later cycles, past the chunks in use.
func (b *batch) dropLarge() {
	cs := b.chunks[len(b.chunks):cap(b.chunks)]
	for i := range cs {
		if cap(cs[i].buf) > chunkBytes {
			cs[i].buf = nil
		}
	}
}

// Names in the data directory.
const (
	dirCommitLog    = "commitlog"
	dirIndex        = "index"
	fileStoreMeta   = "store.meta"
	fileTopics      = "topics.meta"
	fileCheckpoint  = "checkpoint"
	fileOffsets     = "offsets.meta"
	fileAbort       = "abort"
	fileLock        = "LOCK"
	maxKeyIndexHops = 10_000
)

// storeFormat is the version of the data directory's format as a whole
// (records, consume queues, index files, metadata). A change an older
// binary could not read raises it; Open refuses a directory whose
// store.meta names a format newer than this one (ErrNewerFormat) instead of
// taking records it cannot parse for damage. It is part of the format.
//
// A store is created at format 1; its first resize raises it to 2
// (resize.go), the format that has topic epochs in topics.meta.
const storeFormat = 2

type storeMeta struct {
	ID      uint32    `json:"id"`
	Created time.Time `json:"created"`
	// Format is storeFormat of the binary that created the directory;
	// absent (0) in stores created before it was written, which are format 1.
	Format int `json:"format,omitempty"`
	// CQFileEntries is the entries per consume-queue file, fixed at creation
	// (Options.ConsumeQueueFileEntries then): every file already written is
	// laid out with it. Absent in older stores: the option in force when it
	// was first written down is taken.
	CQFileEntries int `json:"cq_file_entries,omitempty"`
}

type topicMeta struct {
	Name    string    `json:"name"`
	Queues  int       `json:"queues"` // queues on disk; 0: a tombstone only (the topic was deleted)
	Created time.Time `json:"created,omitzero"`
	// Epochs is the topic's history of queue counts (resize.go); absent for
	// a topic never resized, whose one epoch writes to all Queues.
	Epochs []epochMeta `json:"epochs,omitempty"`
	// DeletedBelow, when set, fences off the records of a deleted earlier
	// incarnation: those below this commit-log offset.
	DeletedBelow int64 `json:"deleted_below,omitempty"`
}

type checkpointMeta struct {
	// LogOffset: consume queues and indexes are durable for every record
	// below it, and the commit log is durable up to it.
	LogOffset int64     `json:"log_offset"`
	At        time.Time `json:"at"`
}

// Open opens (creating if needed) the store in dir, recovers it if it was not
// closed cleanly, and starts its background work. Close it when done.
func Open(dir string, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Store{
		opts:         opts,
		dir:          dir,
		fs:           opts.FS,
		log:          opts.Logger.With().Str("component", "store").Logger(),
		topics:       map[string]*topic{},
		tombstones:   map[string]int64{},
		offsets:      map[offsetKey]int64{},
		pend:         &batch{},
		spare:        &batch{},
		kick:         make(chan struct{}, 1),
		arrival:      make(chan struct{}),
		topicArrival: map[string]chan struct{}{},
		budgets:      newReadBudgets(opts.ReaderColdReadBytesPerSec, opts.ColdReadBytesPerSec),
	}
	if err := s.fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	if s.fs == vfs.Default {
		l, err := lockDir(filepath.Join(dir, fileLock))
		if err != nil {
			return nil, err
		}
		s.lock = l
	}
	if err := s.open(); err != nil {
		s.closeFiles()
		return nil, err
	}
	if err := s.openTailCache(); err != nil {
		s.closeFiles()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(3)
	if s.opts.FlushPolicy == FlushAsync {
		s.wg.Add(1)
		go s.flushLoop(ctx)
	}
	go s.writeLoop(ctx)
	go s.checkpointLoop(ctx)
	go s.retentionLoop(ctx)
	return s, nil
}

func (s *Store) open() error {
	var meta storeMeta
	found, err := readMeta(s.fs, s.dir, fileStoreMeta, &meta)
	if err != nil {
		return err
	}
	dirty := false
	if !found {
		var b [4]byte
		_, _ = rand.Read(b[:])
		meta = storeMeta{ID: binary.BigEndian.Uint32(b[:]) & 0xFFFFFF, Created: s.opts.Now().UTC(), Format: 1}
		dirty = true
	}
	if meta.Format > storeFormat {
		return fmt.Errorf("%w: store.meta says format %d, this binary reads up to %d", ErrNewerFormat, meta.Format, storeFormat)
	}
	switch {
	case meta.CQFileEntries == 0:
		meta.CQFileEntries = s.opts.ConsumeQueueFileEntries
		dirty = true
	case meta.CQFileEntries < 16:
		return fmt.Errorf("%w: store.meta: %d entries per consume-queue file", ErrBadMetadata, meta.CQFileEntries)
	case meta.CQFileEntries != s.opts.ConsumeQueueFileEntries:
		s.log.Warn().Int("configured", s.opts.ConsumeQueueFileEntries).Int("kept", meta.CQFileEntries).
			Msg("consume queue file entries are fixed at creation; the configured value is ignored")
	}
	if dirty {
		if err := writeMeta(s.fs, s.dir, fileStoreMeta, meta); err != nil {
			return err
		}
	}
	s.id = meta.ID
	s.cqFileEntries = meta.CQFileEntries

	unclean := false
	if _, err := s.fs.Stat(filepath.Join(s.dir, fileAbort)); err == nil {
		unclean = true
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("stat abort marker: %w", err)
	}
	af, err := s.fs.OpenFile(filepath.Join(s.dir, fileAbort), osCreateTrunc, 0o644)
	if err != nil {
		return fmt.Errorf("create abort marker: %w", err)
	}
	_ = af.Close()
	if err := s.fs.SyncDir(s.dir); err != nil {
		return fmt.Errorf("sync data dir: %w", err)
	}

	s.cl, err = openCommitLog(s.fs, filepath.Join(s.dir, dirCommitLog), s.opts.SegmentBytes)
	if err != nil {
		return err
	}
	var topics []topicMeta
	if _, err := readMeta(s.fs, s.dir, fileTopics, &topics); err != nil {
		return err
	}
	for _, tm := range topics {
		if tm.DeletedBelow > 0 {
			s.tombstones[tm.Name] = tm.DeletedBelow
		}
		if tm.Queues == 0 && tm.DeletedBelow > 0 {
			// Deleted and not recreated: queue files a crash left behind
			// go now, so that a new incarnation starts empty.
			if err := s.fs.RemoveAll(filepath.Join(s.dir, dirConsumeQueue, tm.Name)); err != nil {
				return fmt.Errorf("remove queues of deleted topic %s: %w", tm.Name, err)
			}
			continue
		}
		t, err := s.openTopic(tm)
		if err != nil {
			return err
		}
		s.topics[tm.Name] = t
	}
	var offs []offsetRecord
	if _, err := readMeta(s.fs, s.dir, fileOffsets, &offs); err != nil {
		return err
	}
	for _, o := range offs {
		s.offsets[offsetKey{o.Group, o.Topic, o.Queue}] = o.Offset
	}
	return s.recover(unclean)
}

func (s *Store) openTopic(tm topicMeta) (*topic, error) {
	if tm.Queues < 1 || tm.Queues > core.MaxQueues {
		return nil, fmt.Errorf("%w: topic %q has %d queues", ErrBadMetadata, tm.Name, tm.Queues)
	}
	lay, err := layoutOf(tm)
	if err != nil {
		return nil, err
	}
	t := &topic{name: tm.Name, created: tm.Created, next: make([]int64, tm.Queues)}
	qs, err := s.openQueues(tm.Name, nil, tm.Queues)
	if err != nil {
		return nil, err
	}
	for q, cq := range qs {
		t.next[q] = cq.max.Load()
	}
	t.qs.Store(&qs)
	t.lay.Store(lay)
	return t, nil
}

// openQueues opens the queues of topic name from len(have) up to n and
// returns them after have's; on error it closes what it opened.
func (s *Store) openQueues(name string, have []*consumeQueue, n int) ([]*consumeQueue, error) {
	out := slices.Clone(have)
	for q := len(have); q < n; q++ {
		cq, err := openConsumeQueue(s.fs, queueDir(s.dir, name, q), s.cqFileEntries)
		if err != nil {
			for _, c := range out[len(have):] {
				_ = c.close()
			}
			return nil, fmt.Errorf("topic %s queue %d: %w", name, q, err)
		}
		out = append(out, cq)
	}
	return out, nil
}

// slots returns every queue of the topic that can be read.
func (t *topic) slots() []*consumeQueue { return *t.qs.Load() }

// writeQueues is the number of queues producers write to.
func (t *topic) writeQueues() int {
	return t.lay.Load().queues
}

// persistTopicsLocked writes topics.meta; topicsMu must be held.
func (s *Store) persistTopicsLocked() error {
	list := make([]topicMeta, 0, len(s.topics)+len(s.tombstones))
	for _, t := range s.topics {
		list = append(list, topicMeta{Name: t.name, Queues: len(t.slots()), Created: t.created,
			DeletedBelow: s.tombstones[t.name], Epochs: t.lay.Load().meta()})
	}
	for name, fence := range s.tombstones {
		if s.topics[name] == nil {
			list = append(list, topicMeta{Name: name, DeletedBelow: fence})
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	return writeMeta(s.fs, s.dir, fileTopics, list)
}

// topic returns the named topic, creating it if allowed.
func (s *Store) topic(name string, create bool, queues int) (*topic, error) {
	s.topicsMu.RLock()
	t := s.topics[name]
	s.topicsMu.RUnlock()
	if t != nil {
		return t, nil
	}
	if !create {
		return nil, fmt.Errorf("%w: %q", core.ErrTopicNotFound, name)
	}
	s.topicsMu.Lock()
	defer s.topicsMu.Unlock()
	if t := s.topics[name]; t != nil {
		return t, nil
	}
	if queues == 0 {
		queues = s.opts.DefaultQueues
	}
	t, err := s.openTopic(topicMeta{Name: name, Queues: queues, Created: s.opts.Now().UTC()})
	if err != nil {
		return nil, err
	}
	s.topics[name] = t
	if err := s.persistTopicsLocked(); err != nil {
		delete(s.topics, name)
		for _, c := range t.slots() {
			_ = c.close()
		}
		return nil, fmt.Errorf("create topic %s: %w", name, err)
	}
	s.log.Info().Str("topic", name).Int("queues", queues).Msg("topic created")
	return t, nil
}

// prepared is one message checked outside the lock: its topic, queue,
// record length and key hashes. The record itself is encoded under the
// lock, straight into the batch's buffer (one copy of the body, no garbage
// per message).
type prepared struct {
	t     *topic
	queue int // picked under appendMu, where the topic's queue count holds still
	key   string
	n     int
	keys  []uint64
}

func (s *Store) prepare(m *core.Message) (prepared, error) {
	var p prepared
	if m == nil {
		return p, fmt.Errorf("%w: nil message", core.ErrInvalidMessage)
	}
	if err := s.checkTopicName(m.Topic); err != nil {
		return p, err
	}
	n, err := encodedLen(m, s.opts.MaxPropertiesBytes)
	if err != nil {
		return p, err
	}
	if n > s.opts.MaxMessageBytes {
		// The limit of new produces only; what is stored stays readable.
		return p, fmt.Errorf("%w: %d bytes stored, limit %d (store.max_message_bytes)", core.ErrMessageTooLarge, n, s.opts.MaxMessageBytes)
	}
	t, err := s.topic(m.Topic, !s.opts.DisableAutoCreate, 0)
	if err != nil {
		return p, err
	}
	p.t = t
	p.key = m.ShardingKey
	p.n = n
	if m.ShardingKey != "" {
		p.keys = append(p.keys, keyHash(m.Topic, m.ShardingKey))
	}
	for _, k := range m.Keys {
		if k != m.ShardingKey {
			p.keys = append(p.keys, keyHash(m.Topic, k))
		}
	}
	return p, nil
}

func (s *Store) checkTopicName(name string) error {
	if len(name) > 0 && name[0] == '%' {
		return core.ValidateSystemTopic(name)
	}
	return core.ValidateTopic(name)
}

// Produce implements core.Broker.
func (s *Store) Produce(ctx context.Context, m *core.Message) (core.SendResult, error) {
	res, err := s.produce(ctx, []*core.Message{m})
	if err != nil {
		return core.SendResult{}, err
	}
	return res[0], nil
}

// ProduceBatch implements core.Broker.
func (s *Store) ProduceBatch(ctx context.Context, msgs []*core.Message) ([]core.SendResult, error) {
	if len(msgs) == 0 {
		if s.closed.Load() {
			return nil, core.ErrClosed
		}
		return nil, nil
	}
	return s.produce(ctx, msgs)
}

// ProduceAsync implements core.Broker.
func (s *Store) ProduceAsync(msgs []*core.Message, done func([]core.SendResult, error)) {
	if len(msgs) == 0 {
		if s.closed.Load() {
			done(nil, core.ErrClosed)
			return
		}
		done(nil, nil)
		return
	}
	res := make([]core.SendResult, len(msgs)) // filled before w can run
	w := &waiter{}
	w.cb = func(err error) {
		if err != nil {
			done(nil, err)
			return
		}
		s.stats.messages.Add(int64(len(msgs)))
		done(res, nil)
	}
	if err := s.appendAll(msgs, w, res); err != nil {
		done(nil, err)
	}
}

func (s *Store) produce(ctx context.Context, msgs []*core.Message) ([]core.SendResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w := waiterPool.Get().(*waiter)
	res := make([]core.SendResult, len(msgs))
	if err := s.appendAll(msgs, w, res); err != nil {
		waiterPool.Put(w)
		return nil, err
	}
	select {
	case err := <-w.ch:
		waiterPool.Put(w)
		if err != nil {
			return nil, err
		}
		s.stats.messages.Add(int64(len(msgs)))
		return res, nil
	case <-ctx.Done():
		// The messages may still be stored; the caller was told nothing.
		return nil, fmt.Errorf("produce: %w", ctx.Err())
	}
}

// appendAll validates and encodes msgs, then appends them in one critical
// section, fills res (one per message) and queues w to be woken when they
// are durable. On error nothing was appended and w will not be woken.
func (s *Store) appendAll(msgs []*core.Message, w *waiter, res []core.SendResult) error {
	if s.closed.Load() {
		return core.ErrClosed
	}
	preps := make([]prepared, len(msgs))
	for i, m := range msgs {
		p, err := s.prepare(m)
		if err != nil {
			if len(msgs) > 1 {
				return fmt.Errorf("message %d: %w", i, err)
			}
			return err
		}
		preps[i] = p
	}
	s.appendMu.Lock()
	for i := range preps {
		if err := s.appendableLocked(preps[i].t); err != nil {
			s.appendMu.Unlock()
			return err
		}
	}
	now := s.opts.Now().UnixNano()
	if now <= s.lastStored {
		now = s.lastStored // store times never go backwards along the log
	}
	s.lastStored = now
	b := s.pend
	for i := range preps {
		p := &preps[i]
		if nq := p.t.writeQueues(); p.key != "" {
			p.queue = core.QueueFor(p.key, nq)
		} else {
			p.queue = int((p.t.rr.Add(1) - 1) % uint32(nq))
		}
		n := int64(p.n)
		newSeg := false
		if s.nextOffset > s.activeBase && s.nextOffset-s.activeBase+n > s.opts.SegmentBytes {
			s.activeBase = s.nextOffset
			newSeg = true
		}
		off := s.nextOffset
		qoff := p.t.next[p.queue]
		p.t.next[p.queue]++
		if p.n > chunkBytes {
			s.largeUsed = true
		}
		if k := len(b.chunks); k == 0 || newSeg || len(b.chunks[k-1].buf)+p.n > chunkBytes {
			if k < cap(b.chunks) {
				b.chunks = b.chunks[:k+1] // reuse the buffer of an earlier cycle
				b.chunks[k].off, b.chunks[k].newSeg = off, newSeg
				b.chunks[k].buf = b.chunks[k].buf[:0]
				if cap(b.chunks[k].buf) == 0 {
					b.chunks[k].buf = make([]byte, 0, max(chunkStart, p.n))
				}
			} else {
				b.chunks = append(b.chunks, chunk{off: off, newSeg: newSeg, buf: make([]byte, 0, max(chunkStart, p.n))})
			}
		}
		c := &b.chunks[len(b.chunks)-1]
		at := len(c.buf)
		c.buf = appendRecord(c.buf, msgs[i], p.n, now)
		sealRecord(c.buf[at:], off, qoff, now, p.queue)
		b.disp = append(b.disp, dispatchReq{
			t: p.t, queue: p.queue, qoff: qoff, off: off, size: int(n),
			tagHash: core.TagHash(msgs[i].Tag), storedAt: now, keys: p.keys,
		})
		res[i] = core.SendResult{
			ID:              core.NewCommitLogID(s.id, off, int(n)),
			Topic:           p.t.name,
			Queue:           p.queue,
			QueueOffset:     qoff,
			CommitLogOffset: off,
			StoredAt:        time.Unix(0, now),
		}
		s.nextOffset += n
	}
	w.end = s.nextOffset
	b.end = s.nextOffset
	b.waiters = append(b.waiters, w)
	s.appendMu.Unlock()

	select {
	case s.kick <- struct{}{}:
	default:
	}
	return nil
}

// appendableLocked says why nothing may be appended to t now, if anything
// forbids it; appendMu must be held.
func (s *Store) appendableLocked(t *topic) error {
	switch {
	case s.closing:
		return core.ErrClosed
	case s.failErr != nil:
		return s.failErr
	case t.deleted:
		return fmt.Errorf("%w: %q was deleted", core.ErrTopicNotFound, t.name)
	}
	return nil
}

// writeLoop is the single writer and the heart of group commit: each cycle
// takes everything producers appended since the last one, writes it with one
// write call, fsyncs it with one fsync (in sync mode; in async mode every
// FlushInterval), dispatches it to consume queues and indexes, and wakes the
// producers. While a cycle runs, the next batch gathers.
//
// Write and fsync are deliberately not pipelined: a write into a page that
// is under writeback waits for that I/O to finish (stable pages), so
// overlapping them only moves the wait.
func (s *Store) writeLoop(ctx context.Context) {
	defer s.wg.Done()
	var linger *time.Timer // gather's, made on first use
	defer func() {
		if linger != nil {
			linger.Stop()
		}
	}()
	for {
		select {
		case <-s.kick:
			// Let producers that are ready to append do so first: on a
			// machine with few cores this is what fills a batch. In sync
			// mode the fsync dominates a cycle, so a fuller batch always
			// pays; in async mode only a small batch is worth the wait (a
			// yield can put the writer behind every runnable goroutine).
			s.appendMu.Lock()
			small := len(s.pend.disp) < 16
			s.appendMu.Unlock()
			if small || s.opts.FlushPolicy == FlushSync {
				runtime.Gosched()
			}
			if s.lingers() && s.overlapping && !s.gather(ctx, &linger) {
				s.cycle(true)
				return
			}
			s.cycle(false)
		case <-ctx.Done():
			s.cycle(true) // the last appends before Close
			return
		}
	}
}

// flushLoop is the async policy's background flush: every FlushInterval it
// fsyncs what the writer has written so far. It runs beside the writer, so
// appends and acknowledgements go on while the disk catches up.
func (s *Store) flushLoop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := s.fsync(); err != nil {
				s.fail(err) // sticky: later produces are refused
			}
		case <-ctx.Done():
			return
		}
	}
}

// cycle runs one round of the writer. forceSync fsyncs even in async mode.
func (s *Store) cycle(forceSync bool) {
	s.appendMu.Lock()
	b := s.pend
	s.pend, s.spare = s.spare, nil
	failed := s.failErr
	s.appendMu.Unlock()
	defer func() {
		b.reset()
		s.appendMu.Lock()
		s.spare = b
		s.appendMu.Unlock()
	}()

	if failed != nil {
		wake(b.waiters, failed)
		return
	}
	if len(b.chunks) > 0 {
		s.stats.cycles.Add(1)
		if err := s.writeChunks(b); err != nil {
			wake(b.waiters, s.fail(err))
			return
		}
		s.written.Store(b.end)
	}
	if forceSync || s.opts.FlushPolicy == FlushSync {
		if err := s.fsync(); err != nil {
			wake(b.waiters, s.fail(err))
			return
		}
	}
	if len(b.chunks) == 0 {
		return
	}
	if err := s.dispatch(b.disp); err != nil {
		wake(b.waiters, s.fail(fmt.Errorf("dispatch: %w", err)))
		return
	}
	s.confirmed.Store(b.end)
	s.announce(s.touched)
	if s.lingers() {
		// Before the wake: a producer woken by it may append at once, and
		// a lone one must not look like company.
		s.appendMu.Lock()
		s.overlapping = len(b.waiters) > 1 || len(s.pend.waiters) > 0
		s.appendMu.Unlock()
	}
	wake(b.waiters, nil)
}

// fsync makes everything written so far durable. Segments before the active
// one were synced when they were sealed.
func (s *Store) fsync() error {
	end := s.written.Load()
	if s.synced.Load() >= end {
		return nil
	}
	seg, err := s.cl.active(0)
	if err == nil {
		start := time.Now()
		err = seg.file.Sync()
		s.stats.fsyncTimes.record(time.Since(start))
	}
	if err != nil {
		return fmt.Errorf("fsync commit log: %w", err)
	}
	s.stats.fsyncs.Add(1)
	for { // the writer and the flusher may both sync: synced only grows
		cur := s.synced.Load()
		if cur >= end || s.synced.CompareAndSwap(cur, end) {
			return nil
		}
	}
}

func (s *Store) writeChunks(b *batch) error {
	for _, c := range b.chunks {
		var seg *segment
		var err error
		if c.newSeg {
			seg, err = s.cl.roll(c.off)
			if err == nil {
				s.log.Info().Int64("base", c.off).Msg("segment rolled")
			}
		} else {
			seg, err = s.cl.active(c.off)
		}
		if err != nil {
			return err
		}
		pos := c.off - seg.base
		n, err := seg.file.WriteAt(c.buf, pos)
		if err != nil || n != len(c.buf) {
			if err == nil {
				err = fmt.Errorf("short write: %d of %d bytes", n, len(c.buf))
			}
			// No half record may stay behind: cut back to where this write
			// began. If even that fails, recovery cuts the torn tail.
			if terr := seg.file.Truncate(pos); terr != nil {
				s.log.Error().Err(terr).Str("segment", segmentName(seg.base)).Msg("truncate after failed write")
			}
			return fmt.Errorf("write segment %s at %d: %w", segmentName(seg.base), pos, err)
		}
		if s.cl.cache != nil {
			s.cl.cache.fill(c.off, c.buf)
		}
		s.cl.mu.Lock()
		seg.size = pos + int64(n)
		s.cl.mu.Unlock()
	}
	return nil
}

// fail makes the error sticky and returns it; every later produce fails
// with it.
func (s *Store) fail(cause error) error {
	err := fmt.Errorf("%w: %w", core.ErrStoreFailed, cause)
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	if s.failErr == nil {
		s.failErr = err
		s.log.Error().Err(cause).Msg("store write failed; refusing further writes")
	}
	return s.failErr
}

func wake(ws []*waiter, err error) {
	for _, w := range ws {
		if w.cb != nil {
			w.cb(err)
			continue
		}
		w.ch <- err
	}
}

// dispatch adds consume-queue and index entries for durable records and
// publishes them to readers. Only one goroutine dispatches at a time: the
// writer, or recovery before the writer starts.
func (s *Store) dispatch(reqs []dispatchReq) error {
	s.dispatchRound++
	round := s.dispatchRound
	var touched []*consumeQueue
	s.touched = s.touched[:0]
	for i := range reqs {
		r := &reqs[i]
		cq := r.t.slots()[r.queue]
		if cq.mark != round {
			cq.mark = round
			touched = append(touched, cq)
		}
		if r.t.mark != round {
			r.t.mark = round
			s.touched = append(s.touched, r.t)
		}
		if err := cq.add(r.qoff, cqEntry{offset: r.off, size: int32(r.size), tagHash: r.tagHash}); err != nil {
			return err
		}
		for _, h := range r.keys {
			if err := s.idx.add(h, r.off, r.size, r.storedAt); err != nil {
				return err
			}
		}
	}
	for _, cq := range touched {
		cq.publish()
	}
	return nil
}

// announce wakes long-pollers waiting for any of the topics just
// dispatched, or for any topic.
func (s *Store) announce(touched []*topic) {
	s.arrivalMu.Lock()
	close(s.arrival)
	s.arrival = make(chan struct{})
	for _, t := range touched {
		if ch, ok := s.topicArrival[t.name]; ok {
			close(ch)
			delete(s.topicArrival, t.name)
		}
	}
	s.arrivalMu.Unlock()
}

// Arrivals implements core.Broker.
func (s *Store) Arrivals(topic string) <-chan struct{} {
	s.arrivalMu.Lock()
	defer s.arrivalMu.Unlock()
	if topic == "" {
		return s.arrival
	}
	ch, ok := s.topicArrival[topic]
	if !ok {
		ch = make(chan struct{})
		s.topicArrival[topic] = ch
	}
	return ch
}

// trimLarge lets go of the buffers the writer's batches keep for large
// records once none was appended for a whole checkpoint interval: a stream
// of 4 MiB messages reuses them, a burst does not hold megabytes for good.
// The batch being written (neither pend nor spare) is left for the next
// time.
func (s *Store) trimLarge() {
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	if s.largeUsed {
		s.largeUsed = false
		return
	}
	for _, b := range []*batch{s.pend, s.spare} {
		if b != nil {
			b.dropLarge()
		}
	}
}

func (s *Store) checkpointLoop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := s.checkpoint(); err != nil {
				s.log.Error().Err(err).Msg("checkpoint")
			}
			s.trimLarge()
		case <-ctx.Done():
			return
		}
	}
}

// checkpoint makes consume queues, indexes and consumer offsets durable and
// records how far the commit log no longer needs to be replayed.
func (s *Store) checkpoint() error {
	d := s.confirmed.Load()
	var errs []error
	for _, t := range s.topicList() {
		for _, cq := range t.slots() {
			if err := cq.sync(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := s.idx.sync(); err != nil {
		errs = append(errs, err)
	}
	if err := s.persistOffsets(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	x := min(d, s.synced.Load())
	if x == s.lastCheckpoint {
		return nil
	}
	if err := writeMeta(s.fs, s.dir, fileCheckpoint, checkpointMeta{LogOffset: x, At: s.opts.Now().UTC()}); err != nil {
		return err
	}
	s.lastCheckpoint = x
	return nil
}

func (s *Store) topicList() []*topic {
	s.topicsMu.RLock()
	defer s.topicsMu.RUnlock()
	out := make([]*topic, 0, len(s.topics))
	for _, t := range s.topics {
		out = append(out, t)
	}
	return out
}

// Close implements core.Broker: it stops accepting produces, writes and
// fsyncs what was appended, checkpoints, and releases the directory. It
// returns only after every goroutine the store started has ended.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.appendMu.Lock()
		s.closing = true
		s.appendMu.Unlock()
		s.cancel()
		s.wg.Wait()
		var errs []error
		s.appendMu.Lock()
		failed := s.failErr
		s.appendMu.Unlock()
		if err := s.checkpoint(); err != nil {
			errs = append(errs, err)
		}
		if failed == nil && len(errs) == 0 {
			// A clean shutdown: the next open needs no recovery scan.
			if err := s.fs.Remove(filepath.Join(s.dir, fileAbort)); err != nil {
				errs = append(errs, fmt.Errorf("remove abort marker: %w", err))
			} else if err := s.fs.SyncDir(s.dir); err != nil {
				errs = append(errs, err)
			}
		}
		errs = append(errs, s.closeFiles())
		s.closeErr = errors.Join(errs...)
		s.log.Info().Bool("clean", failed == nil).Msg("store closed")
	})
	return s.closeErr
}

func (s *Store) closeFiles() error {
	var errs []error
	for _, t := range s.topicList() {
		for _, cq := range t.slots() {
			errs = append(errs, cq.close())
		}
	}
	if s.idx != nil {
		errs = append(errs, s.idx.close())
	}
	if s.cl != nil {
		errs = append(errs, s.cl.close())
	}
	if s.lock != nil {
		errs = append(errs, s.lock.release())
	}
	return errors.Join(errs...)
}

// ID returns the store's 24-bit identity, embedded in its message IDs.
func (s *Store) ID() uint32 { return s.id }

var _ core.Broker = (*Store)(nil)

// lingers: the writer may wait for overlapping produces to join a batch
// (Options.GroupCommitDelay, sync policy only).
func (s *Store) lingers() bool { return s.opts.FlushPolicy == FlushSync && s.opts.GroupCommitDelay > 0 }

// groupCommitEnough is a batch that is fsynced at once, without waiting
// out GroupCommitDelay: the fsync is then shared widely enough.
const groupCommitEnough = 32

// gather waits, up to GroupCommitDelay from now, until the pending batch
// holds groupCommitEnough messages; every append kicks the writer, which
// looks again. It returns false when ctx ended meanwhile (the store is
// closing). *t is the writer's timer, kept across cycles.
func (s *Store) gather(ctx context.Context, t **time.Timer) bool {
	deadline := time.Now().Add(s.opts.GroupCommitDelay)
	for {
		s.appendMu.Lock()
		n := len(s.pend.disp)
		s.appendMu.Unlock()
		left := time.Until(deadline)
		if n >= groupCommitEnough || left <= 0 {
			return true
		}
		if *t == nil {
			*t = time.NewTimer(left)
		} else {
			(*t).Reset(left)
		}
		select { // (Reset and Stop leave no stale tick since Go 1.23)
		case <-s.kick:
			(*t).Stop()
		case <-(*t).C:
		case <-ctx.Done():
			return false
		}
	}
}
