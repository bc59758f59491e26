// Package vfs is the small filesystem interface the store writes through, so
// that tests can put a crashable, fault-injecting layer under the real code
// path. Default is the operating system's filesystem; NewCrashFS (crash.go) is
// an in-memory filesystem that remembers only what was synced and can fail any
// operation on demand.
//
// Paths are plain strings joined with path/filepath. Implementations are safe
// for concurrent use; a File is safe for concurrent ReadAt calls and for one
// writer.
package vfs

import (
	"fmt"
	"io"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FS is what the store needs of a filesystem.
type FS interface {
	// OpenFile opens name with os.O_* flags.
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	// Remove deletes a file or an empty directory.
	Remove(name string) error
	// RemoveAll deletes a directory tree.
	RemoveAll(name string) error
	// Rename moves oldname to newname, replacing newname atomically.
	Rename(oldname, newname string) error
	// MkdirAll creates a directory and its parents.
	MkdirAll(dir string, perm os.FileMode) error
	// ReadDir lists the names in dir, sorted.
	ReadDir(dir string) ([]string, error)
	// Stat describes a file.
	Stat(name string) (os.FileInfo, error)
	// SyncDir makes the directory's entries (creations, renames, removals)
	// durable.
	SyncDir(dir string) error
}

// File is an open file.
type File interface {
	io.ReaderAt
	io.Writer
	io.WriterAt
	io.Closer
	// Sync makes the file's data durable (fdatasync).
	Sync() error
	// Truncate changes the file's size.
	Truncate(size int64) error
	// Size returns the file's current size.
	Size() (int64, error)
	// Name returns the name the file was opened with.
	Name() string
}

// Default is the operating system's filesystem.
var Default FS = osFS{}

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Remove(name string) error                    { return os.Remove(name) }
func (osFS) RemoveAll(name string) error                 { return os.RemoveAll(name) }
func (osFS) Rename(o, n string) error                    { return os.Rename(o, n) }
func (osFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }
func (osFS) Stat(name string) (os.FileInfo, error)       { return os.Stat(name) }

func (osFS) ReadDir(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

type osFile struct{ *os.File }

// Sync uses fdatasync: the store never depends on file timestamps, and a
// size change is part of what fdatasync makes durable.
func (f osFile) Sync() error {
	rc, err := f.File.SyscallConn()
	if err != nil {
		return f.File.Sync()
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.File.Name(), Err: serr}
	}
	return nil
}

func (f osFile) Size() (int64, error) {
	st, err := f.File.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Mapper is implemented by files that can be mapped into memory for
// reading. The store maps commit-log segments so that reads copy straight
// from the page cache, without a system call per read.
type Mapper interface {
	// MapRead maps the first size bytes of the file read-only and shared,
	// so writes through the file are visible. size may exceed the file's
	// current length; reading past the end of the file faults.
	MapRead(size int64) ([]byte, error)
}

// Unmap releases a mapping returned by MapRead.
func Unmap(b []byte) error { return syscall.Munmap(b) }

func (f osFile) MapRead(size int64) ([]byte, error) {
	rc, err := f.File.SyscallConn()
	if err != nil {
		return nil, err
	}
	var b []byte
	var merr error
	if err := rc.Control(func(fd uintptr) {
		b, merr = syscall.Mmap(int(fd), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	}); err != nil {
		return nil, err
	}
	if merr != nil {
		return nil, &os.PathError{Op: "mmap", Path: f.File.Name(), Err: merr}
	}
	return b, nil
}

// Advice is a hint about how a range of a file will be used, passed to
// the kernel's posix_fadvise(2).
type Advice int

// The advice the store gives.
const (
	// AdviseSequential: the file is read sequentially (a larger
	// readahead window).
	AdviseSequential Advice = iota + 1
	// AdviseNoReuse: what is read is used once (pages read are not
	// promoted in the page cache's LRU; Linux 6.3 and later).
	AdviseNoReuse
	// AdviseDontNeed: the range will not be read again soon; its clean
	// pages may leave the page cache now (dirty ones are only queued for
	// writeback).
	AdviseDontNeed
)

// Advisor is implemented by files that take access-pattern hints. Advice
// never changes what a read returns; a file without it ignores them.
type Advisor interface {
	// Advise gives advice about the n bytes at off (n 0: to the end of the
	// file).
	Advise(off, n int64, advice Advice) error
}

func (f osFile) Advise(off, n int64, advice Advice) error {
	var a int
	switch advice {
	case AdviseSequential:
		a = unix.FADV_SEQUENTIAL
	case AdviseNoReuse:
		a = unix.FADV_NOREUSE
	case AdviseDontNeed:
		a = unix.FADV_DONTNEED
	default:
		return fmt.Errorf("vfs: unknown advice %d", advice)
	}
	rc, err := f.File.SyscallConn()
	if err != nil {
		return err
	}
	var aerr error
	if err := rc.Control(func(fd uintptr) { aerr = unix.Fadvise(int(fd), off, n, a) }); err != nil {
		return err
	}
	if aerr != nil {
		return &os.PathError{Op: "fadvise", Path: f.File.Name(), Err: aerr}
	}
	return nil
}

// DirectOpener is implemented by filesystems that can open a file for
// reads that go around the page cache (O_DIRECT): the disk's data lands in
// the caller's buffer without a copy, and nothing read evicts anything
// else. The store's cold reads of dense runs use it.
type DirectOpener interface {
	// OpenDirect opens name read-only for direct reads. Its ReadAt needs
	// a buffer, offset and length aligned to DirectAlign (AlignedBuffer
	// makes one); a filesystem that refuses direct IO fails the open.
	OpenDirect(name string) (DirectFile, error)
}

// DirectFile is a file opened by OpenDirect.
type DirectFile interface {
	io.ReaderAt
	io.Closer
}

// DirectAlign is the alignment direct reads keep: the page size, which
// covers every logical block size Linux filesystems use.
const DirectAlign = 4096

func (osFS) OpenDirect(name string) (DirectFile, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// AlignedBuffer returns n bytes whose first byte is at a multiple of
// DirectAlign in memory.
func AlignedBuffer(n int) []byte {
	b := make([]byte, n+DirectAlign)
	shift := (DirectAlign - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%DirectAlign)) % DirectAlign
	return b[shift : shift+n : shift+n]
}
