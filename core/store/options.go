package store

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// FlushPolicy says when a produce is acknowledged.
type FlushPolicy string

const (
	// FlushAsync acknowledges once the record is written to the operating
	// system (page cache); a background flush fsyncs every FlushInterval.
	FlushAsync FlushPolicy = "async"
	// FlushSync acknowledges once the record is fsynced; concurrent
	// producers share fsyncs (group commit).
	FlushSync FlushPolicy = "sync"
)

// Options configure a Store. A zero field means its default.
type Options struct {
	// FS is the filesystem; default vfs.Default (the OS).
	FS vfs.FS
	// Logger receives one line per notable event; default: discard.
	Logger *zerolog.Logger

	// FlushPolicy: FlushAsync (default) or FlushSync.
	FlushPolicy FlushPolicy
	// FlushInterval is how often FlushAsync fsyncs; default 500 ms.
	FlushInterval time.Duration
	// GroupCommitDelay (FlushSync only) is how long the writer may wait,
	// once a batch has begun, for more produces to join it before it
	// writes and fsyncs it, when produces overlap (the last cycle served
	// several, or the next one began while it ran: a lone producer that
	// waits for each ack is never kept waiting); a batch of
	// groupCommitEnough messages goes at once. Produces that come a few
	// at a time share far fewer fsyncs (each costs CPU as well as disk
	// time) and wait up to this much longer for their ack. Default
	// DefaultGroupCommitDelay; negative: no wait (only a yield to
	// producers that are ready).
	GroupCommitDelay time.Duration
	// CheckpointInterval is how often consume queues, indexes and consumer
	// offsets are made durable and the checkpoint advanced; default 1 s.
	CheckpointInterval time.Duration

	// SegmentBytes caps a commit-log segment file; default 1 GiB, at least
	// 4 KiB. A record never spans segments, so it must also hold the
	// largest record.
	SegmentBytes int64
	// MaxMessageBytes bounds the whole record of a new produce (body,
	// topic, keys, tag, properties and the record's header); default
	// core.DefaultMaxMessageBytes (4 MiB + 256 KiB: a core.MaxBodyBytes
	// body with any metadata the format allows), at most 1 GiB (the
	// format's limit). It is checked at produce only: records already
	// stored are read and recovered whatever it is now, so it may be
	// lowered or raised between runs.
	MaxMessageBytes int
	// MaxPropertiesBytes bounds properties plus index keys of a message;
	// default 32 KiB, at most 64 KiB.
	MaxPropertiesBytes int

	// DefaultQueues is the queue count of auto-created topics; default 8.
	DefaultQueues int
	// DisableAutoCreate makes Produce to an unknown topic fail with
	// core.ErrTopicNotFound.
	DisableAutoCreate bool

	// ConsumeQueueFileEntries is the number of 20-byte entries per
	// consume-queue file; default 300,000 (6 MB files). It is fixed when the
	// store is created (recorded in store.meta): a different value on a
	// later Open is logged and ignored, since the files already written
	// were laid out with the first one.
	ConsumeQueueFileEntries int
	// IndexSlots and IndexEntries size each key-index file; defaults 1 Mi
	// slots and 2 Mi entries (68 MiB files).
	IndexSlots   int
	IndexEntries int

	// Retention deletes whole segments older than this; default 72 h.
	Retention time.Duration
	// MaxDiskBytes deletes the oldest segments while the commit log is
	// larger than this; 0 means no ceiling.
	MaxDiskBytes int64
	// RetentionInterval is how often retention runs; default 10 s.
	RetentionInterval time.Duration

	// TailCacheBytes is the memory that holds the newest commit-log bytes
	// (the tail cache: filled on append, and from the end of the log at
	// Open), so that reads at the tail take no system call and no page
	// fault, whatever else goes through the page cache. Reads from behind
	// it are cold reads: pread, drop-behind, and charged to their reader's
	// budget (below). Default DefaultTailCacheBytes; negative: no tail
	// cache, and every read goes through the segments' mappings as before
	// (no cold reads, no budgets).
	TailCacheBytes int64
	// ReaderColdReadBytesPerSec bounds each reader's cold reads
	// (core.ReadRequest.Reader; a consumer group is one reader): a Read
	// over it waits in its own call. Default
	// DefaultReaderColdReadBytesPerSec; negative: no bound.
	ReaderColdReadBytesPerSec int64
	// ColdReadBytesPerSec bounds the cold reads of all readers together;
	// 0 or negative: no bound beyond each reader's.
	ColdReadBytesPerSec int64
	// ColdReadMaxBytes bounds what one Read returns from behind the tail
	// cache (one record always comes), below its MaxBytes: a lagging
	// reader gets many small answers instead of few large ones, so that
	// the work of one — the preads, its encoding, its send, the client's
	// decoding — is a short burst that leaves the processors to the tail's
	// readers and writers in between (RocketMQ bounds its pulls from disk
	// the same way, maxTransferBytesOnMessageInDisk). Default
	// DefaultColdReadMaxBytes; negative: only MaxBytes.
	ColdReadMaxBytes int

	// Now is the clock; default time.Now. Tests set it.
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	if o.FlushPolicy == "" {
		o.FlushPolicy = FlushAsync
	}
	if o.GroupCommitDelay == 0 {
		o.GroupCommitDelay = DefaultGroupCommitDelay
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = 500 * time.Millisecond
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = time.Second
	}
	if o.SegmentBytes == 0 {
		o.SegmentBytes = 1 << 30
	}
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = core.DefaultMaxMessageBytes
	}
	if o.MaxPropertiesBytes == 0 {
		o.MaxPropertiesBytes = 32 << 10
	}
	if o.DefaultQueues == 0 {
		o.DefaultQueues = 8
	}
	if o.ConsumeQueueFileEntries == 0 {
		o.ConsumeQueueFileEntries = 300_000
	}
	if o.IndexSlots == 0 {
		o.IndexSlots = 1 << 20
	}
	if o.IndexEntries == 0 {
		o.IndexEntries = 2 << 20
	}
	if o.Retention == 0 {
		o.Retention = 72 * time.Hour
	}
	if o.RetentionInterval == 0 {
		o.RetentionInterval = 10 * time.Second
	}
	if o.TailCacheBytes == 0 {
		o.TailCacheBytes = DefaultTailCacheBytes
	}
	if o.ReaderColdReadBytesPerSec == 0 {
		o.ReaderColdReadBytesPerSec = DefaultReaderColdReadBytesPerSec
	}
	if o.ColdReadMaxBytes == 0 {
		o.ColdReadMaxBytes = DefaultColdReadMaxBytes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.FlushPolicy != FlushAsync && o.FlushPolicy != FlushSync {
		bad("flush policy %q: want %q or %q", o.FlushPolicy, FlushAsync, FlushSync)
	}
	if o.FlushInterval < 0 || o.CheckpointInterval < 0 || o.RetentionInterval < 0 || o.Retention < 0 {
		bad("intervals and retention must be positive")
	}
	if o.SegmentBytes < 4<<10 {
		bad("segment bytes %d: at least 4096", o.SegmentBytes)
	}
	if o.MaxMessageBytes < recordMinLen || o.MaxMessageBytes > recordMaxLen {
		bad("max message bytes %d: want %d to %d", o.MaxMessageBytes, recordMinLen, recordMaxLen)
	}
	if int64(o.MaxMessageBytes) > o.SegmentBytes {
		bad("max message bytes %d larger than segment bytes %d", o.MaxMessageBytes, o.SegmentBytes)
	}
	if o.MaxPropertiesBytes < 0 || o.MaxPropertiesBytes > 0xFFFF {
		bad("max properties bytes %d: at most 65535", o.MaxPropertiesBytes)
	}
	if o.DefaultQueues < 1 || o.DefaultQueues > core.MaxQueues {
		bad("default queues %d: want 1 to %d", o.DefaultQueues, core.MaxQueues)
	}
	if o.ConsumeQueueFileEntries < 16 {
		bad("consume queue file entries %d: at least 16", o.ConsumeQueueFileEntries)
	}
	if o.IndexSlots < 16 || o.IndexEntries < 16 || o.IndexEntries > 1<<28 {
		bad("index slots %d and entries %d: at least 16, entries at most 2^28", o.IndexSlots, o.IndexEntries)
	}
	if o.MaxDiskBytes < 0 {
		bad("max disk bytes %d: negative", o.MaxDiskBytes)
	}
	if o.TailCacheBytes > 0 && o.TailCacheBytes < minTailCacheBytes {
		bad("tail cache bytes %d: at least %d (or negative: none)", o.TailCacheBytes, minTailCacheBytes)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return nil
}

// minTailCacheBytes is the smallest tail cache: 8 blocks of a page.
const minTailCacheBytes = 32 << 10

// DefaultTailCacheBytes is Options.TailCacheBytes's default: at 5,000
// msgs/s of 1 KiB, the last 25 s of the log.
const DefaultTailCacheBytes = 128 << 20

// DefaultReaderColdReadBytesPerSec is Options.ReaderColdReadBytesPerSec's
// default, 1.25 GiB/s: on the project's machine, whose disk reads 1.7–1.9
// GB/s sequentially (scripts/bench-disk.sh), one group alone may take
// 70–79 % of it and never all of it. Set it to about three quarters of
// your disk's sequential read rate.
const DefaultReaderColdReadBytesPerSec = 5 << 28

// DefaultColdReadMaxBytes is Options.ColdReadMaxBytes's default. Measured
// (docs/BENCHMARKS.md, "Lagging readers"): a group replaying a backlog at
// full speed raised a tail group's p99 delivery 16× with 4 MiB answers and
// 3.6× with 256 KiB ones, for a third less replay rate.
const DefaultColdReadMaxBytes = 256 << 10

// DefaultGroupCommitDelay is Options.GroupCommitDelay's default. Measured
// on the report's latency load (10 publishers, 5,000 QoS 1 msgs/s in all,
// --flush sync, docs/BENCHMARKS.md): against no wait, 200 µs makes a third
// of the fsyncs, 17–23 % less broker CPU, and halves the ack p99 (fewer
// fsyncs queue behind each other), for a p50 ~0.6 ms higher.
const DefaultGroupCommitDelay = 200 * time.Microsecond
