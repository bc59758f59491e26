package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"path/filepath"

	"github.com/ferrymq/ferrymq/core/store/vfs"
)

// Metadata files (store.meta, topics.meta, checkpoint, offsets.meta) share one
// envelope around a JSON document:
//
//	off  size  field
//	0    4     magic "FMQM"
//	4    1     version (1)
//	5    3     reserved, zero
//	8    4     length N of the JSON document
//	12   4     CRC-32C of the JSON document
//	16   N     JSON document
//
// They are replaced atomically: write name.tmp, fsync it, rename over name,
// fsync the directory. A reader therefore sees the old or the new document,
// never a mix.
const (
	metaMagic     uint32 = 0x464D514D // "FMQM"
	metaVersion          = 1
	metaHeaderLen        = 16
	metaMaxLen           = 64 << 20
)

func encodeMeta(v any) ([]byte, error) {
	doc, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	b := make([]byte, metaHeaderLen+len(doc))
	binary.BigEndian.PutUint32(b[0:], metaMagic)
	b[4] = metaVersion
	binary.BigEndian.PutUint32(b[8:], uint32(len(doc)))
	binary.BigEndian.PutUint32(b[12:], crc32.Checksum(doc, castagnoli))
	copy(b[metaHeaderLen:], doc)
	return b, nil
}

// decodeMeta validates the envelope (magic, version, length, CRC) and
// unmarshals the document into v.
func decodeMeta(b []byte, v any) error {
	if len(b) < metaHeaderLen {
		return fmt.Errorf("%w: %d bytes, shorter than the header", ErrBadMetadata, len(b))
	}
	if m := binary.BigEndian.Uint32(b); m != metaMagic {
		return fmt.Errorf("%w: bad magic %#08x", ErrBadMetadata, m)
	}
	if b[4] != metaVersion {
		return fmt.Errorf("%w: unknown version %d", ErrBadMetadata, b[4])
	}
	n := binary.BigEndian.Uint32(b[8:])
	if n > metaMaxLen || int(n) != len(b)-metaHeaderLen {
		return fmt.Errorf("%w: length %d, file holds %d", ErrBadMetadata, n, len(b)-metaHeaderLen)
	}
	doc := b[metaHeaderLen:]
	if want, got := binary.BigEndian.Uint32(b[12:]), crc32.Checksum(doc, castagnoli); want != got {
		return fmt.Errorf("%w: checksum %#08x, computed %#08x", ErrBadMetadata, want, got)
	}
	if err := json.Unmarshal(doc, v); err != nil {
		return fmt.Errorf("%w: %v", ErrBadMetadata, err)
	}
	return nil
}

// writeMeta atomically replaces dir/name with v.
func writeMeta(fsys vfs.FS, dir, name string, v any) error {
	b, err := encodeMeta(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", name, err)
	}
	path := filepath.Join(dir, name)
	tmp := path + ".tmp"
	f, err := fsys.OpenFile(tmp, osCreateTrunc, 0o644)
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", name, err)
	}
	if err := fsys.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", name, err)
	}
	if err := fsys.SyncDir(dir); err != nil {
		return fmt.Errorf("sync dir for %s: %w", name, err)
	}
	return nil
}

// readMeta reads dir/name into v; found is false if the file does not exist.
func readMeta(fsys vfs.FS, dir, name string, v any) (found bool, err error) {
	path := filepath.Join(dir, name)
	f, err := fsys.OpenFile(path, osReadOnly, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open %s: %w", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return true, fmt.Errorf("stat %s: %w", name, err)
	}
	if size > metaMaxLen+metaHeaderLen {
		return true, fmt.Errorf("%s: %w: %d bytes", name, ErrBadMetadata, size)
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return true, fmt.Errorf("read %s: %w", name, err)
	}
	if err := decodeMeta(b, v); err != nil {
		return true, fmt.Errorf("%s: %w", name, err)
	}
	return true, nil
}
