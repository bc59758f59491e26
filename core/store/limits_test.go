package store

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// The runtime limits of Options bound what new produces may write; they never
// decide whether data already stored is valid. These tests lower or change
// each such option between two runs, after a crash and after a clean close,
// and check that every acknowledged message is still served, in order.

// limitMsgs are produced in this order under one sharding key (one queue):
// small, large, large. With 64 KiB segments the second large record does not
// fit behind the first, so the first large one ends up in a sealed segment
// (where a bad record is "corruption, skipped") and the second at the end of
// the active one (where it is "a torn tail, cut").
func limitMsgs() []*core.Message {
	body := func(n int, fill byte) []byte { return bytes.Repeat([]byte{fill}, n) }
	return []*core.Message{
		{Topic: "t", ShardingKey: "car-42", Body: []byte("small")},
		{Topic: "t", ShardingKey: "car-42", Body: body(32<<10, 'a')},
		{Topic: "t", ShardingKey: "car-42", Body: body(32<<10, 'b')},
	}
}

func limitOptions(fsys vfs.FS, maxMsg int) Options {
	return Options{FS: fsys, FlushPolicy: FlushSync, DefaultQueues: 1, SegmentBytes: 64 << 10,
		MaxMessageBytes: maxMsg, IndexSlots: 64, IndexEntries: 4096}
}

// TestLoweredMessageLimitKeepsStoredMessages is issue #19's scenario: open
// with a 64 KiB limit and FlushSync, produce a 5-byte and 32 KiB messages
// (acknowledged after fsync), then reopen with an 8 KiB limit — after a crash
// (only synced bytes survive) and after a clean close. Every message must be
// served by ID and by queue, in order, and a new 32 KiB produce is refused.
func TestLoweredMessageLimitKeepsStoredMessages(t *testing.T) {
	for _, crash := range []bool{true, false} {
		name := map[bool]string{true: "crash", false: "clean restart"}[crash]
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			fsys := vfs.NewCrashFS()
			s, err := Open("/data", limitOptions(fsys, 64<<10))
			require.NoError(t, err)
			var acked []core.SendResult
			for _, m := range limitMsgs() {
				r, err := s.Produce(ctx, m)
				require.NoError(t, err)
				acked = append(acked, r)
			}
			require.Greater(t, len(s.cl.segmentList()), 1, "the first large record must sit in a sealed segment")
			reopenFS := fsys
			if crash {
				reopenFS = fsys.CrashClone()
			}
			require.NoError(t, s.Close())

			s2, err := Open("/data", limitOptions(reopenFS, 8<<10))
			require.NoError(t, err)
			defer s2.Close()
			want := limitMsgs()
			for i, r := range acked {
				m, err := s2.Get(ctx, r.ID)
				require.NoError(t, err, "message %d (%d bytes) after reopening with a lower limit", i, len(want[i].Body))
				require.Equal(t, want[i].Body, m.Body)
			}
			got := readAll(t, s2, "t", 0)
			require.Len(t, got, len(want))
			for i, m := range got {
				require.Equal(t, int64(i), m.QueueOffset)
				require.Equal(t, want[i].Body, m.Body, "queue order")
			}

			_, err = s2.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "car-42", Body: bytes.Repeat([]byte{'c'}, 32<<10)})
			require.ErrorIs(t, err, core.ErrMessageTooLarge)
			require.ErrorContains(t, err, "limit 8192")
			r, err := s2.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "car-42", Body: []byte("after")})
			require.NoError(t, err)
			require.Equal(t, int64(len(want)), r.QueueOffset, "the new message queues behind the old ones")
		})
	}
}

// TestConsumeQueueFileEntriesFixedAtCreation changes the consume-queue file
// size between runs (smaller, larger, back): the layout of the files already
// written is kept, so every message stays readable and new ones go on.
func TestConsumeQueueFileEntriesFixedAtCreation(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	opts := func(perFile int) Options {
		return Options{DefaultQueues: 1, ConsumeQueueFileEntries: perFile, IndexSlots: 64, IndexEntries: 4096}
	}
	n := 0
	for _, perFile := range []int{16, 1000, 16, 17} {
		s, err := Open(dir, opts(perFile))
		require.NoError(t, err)
		for range 40 {
			_, err := s.Produce(ctx, msg("t", "k", n))
			require.NoError(t, err)
			n++
		}
		got := readAll(t, s, "t", 0)
		require.Len(t, got, n, "with %d entries per file configured", perFile)
		for i, m := range got {
			require.Equal(t, int64(i), m.QueueOffset)
		}
		require.NoError(t, s.Close())
	}
	files, err := vfs.Default.ReadDir(filepath.Join(dir, dirConsumeQueue, "t", "0"))
	require.NoError(t, err)
	require.Len(t, files, (n+15)/16, "every file holds the 16 entries fixed at creation")
}

// TestNewerFormatIsRefused: a data directory whose store.meta names a format
// this binary does not know is left alone, with an error that says so.
func TestNewerFormatIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	_, err := s.Produce(t.Context(), msg("t", "k", 1))
	require.NoError(t, err)
	require.NoError(t, s.Close())

	var meta storeMeta
	_, err = readMeta(vfs.Default, dir, fileStoreMeta, &meta)
	require.NoError(t, err)
	require.Equal(t, 1, meta.Format, "a store never resized stays format 1")
	meta.Format = storeFormat + 1
	require.NoError(t, writeMeta(vfs.Default, dir, fileStoreMeta, meta))

	_, err = Open(dir, Options{})
	require.ErrorIs(t, err, ErrNewerFormat)
}

// TestRecordLargerThanTheRecoveryWindow: recovery reads the log in windows
// of replayWindow bytes and widens one for a record longer than that; a
// crash after such a record keeps it and what follows it.
func TestRecordLargerThanTheRecoveryWindow(t *testing.T) {
	ctx := t.Context()
	fsys := vfs.NewCrashFS()
	opts := Options{FS: fsys, FlushPolicy: FlushSync, DefaultQueues: 1, SegmentBytes: 64 << 20,
		MaxMessageBytes: replayWindow + 4<<20, IndexSlots: 64, IndexEntries: 4096}
	s, err := Open("/data", opts)
	require.NoError(t, err)
	big := bytes.Repeat([]byte{'x'}, replayWindow+1<<20)
	for _, b := range [][]byte{[]byte("before"), big, []byte("after")} {
		_, err := s.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k", Body: b})
		require.NoError(t, err)
	}
	crashed := fsys.CrashClone()
	require.NoError(t, s.Close())

	opts.FS = crashed
	s2, err := Open("/data", opts)
	require.NoError(t, err)
	defer s2.Close()
	got := readAll(t, s2, "t", 0)
	require.Len(t, got, 3)
	require.Equal(t, "before", string(got[0].Body))
	require.Equal(t, big, got[1].Body)
	require.Equal(t, "after", string(got[2].Body))
}

// TestDefaultMessageLimitEdges: with the default options a record of
// exactly core.DefaultMaxMessageBytes is stored and one byte more is
// refused with core.ErrMessageTooLarge naming both sizes and the setting;
// the store goes on, and a reopen (real files) serves what was stored.
func TestDefaultMessageLimitEdges(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	s, err := Open(dir, Options{DefaultQueues: 1})
	require.NoError(t, err)
	sized := func(record int, fill byte) *core.Message {
		m := &core.Message{Topic: "t", ShardingKey: "car-42", Properties: map[string]string{"mqtt.topic": "cars/42/cmd"}}
		n, err := encodedLen(m, 0xFFFF)
		require.NoError(t, err)
		m.Body = bytes.Repeat([]byte{fill}, record-n)
		return m
	}
	atLimit := sized(core.DefaultMaxMessageBytes, 'a')
	require.Greater(t, len(atLimit.Body), core.MaxBodyBytes)
	r, err := s.Produce(ctx, atLimit)
	require.NoError(t, err)

	_, err = s.Produce(ctx, sized(core.DefaultMaxMessageBytes+1, 'b'))
	require.ErrorIs(t, err, core.ErrMessageTooLarge)
	require.EqualError(t, err, "core: message too large: 4456449 bytes stored, limit 4456448 (store.max_message_bytes)")

	_, err = s.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "car-42", Body: []byte("after")})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s2 := openT(t, dir, Options{DefaultQueues: 1})
	got, err := s2.Get(ctx, r.ID)
	require.NoError(t, err)
	require.True(t, bytes.Equal(atLimit.Body, got.Body))
	require.Equal(t, core.DefaultMaxMessageBytes, got.Size)
	all := readAll(t, s2, "t", 0)
	require.Len(t, all, 2, "the refused message left nothing")
	require.Equal(t, "after", string(all[1].Body))
}

// TestIdleWriterKeepsNoLargeBuffer: a 4 MiB record gets a chunk buffer of
// its own, kept while such records keep coming; once none came for a
// checkpoint interval, neither of the writer's batches keeps a buffer
// larger than chunkBytes.
func TestIdleWriterKeepsNoLargeBuffer(t *testing.T) {
	s := openT(t, "", Options{DefaultQueues: 1, CheckpointInterval: 20 * time.Millisecond})
	for range 3 {
		_, err := s.Produce(t.Context(), &core.Message{Topic: "t", Body: make([]byte, core.MaxBodyBytes)})
		require.NoError(t, err)
	}
	largest := func() int {
		s.appendMu.Lock()
		defer s.appendMu.Unlock()
		n := 0
		for _, b := range []*batch{s.pend, s.spare} {
			if b == nil {
				continue
			}
			for _, c := range b.chunks[:cap(b.chunks)] {
				n = max(n, cap(c.buf))
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return largest() <= chunkBytes }, 5*time.Second, time.Millisecond,
		"a buffer of %d bytes kept", largest())
}
