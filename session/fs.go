package session

import (
	"io"
	"os"
	"path/filepath"
)

// fsys is the little of a filesystem the session log uses, so that tests
// can put a filesystem under it that loses what was not synced (a power
// cut). osFS is the real one.
type fsys interface {
	MkdirAll(dir string) error
	ReadFile(name string) ([]byte, error)
	// OpenFile opens name for reading and writing, creating it when
	// missing.
	OpenFile(name string) (file, error)
	// Create creates or truncates name for reading and writing.
	Create(name string) (file, error)
	Rename(from, to string) error
	Remove(name string) error
	// SyncDir makes the entries of dir (creations, renames) durable.
	SyncDir(dir string) error
}

type file interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	Truncate(size int64) error
	Close() error
}

type osFS struct{}

func (osFS) MkdirAll(dir string) error            { return os.MkdirAll(dir, 0o755) }
func (osFS) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }
func (osFS) Rename(from, to string) error         { return os.Rename(from, to) }
func (osFS) Remove(name string) error             { return os.Remove(name) }

func (osFS) OpenFile(name string) (file, error) {
	return os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
}

func (osFS) Create(name string) (file, error) {
	return os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
}

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(filepath.Clean(dir))
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
