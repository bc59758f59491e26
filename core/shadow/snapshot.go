package shadow

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// The snapshot file of the embedded backend (OpenLog), dir/SnapshotFile:
//
//	offset  size  field
//	0       4     magic "FMSH"
//	4       2     format version, 1
//	6       2     flags, 0
//	8       4     body length n (≤ maxSnapshotBody)
//	12      4     CRC-32C (Castagnoli) of the body
//	16      n     body: JSON snapshotBody
//
// Big-endian. The body holds every device's latest event (deletes too:
// versions go on after a delete) and, per queue of Topic, the offset up
// to which the events are in it: Open reads the topic from there on.
// These constants are part of the format.
const (
	SnapshotFile    = "snapshot"
	snapshotMagic   = "FMSH"
	snapshotVersion = 1
	snapshotHeader  = 16
	maxSnapshotBody = 1 << 34 // 16 GiB: a bound, not a goal
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// snapshotBody is a snapshot's JSON.
type snapshotBody struct {
	Topic string `json:"topic"`
	// Offsets[q]: the events of queue q below it are in Shadows.
	Offsets []int64  `json:"offsets"`
	Shadows []*Event `json:"shadows"`
}

// encodeSnapshot returns the file's bytes.
func encodeSnapshot(b *snapshotBody) ([]byte, error) {
	body, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot: %w", err)
	}
	out := make([]byte, snapshotHeader, snapshotHeader+len(body))
	copy(out, snapshotMagic)
	be := binary.BigEndian
	be.PutUint16(out[4:], snapshotVersion)
	putLenCRC(out[8:], body)
	return append(out, body...), nil
}

// putLenCRC writes body's length and CRC into the 8 bytes of dst.
func putLenCRC(dst, body []byte) {
	binary.BigEndian.PutUint32(dst, uint32(len(body)))
	binary.BigEndian.PutUint32(dst[4:], crc32.Checksum(body, castagnoli))
}

// decodeSnapshot checks and decodes a snapshot file's bytes: magic,
// version, length, CRC, then every event. Errors wrap ErrCorrupt.
func decodeSnapshot(b []byte) (*snapshotBody, error) {
	be := binary.BigEndian
	switch {
	case len(b) < snapshotHeader || string(b[:4]) != snapshotMagic:
		return nil, fmt.Errorf("%w: snapshot: bad magic", ErrCorrupt)
	case be.Uint16(b[4:]) != snapshotVersion:
		return nil, fmt.Errorf("%w: snapshot: format version %d, want %d", ErrCorrupt, be.Uint16(b[4:]), snapshotVersion)
	case int64(be.Uint32(b[8:])) != int64(len(b)-snapshotHeader):
		return nil, fmt.Errorf("%w: snapshot: body of %d bytes, header says %d", ErrCorrupt, len(b)-snapshotHeader, be.Uint32(b[8:]))
	}
	body := b[snapshotHeader:]
	if crc32.Checksum(body, castagnoli) != be.Uint32(b[12:]) {
		return nil, fmt.Errorf("%w: snapshot: CRC mismatch", ErrCorrupt)
	}
	var raw struct {
		Topic   string            `json:"topic"`
		Offsets []int64           `json:"offsets"`
		Shadows []json.RawMessage `json:"shadows"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("%w: snapshot: %s", ErrCorrupt, jsonProblem(err))
	}
	out := &snapshotBody{Topic: raw.Topic, Offsets: raw.Offsets, Shadows: make([]*Event, 0, len(raw.Shadows))}
	for i, o := range raw.Offsets {
		if o < 0 {
			return nil, fmt.Errorf("%w: snapshot: queue %d at offset %d", ErrCorrupt, i, o)
		}
	}
	for _, r := range raw.Shadows {
		ev, err := DecodeEvent(r)
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		out.Shadows = append(out.Shadows, ev)
	}
	return out, nil
}

// readSnapshot reads dir's snapshot; nil, nil when there is none.
func readSnapshot(dir string) (*snapshotBody, error) {
	b, err := os.ReadFile(filepath.Join(dir, SnapshotFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	return decodeSnapshot(b)
}

// writeSnapshot replaces dir's snapshot atomically: a temporary file,
// fsynced, renamed over the old one, and the folder fsynced.
func writeSnapshot(dir string, s *snapshotBody) error {
	b, err := encodeSnapshot(s)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, SnapshotFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Sync()
	}
	if err := errors.Join(werr, f.Close()); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write snapshot: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, SnapshotFile)); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
