package session

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// memFS is an in-memory filesystem that can lose power: crash keeps of
// each file only what was synced (and, to model a partial write-back, a
// prefix of what was appended after), and of the folder only the entries
// synced by SyncDir. failAfter makes every mutating call after that many
// fail with EIO, to stop a sequence of writes at any point.
type memFS struct {
	mu      sync.Mutex
	names   map[string]*memFile // the folder as the process sees it
	durable map[string]*memFile // the folder as the disk has it
	ops     int                 // mutating calls made
	fail    int                 // fail the mutating calls after this many; <0 never
}

type memFile struct {
	data   []byte
	synced []byte
}

func newMemFS() *memFS {
	return &memFS{names: map[string]*memFile{}, durable: map[string]*memFile{}, fail: -1}
}

// op counts a mutating call and reports whether it fails.
func (m *memFS) op() error {
	m.ops++
	if m.fail >= 0 && m.ops > m.fail {
		return syscall.EIO
	}
	return nil
}

// crash is a power cut: what was not synced is gone, but keep bytes of
// each file's unsynced tail.
func (m *memFS) crash(keep int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := map[string]*memFile{}
	for name, f := range m.durable {
		d := append([]byte(nil), f.synced...)
		if len(f.data) > len(f.synced) && string(f.data[:len(f.synced)]) == string(f.synced) {
			d = append(d, f.data[len(f.synced):min(len(f.data), len(f.synced)+keep)]...)
		}
		names[name] = &memFile{data: d, synced: append([]byte(nil), d...)}
	}
	m.names = names
	m.durable = map[string]*memFile{}
	for k, v := range names {
		m.durable[k] = v
	}
	m.fail, m.ops = -1, 0
}

func (m *memFS) MkdirAll(string) error { return nil }

func (m *memFS) ReadFile(name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.names[filepath.Clean(name)]
	if f == nil {
		return nil, os.ErrNotExist
	}
	return append([]byte(nil), f.data...), nil
}

func (m *memFS) OpenFile(name string) (file, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name = filepath.Clean(name)
	if f := m.names[name]; f != nil {
		return &memHandle{fs: m, f: f}, nil
	}
	if err := m.op(); err != nil {
		return nil, err
	}
	f := &memFile{}
	m.names[name] = f
	return &memHandle{fs: m, f: f}, nil
}

func (m *memFS) Create(name string) (file, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.op(); err != nil {
		return nil, err
	}
	f := &memFile{}
	m.names[filepath.Clean(name)] = f
	return &memHandle{fs: m, f: f}, nil
}

func (m *memFS) Rename(from, to string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.op(); err != nil {
		return err
	}
	f := m.names[filepath.Clean(from)]
	if f == nil {
		return os.ErrNotExist
	}
	delete(m.names, filepath.Clean(from))
	m.names[filepath.Clean(to)] = f
	return nil
}

func (m *memFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.op(); err != nil {
		return err
	}
	delete(m.names, filepath.Clean(name))
	return nil
}

func (m *memFS) SyncDir(string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.op(); err != nil {
		return err
	}
	m.durable = map[string]*memFile{}
	for k, v := range m.names {
		m.durable[k] = v
	}
	return nil
}

type memHandle struct {
	fs     *memFS
	f      *memFile
	closed bool
}

func (h *memHandle) ReadAt(b []byte, off int64) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if h.closed {
		return 0, os.ErrClosed
	}
	if off >= int64(len(h.f.data)) {
		return 0, io.EOF
	}
	n := copy(b, h.f.data[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (h *memHandle) WriteAt(b []byte, off int64) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if h.closed {
		return 0, os.ErrClosed
	}
	if err := h.fs.op(); err != nil {
		return 0, err
	}
	if end := off + int64(len(b)); end > int64(len(h.f.data)) {
		h.f.data = append(h.f.data, make([]byte, end-int64(len(h.f.data)))...)
	}
	copy(h.f.data[off:], b)
	return len(b), nil
}

func (h *memHandle) Sync() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if h.closed {
		return os.ErrClosed
	}
	if err := h.fs.op(); err != nil {
		return err
	}
	h.f.synced = append(h.f.synced[:0], h.f.data...)
	return nil
}

func (h *memHandle) Truncate(size int64) error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.fs.op(); err != nil {
		return err
	}
	if size < int64(len(h.f.data)) {
		h.f.data = h.f.data[:size]
	}
	return nil
}

func (h *memHandle) Close() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if h.closed {
		return errors.New("closed twice")
	}
	h.closed = true
	return nil
}
