package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Op names an operation of CrashFS for fault injection.
type Op string

// The operations an InjectFunc sees.
const (
	OpOpen     Op = "open"
	OpWrite    Op = "write"
	OpSync     Op = "sync"
	OpSyncDir  Op = "syncdir"
	OpRename   Op = "rename"
	OpRemove   Op = "remove"
	OpTruncate Op = "truncate"
	OpRead     Op = "read"
)

// InjectFunc decides whether an operation on path fails. For OpWrite, n is
// the number of bytes asked to be written; returning a short count k < n
// with an error writes only the first k bytes (a torn write). For other ops n
// is 0 and only the error counts.
type InjectFunc func(op Op, path string, n int) (k int, err error)

// ErrInjected is a convenient error for InjectFunc to return.
var ErrInjected = errors.New("vfs: injected fault")

// CrashFS is an in-memory filesystem that simulates power loss: Crash()
// throws away every byte and every directory change that was not synced, the
// way a machine that loses power does. It stands in for a disk in tests,
// because a real one cannot be made to lose power here.
//
// It is strict like pebble's MemFS in strict mode: a new file's directory
// entry survives a crash only after SyncDir of its directory, and a file's
// contents only after Sync.
type CrashFS struct {
	mu     sync.Mutex
	dirs   map[string]*memDir
	inject InjectFunc
}

type memDir struct {
	live   map[string]*memNode
	synced map[string]*memNode
}

type memNode struct {
	mu     sync.Mutex
	data   []byte
	synced []byte
	mtime  time.Time
}

// NewCrashFS returns an empty CrashFS with a root directory.
func NewCrashFS() *CrashFS {
	c := &CrashFS{dirs: map[string]*memDir{}}
	c.dirs["/"] = &memDir{live: map[string]*memNode{}, synced: map[string]*memNode{}}
	return c
}

// SetInject installs (or, with nil, removes) a fault-injection function.
func (c *CrashFS) SetInject(f InjectFunc) {
	c.mu.Lock()
	c.inject = f
	c.mu.Unlock()
}

func (c *CrashFS) check(op Op, path string, n int) (int, error) {
	c.mu.Lock()
	f := c.inject
	c.mu.Unlock()
	if f == nil {
		return n, nil
	}
	return f(op, path, n)
}

// Crash simulates power loss: every file returns to its last synced contents
// and every directory to its last synced entries. Open handles keep working
// on the surviving state, but a store should be reopened after a crash.
func (c *CrashFS) Crash() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.dirs {
		d.live = make(map[string]*memNode, len(d.synced))
		for name, n := range d.synced {
			d.live[name] = n
		}
	}
	for _, d := range c.dirs {
		for _, n := range d.live {
			n.mu.Lock()
			n.data = append([]byte(nil), n.synced...)
			n.mu.Unlock()
		}
	}
}

func clean(p string) string {
	p = filepath.Clean("/" + p)
	return p
}

func split(p string) (dir, name string) {
	p = clean(p)
	return filepath.Dir(p), filepath.Base(p)
}

func (c *CrashFS) dirLocked(dir string) (*memDir, error) {
	d, ok := c.dirs[clean(dir)]
	if !ok {
		return nil, &os.PathError{Op: "open", Path: dir, Err: fs.ErrNotExist}
	}
	return d, nil
}

// OpenFile implements FS.
func (c *CrashFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if _, err := c.check(OpOpen, name, 0); err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	dir, base := split(name)
	d, err := c.dirLocked(dir)
	if err != nil {
		return nil, err
	}
	n, ok := d.live[base]
	switch {
	case !ok && flag&os.O_CREATE == 0:
		return nil, &os.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	case ok && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, &os.PathError{Op: "open", Path: name, Err: fs.ErrExist}
	case !ok:
		n = &memNode{mtime: time.Now()}
		d.live[base] = n
	}
	if flag&os.O_TRUNC != 0 {
		n.mu.Lock()
		n.data = n.data[:0]
		n.mu.Unlock()
	}
	return &memFile{fs: c, node: n, name: name, append: flag&os.O_APPEND != 0, readOnly: flag&(os.O_WRONLY|os.O_RDWR) == 0}, nil
}

// Remove implements FS.
func (c *CrashFS) Remove(name string) error {
	if _, err := c.check(OpRemove, name, 0); err != nil {
		return &os.PathError{Op: "remove", Path: name, Err: err}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := clean(name)
	if d, ok := c.dirs[p]; ok {
		if len(d.live) > 0 {
			return &os.PathError{Op: "remove", Path: name, Err: errors.New("directory not empty")}
		}
		delete(c.dirs, p)
		pd, base := split(p)
		if parent, err := c.dirLocked(pd); err == nil {
			delete(parent.live, base)
		}
		return nil
	}
	dir, base := split(name)
	d, err := c.dirLocked(dir)
	if err != nil {
		return err
	}
	if _, ok := d.live[base]; !ok {
		return &os.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	delete(d.live, base)
	return nil
}

// RemoveAll implements FS.
func (c *CrashFS) RemoveAll(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := clean(name)
	for k := range c.dirs {
		if k == p || strings.HasPrefix(k, p+"/") {
			delete(c.dirs, k)
		}
	}
	pd, base := split(p)
	if parent, err := c.dirLocked(pd); err == nil {
		delete(parent.live, base)
	}
	return nil
}

// Rename implements FS.
func (c *CrashFS) Rename(oldname, newname string) error {
	if _, err := c.check(OpRename, oldname, 0); err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	od, ob := split(oldname)
	nd, nb := split(newname)
	odir, err := c.dirLocked(od)
	if err != nil {
		return err
	}
	ndir, err := c.dirLocked(nd)
	if err != nil {
		return err
	}
	n, ok := odir.live[ob]
	if !ok {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrNotExist}
	}
	delete(odir.live, ob)
	ndir.live[nb] = n
	return nil
}

// MkdirAll implements FS. Directories themselves are durable at once (the
// store creates them with MkdirAll and syncs the files inside).
func (c *CrashFS) MkdirAll(dir string, perm os.FileMode) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := clean(dir)
	for {
		if _, ok := c.dirs[p]; ok {
			break
		}
		c.dirs[p] = &memDir{live: map[string]*memNode{}, synced: map[string]*memNode{}}
		if p == "/" {
			break
		}
		p = filepath.Dir(p)
	}
	return nil
}

// ReadDir implements FS.
func (c *CrashFS) ReadDir(dir string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := clean(dir)
	d, err := c.dirLocked(p)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for name := range d.live {
		seen[name] = true
	}
	prefix := p + "/"
	if p == "/" {
		prefix = "/"
	}
	for k := range c.dirs {
		if k != p && strings.HasPrefix(k, prefix) && !strings.Contains(k[len(prefix):], "/") {
			seen[k[len(prefix):]] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// Stat implements FS.
func (c *CrashFS) Stat(name string) (os.FileInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := clean(name)
	if _, ok := c.dirs[p]; ok {
		return memInfo{name: filepath.Base(p), dir: true}, nil
	}
	dir, base := split(p)
	d, err := c.dirLocked(dir)
	if err != nil {
		return nil, err
	}
	n, ok := d.live[base]
	if !ok {
		return nil, &os.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return memInfo{name: base, size: int64(len(n.data)), mtime: n.mtime}, nil
}

// SyncDir implements FS.
func (c *CrashFS) SyncDir(dir string) error {
	if _, err := c.check(OpSyncDir, dir, 0); err != nil {
		return &os.PathError{Op: "syncdir", Path: dir, Err: err}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d, err := c.dirLocked(dir)
	if err != nil {
		return err
	}
	d.synced = make(map[string]*memNode, len(d.live))
	for k, v := range d.live {
		d.synced[k] = v
	}
	return nil
}

type memFile struct {
	fs       *CrashFS
	node     *memNode
	name     string
	append   bool
	readOnly bool
	closed   bool
}

func (f *memFile) Name() string { return f.name }

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	if _, err := f.fs.check(OpRead, f.name, len(p)); err != nil {
		return 0, &os.PathError{Op: "read", Path: f.name, Err: err}
	}
	n := f.node
	n.mu.Lock()
	defer n.mu.Unlock()
	if off < 0 {
		return 0, fmt.Errorf("vfs: negative offset")
	}
	if off >= int64(len(n.data)) {
		return 0, io.EOF
	}
	k := copy(p, n.data[off:])
	if k < len(p) {
		return k, io.EOF
	}
	return k, nil
}

func (f *memFile) Write(p []byte) (int, error) {
	n := f.node
	n.mu.Lock()
	off := int64(len(n.data))
	n.mu.Unlock()
	return f.writeAt(p, off)
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) { return f.writeAt(p, off) }

func (f *memFile) writeAt(p []byte, off int64) (int, error) {
	if f.readOnly {
		return 0, &os.PathError{Op: "write", Path: f.name, Err: fs.ErrPermission}
	}
	k, ierr := f.fs.check(OpWrite, f.name, len(p))
	if ierr == nil {
		k = len(p)
	}
	if k > len(p) || k < 0 {
		k = len(p)
	}
	n := f.node
	n.mu.Lock()
	end := off + int64(k)
	if end > int64(len(n.data)) {
		if end > int64(cap(n.data)) {
			nd := make([]byte, end, 2*end)
			copy(nd, n.data)
			n.data = nd
		} else {
			n.data = n.data[:end]
		}
	}
	copy(n.data[off:], p[:k])
	n.mtime = time.Now()
	n.mu.Unlock()
	if ierr != nil {
		return k, &os.PathError{Op: "write", Path: f.name, Err: ierr}
	}
	return k, nil
}

func (f *memFile) Sync() error {
	if _, err := f.fs.check(OpSync, f.name, 0); err != nil {
		return &os.PathError{Op: "sync", Path: f.name, Err: err}
	}
	n := f.node
	n.mu.Lock()
	n.synced = append(n.synced[:0], n.data...)
	n.mu.Unlock()
	return nil
}

func (f *memFile) Truncate(size int64) error {
	if _, err := f.fs.check(OpTruncate, f.name, 0); err != nil {
		return &os.PathError{Op: "truncate", Path: f.name, Err: err}
	}
	n := f.node
	n.mu.Lock()
	defer n.mu.Unlock()
	if size <= int64(len(n.data)) {
		n.data = n.data[:size]
	} else {
		n.data = append(n.data, make([]byte, size-int64(len(n.data)))...)
	}
	return nil
}

func (f *memFile) Size() (int64, error) {
	n := f.node
	n.mu.Lock()
	defer n.mu.Unlock()
	return int64(len(n.data)), nil
}

func (f *memFile) Close() error {
	f.closed = true
	return nil
}

type memInfo struct {
	name  string
	size  int64
	dir   bool
	mtime time.Time
}

func (i memInfo) Name() string { return i.name }
func (i memInfo) Size() int64  { return i.size }
func (i memInfo) Mode() os.FileMode {
	return map[bool]os.FileMode{true: os.ModeDir | 0o755, false: 0o644}[i.dir]
}
func (i memInfo) ModTime() time.Time { return i.mtime }
func (i memInfo) IsDir() bool        { return i.dir }
func (i memInfo) Sys() any           { return nil }

// CrashClone returns a new CrashFS holding what would survive if power were
// lost now: synced directory entries with their synced contents. The
// receiver is left untouched, so a store can keep running on it (and be
// closed normally) while a test reopens the clone.
func (c *CrashFS) CrashClone() *CrashFS {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := NewCrashFS()
	nodes := map[*memNode]*memNode{}
	for p, d := range c.dirs {
		nd := &memDir{live: map[string]*memNode{}, synced: map[string]*memNode{}}
		for name, n := range d.synced {
			cn, ok := nodes[n]
			if !ok {
				n.mu.Lock()
				cn = &memNode{data: append([]byte(nil), n.synced...), synced: append([]byte(nil), n.synced...), mtime: n.mtime}
				n.mu.Unlock()
				nodes[n] = cn
			}
			nd.live[name] = cn
			nd.synced[name] = cn
		}
		out.dirs[p] = nd
	}
	return out
}
