// Package store is ferrymq's embedded queue engine: a RocketMQ-style commit
// log with consume queues and a key index, in one data directory. It
// implements core.Broker.
//
// # Durability
//
// With FlushSync a Produce returns only after its record is fsynced, and
// concurrent producers share each fsync (group commit): a crash or power loss
// loses no acknowledged message. With FlushAsync a Produce returns once the
// record is in the operating system's page cache, and a background flush
// fsyncs every FlushInterval (500 ms): a process crash loses nothing
// acknowledged, a power loss at most the last FlushInterval of messages.
//
// # Layout of the data directory
//
//	LOCK                                   flock held while open
//	abort                                  present while open: its presence at Open means a crash
//	store.meta, topics.meta, offsets.meta  metadata (JSON in a checksummed envelope, see meta.go);
//	                                       store.meta fixes the format version and the
//	                                       consume-queue file size at creation
//	checkpoint                             log offset up to which consume queues and indexes are durable
//	commitlog/<20-digit base offset>       segments, at most SegmentBytes each
//	consumequeue/<topic>/<queue>/<20-digit first queue offset>  consume-queue files
//	index/<20-digit first log offset>      key-index files
//
// # Commit-log record (all integers big-endian)
//
//	off  size  field
//	0    4     magic 0x464D5152 ("FMQR")
//	4    1     version (1)
//	5    1     flags (0 in version 1)
//	6    2     reserved (0 in version 1)
//	8    4     record length L in bytes, header included; recordMinLen ≤ L ≤ recordMaxLen
//	12   4     CRC-32C (Castagnoli) of bytes [0,12) followed by [16,L)
//	16   8     commit-log offset of this record (self-check for resync)
//	24   8     queue offset
//	32   8     born time, unix ns
//	40   8     store time, unix ns; never decreases along the log
//	48   8     deliver-at, unix ns; 0 = immediate
//	56   8     tag hash (core.TagHash)
//	64   4     queue number
//	68   4     reconsume count
//	72   1+n   topic: u8 length, bytes
//	     2+n   sharding key: u16 length, bytes
//	     2+n   tag: u16 length, bytes
//	     2+n   properties: u16 block length, then (u16 len, name, u16 len, value)*
//	     2+n   keys: u16 block length, then (u16 len, key)*
//	     4+n   body: u32 length, bytes
//
// Decoders validate magic, then version, then flags and reserved bytes, then
// length bounds, then the CRC, and check every inner length against the
// record before slicing: a length field of 0x7FFFFFFF is refused without
// allocating. The field offsets and constants in record.go are part of the
// format.
//
// # Limits: the format's, not the run's
//
// A stored record is bounded by the format (recordMaxLen, 1 GiB, and its
// segment), never by Options. Options.MaxMessageBytes bounds new produces
// only (core.ErrMessageTooLarge); recovery, reads and Get accept whatever
// the format allows, so lowering the limit between runs — after a clean
// close or a crash — keeps every stored message served. Likewise
// SegmentBytes shapes new segments only, key-index files carry their own
// sizes in their headers, and the consume-queue file size is fixed in
// store.meta when the store is created.
//
// # How the format evolves
//
// store.meta names the directory's format (storeFormat, 1). A change an
// older binary could not read — a record kind in the flag bits, a field in
// the reserved bytes, another consume-queue entry — raises it, and Open in
// an older binary then refuses the directory with ErrNewerFormat rather
// than taking new records for damage and cutting them off. Within a format
// each field has one meaning: flags or reserved bytes that version 1 does
// not define make a record invalid, like a bad checksum. Additions older
// binaries may ignore go into the JSON metadata, whose unknown keys are
// ignored.
//
// A record never spans segments. Segments abut: each new segment starts at
// the offset where the previous one ended, and its file name is that offset.
// Only the active (last) segment is ever written; a segment is fsynced when
// it is sealed, so only the active one can have a torn tail.
//
// # Consume queues and the key index
//
// A consume queue holds one 20-byte entry per message of one (topic, queue):
// commit-log offset (8), record size (4), tag hash (8). Entry k describes the
// message at queue offset k, so reading from an offset is one seek. The key
// index (index.go) is a chain of hash files mapping (topic, key) to log
// offsets; every hit is confirmed against the log. Both are derived data,
// rebuilt from the log after a crash. Store times never decrease along the
// log, so a binary search over a consume queue finds the first message at or
// after a time (OffsetAt): the consume queue doubles as the time index.
//
// # Crash recovery
//
// Open finds the abort marker after a crash. Recovery starts from the
// checkpoint: consume-queue entries at or after it are dropped and rebuilt by
// replaying the log from there. A record that fails its checks at the end of
// the active segment with nothing valid after it is a torn tail and is cut
// off; a damaged record followed by valid ones is corruption: it is logged
// and skipped, and the records after it are kept. Reads never serve a damaged
// record: they return a *core.CorruptError for it.
//
// # Faults
//
// After a failed write or fsync (a full disk, an I/O error) the store
// refuses every further write with core.ErrStoreFailed, never acknowledges
// the failed batch, and cuts a partial write back off the file. Reads of
// acknowledged data go on. Reopen the store once the cause is fixed.
//
// # Reads
//
// Reads never go past the confirmed end of the log, and come from one of
// three places:
//
//   - The tail cache (Options.TailCacheBytes, default 128 MiB): the newest
//     bytes of the log, in memory of the store's own (an anonymous mapping,
//     off the Go heap), filled by the writer as it writes (write-through)
//     and at Open from the end of the log. Readers that keep up are served
//     from it without a system call, a page fault or the page cache, so
//     nothing another reader pulls through the page cache can slow them.
//     It is a ring of whole blocks (1 MiB) and gives up its oldest block
//     as the log grows; it never holds bytes of a segment retention
//     deleted.
//   - Cold reads: Read of records older than the tail cache. They go
//     through pread, not the mapping; the segment's file is advised
//     sequential and no-reuse, and after each Read the pages more than
//     16 MiB (dropBehindLag) behind what it read are dropped from the page
//     cache (posix_fadvise DONTNEED, drop-behind; in ranges cut at 2 MiB,
//     so that the kernel's large folios lie wholly in one), so a group
//     replaying a backlog larger than memory keeps about that much cached
//     instead of evicting the consume queues, indexes and pages everyone
//     else needs. The lag lets the members of a group, which read the
//     interleaved queues of a topic side by side, share what one of them
//     read. Cold bytes are charged first to the reader's budget
//     (core.ReadRequest.Reader, a token bucket of
//     Options.ReaderColdReadBytesPerSec each, and one of
//     Options.ColdReadBytesPerSec for all readers together if set): a
//     reader over it waits in its own Read (as long as its ctx allows),
//     never delaying a read from the tail cache or the writer. A cold Read
//     also yields its processor every 64 KiB, so that goroutines serving
//     the tail do not wait behind it for the scheduler's time slice.
//   - The segments' read-only mappings (mmap, shared): Get, FindByKey and
//     OffsetAt when the tail cache does not hold the bytes, and every read
//     when it is off (TailCacheBytes negative). A fault under a mapping (an
//     I/O error, a file cut behind the store's back) is turned into an
//     error for that read, never a crash. On a filesystem without mappings
//     (CrashFS) these use pread.
//
// Stats counts tail-cache hits and misses, cold reads and their bytes, and
// the Reads a budget delayed and for how long.
//
// # Concurrency
//
// A Store is safe for concurrent use. Open starts a writer goroutine (each
// cycle: one write call for everything producers appended since the last
// one, copied into the tail cache, then in FlushSync mode one fsync
// covering it), in FlushAsync mode a
// flusher goroutine (an fsync every FlushInterval, beside the writer), a
// checkpointer and a retention worker; Close stops them all and returns
// after they have ended.
package store
