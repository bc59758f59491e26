package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// The seed corpora live in testdata/fuzz/FuzzDecodeRecord and
// testdata/fuzz/FuzzDecodeMeta: valid inputs, truncated ones, absurd lengths,
// bad checksums, nothing at all.

// FuzzDecodeRecord feeds arbitrary bytes to the record decoder. It must never
// panic; checkRecord and decodeRecord must agree; and whatever decodes must
// re-encode to a record that decodes to the same message.
//
// The checksum guards everything behind the header, so random bytes almost
// never get past it. Each input is therefore also tried with magic, version
// and checksum repaired, and again with the length field set to the input's
// length as well: the fuzzer then explores the field decoding.
func FuzzDecodeRecord(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzRecord(t, b)
		if len(b) < recordMinLen {
			return
		}
		fixed := append([]byte(nil), b...)
		binary.BigEndian.PutUint32(fixed[offMagic:], recordMagic)
		fixed[offVersion] = recordVersion
		if n := int(binary.BigEndian.Uint32(fixed[offLength:])); n >= recordMinLen && n <= len(fixed) {
			binary.BigEndian.PutUint32(fixed[offCRC:], recordCRC(fixed[:n]))
			fuzzRecord(t, fixed)
		}
		binary.BigEndian.PutUint32(fixed[offLength:], uint32(len(fixed)))
		binary.BigEndian.PutUint32(fixed[offCRC:], recordCRC(fixed))
		fuzzRecord(t, fixed)
	})
}

func fuzzRecord(t *testing.T, b []byte) {
	t.Helper()
	meta, cerr := checkRecord(b)
	m, err := decodeRecord(b, 0xABCDEF)
	if (cerr == nil) != (err == nil) {
		t.Fatalf("checkRecord: %v, decodeRecord: %v", cerr, err)
	}
	if err != nil {
		if !errors.Is(err, errBadRecord) && !errors.Is(err, errShort) {
			t.Fatalf("error wraps neither errBadRecord nor errShort: %v", err)
		}
		return
	}

	// What checkRecord reports agrees with the decoded message.
	if meta.size != m.Size || meta.clOffset != m.CommitLogOffset || meta.queueOffset != m.QueueOffset ||
		meta.queue != m.Queue || meta.storedAt != m.StoredAt.UnixNano() ||
		string(meta.topic) != m.Topic || string(meta.shardingKey) != m.ShardingKey {
		t.Fatalf("checkRecord %+v disagrees with decodeRecord %+v", meta, m)
	}
	if m.ID != core.NewCommitLogID(0xABCDEF, m.CommitLogOffset, m.Size) {
		t.Fatalf("ID %s does not name offset %d size %d", m.ID, m.CommitLogOffset, m.Size)
	}
	if m.Size > len(b) || m.Topic == "" || m.CommitLogOffset < 0 || m.QueueOffset < 0 || m.Queue > 0xFFFF {
		t.Fatalf("decoded an out-of-range message %+v from %d bytes", m, len(b))
	}
	for k := range m.Properties {
		if k == "" {
			t.Fatal("decoded an empty property name")
		}
	}
	if slices.Contains(m.Keys, "") {
		t.Fatal("decoded an empty key")
	}

	// Re-encode. Duplicate property names collapse in the map, so the
	// new record may be shorter, never longer.
	in := m.Message
	n, err := encodedLen(&in, 2*0xFFFF)
	if err != nil {
		t.Fatalf("decoded message does not re-encode: %v", err)
	}
	if n > m.Size {
		t.Fatalf("re-encoded record is %d bytes, the original %d", n, m.Size)
	}
	rec := appendRecord(nil, &in, n, time.Now().UnixNano())
	sealRecord(rec, m.CommitLogOffset, m.QueueOffset, m.StoredAt.UnixNano(), m.Queue)
	if _, err := checkRecord(rec); err != nil {
		t.Fatalf("re-encoded record rejected: %v", err)
	}
	m2, err := decodeRecord(rec, 0xABCDEF)
	if err != nil {
		t.Fatalf("re-encoded record does not decode: %v", err)
	}
	if m2.Topic != m.Topic || m2.ShardingKey != m.ShardingKey || m2.Tag != m.Tag ||
		!slices.Equal(m2.Keys, m.Keys) || !maps.Equal(m2.Properties, m.Properties) ||
		!bytes.Equal(m2.Body, m.Body) ||
		m2.CommitLogOffset != m.CommitLogOffset || m2.QueueOffset != m.QueueOffset || m2.Queue != m.Queue ||
		!m2.StoredAt.Equal(m.StoredAt) || !m2.BornAt.Equal(m.BornAt) || !m2.DeliverAt.Equal(m.DeliverAt) ||
		m2.ReconsumeCount != m.ReconsumeCount || m2.Size != n {
		t.Fatalf("round trip changed the message:\n  was %+v\n  now %+v", m, m2)
	}
}

// TestFuzzSeeds keeps the committed seed corpora honest: the seeds named
// valid-* decode, the others are refused.
func TestFuzzSeeds(t *testing.T) {
	for _, target := range []string{"FuzzDecodeRecord", "FuzzDecodeMeta"} {
		dir := filepath.Join("testdata", "fuzz", target)
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.NotEmpty(t, ents)
		for _, e := range ents {
			raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
			require.NoError(t, err)
			text, ok := strings.CutPrefix(string(raw), "go test fuzz v1\n[]byte(")
			require.True(t, ok, "%s/%s: not a corpus file", target, e.Name())
			text, ok = strings.CutSuffix(text, ")\n")
			require.True(t, ok, "%s/%s: not a corpus file", target, e.Name())
			s, err := strconv.Unquote(text)
			require.NoError(t, err, "%s/%s", target, e.Name())
			b := []byte(s)
			if target == "FuzzDecodeRecord" {
				_, err = decodeRecord(b, 1)
			} else {
				// A valid envelope holds one kind of document: it is
				// valid if it decodes as any of them.
				var cp checkpointMeta
				var topics []topicMeta
				var offs []offsetRecord
				err = decodeMeta(b, &cp)
				for _, v := range []any{&topics, &offs} {
					if err != nil {
						err = decodeMeta(b, v)
					}
				}
			}
			if strings.HasPrefix(e.Name(), "valid-") {
				require.NoError(t, err, "%s/%s", target, e.Name())
			} else {
				require.Error(t, err, "%s/%s", target, e.Name())
			}
		}
	}
}

// FuzzDecodeMeta feeds arbitrary bytes to the metadata decoder with each kind
// of document the store keeps. It must never panic, errors must wrap
// ErrBadMetadata, and what decodes must re-encode to the same bytes after one
// normalising round trip. As for records, each input is also tried with its
// envelope repaired, so that the JSON documents get explored too.
func FuzzDecodeMeta(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzMeta(t, b)
		if len(b) < metaHeaderLen {
			return
		}
		fixed := append([]byte(nil), b...)
		binary.BigEndian.PutUint32(fixed, metaMagic)
		fixed[4] = metaVersion
		binary.BigEndian.PutUint32(fixed[8:], uint32(len(fixed)-metaHeaderLen))
		binary.BigEndian.PutUint32(fixed[12:], crc32.Checksum(fixed[metaHeaderLen:], castagnoli))
		fuzzMeta(t, fixed)
	})
}

func fuzzMeta(t *testing.T, b []byte) {
	t.Helper()
	fuzzMetaAs[checkpointMeta](t, b)
	fuzzMetaAs[[]topicMeta](t, b)
	fuzzMetaAs[storeMeta](t, b)
	fuzzMetaAs[[]offsetRecord](t, b)
}

func fuzzMetaAs[T any](t *testing.T, b []byte) {
	t.Helper()
	var v T
	if err := decodeMeta(b, &v); err != nil {
		if !errors.Is(err, ErrBadMetadata) {
			t.Fatalf("%T: error does not wrap ErrBadMetadata: %v", v, err)
		}
		return
	}
	enc, err := encodeMeta(v)
	if err != nil {
		return // e.g. a time JSON can parse but not print (year 10000)
	}
	var v2 T
	if err := decodeMeta(enc, &v2); err != nil {
		t.Fatalf("%T: re-encoded document rejected: %v", v, err)
	}
	enc2, err := encodeMeta(v2)
	if err != nil {
		t.Fatalf("%T: second encode: %v", v, err)
	}
	if !bytes.Equal(enc, enc2) {
		t.Fatalf("%T: encoding not stable:\n  %q\n  %q", v, enc, enc2)
	}
}
