package vfs

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func write(t *testing.T, fs *CrashFS, name, data string, sync bool) File {
	t.Helper()
	f, err := fs.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o644)
	require.NoError(t, err)
	_, err = f.Write([]byte(data))
	require.NoError(t, err)
	if sync {
		require.NoError(t, f.Sync())
	}
	return f
}

func read(t *testing.T, fs FS, name string) string {
	t.Helper()
	f, err := fs.OpenFile(name, os.O_RDONLY, 0)
	require.NoError(t, err)
	n, err := f.Size()
	require.NoError(t, err)
	b := make([]byte, n)
	_, _ = f.ReadAt(b, 0)
	return string(b)
}

func TestCrashKeepsOnlySyncedState(t *testing.T) {
	fs := NewCrashFS()
	require.NoError(t, fs.MkdirAll("/d", 0o755))
	f := write(t, fs, "/d/a", "durable", true)
	require.NoError(t, fs.SyncDir("/d"))
	_, err := f.Write([]byte("-lost"))
	require.NoError(t, err)
	write(t, fs, "/d/b", "synced data, unsynced entry", true)
	require.Equal(t, "durable-lost", read(t, fs, "/d/a"))

	clone := fs.CrashClone()
	fs.Crash()
	for _, c := range []*CrashFS{fs, clone} {
		require.Equal(t, "durable", read(t, c, "/d/a"))
		_, err := c.Stat("/d/b")
		require.True(t, errors.Is(err, os.ErrNotExist), "a file whose directory entry was never synced is gone")
	}
}

func TestRenameNeedsSyncDir(t *testing.T) {
	fs := NewCrashFS()
	require.NoError(t, fs.MkdirAll("/d", 0o755))
	write(t, fs, "/d/old", "v1", true)
	require.NoError(t, fs.SyncDir("/d"))
	write(t, fs, "/d/tmp", "v2", true)
	require.NoError(t, fs.Rename("/d/tmp", "/d/old"))
	c1 := fs.CrashClone()
	require.Equal(t, "v1", read(t, c1, "/d/old"), "rename not yet durable")
	require.NoError(t, fs.SyncDir("/d"))
	c2 := fs.CrashClone()
	require.Equal(t, "v2", read(t, c2, "/d/old"))
	names, err := c2.ReadDir("/d")
	require.NoError(t, err)
	require.Equal(t, []string{"old"}, names)
}

func TestInjectTornWrite(t *testing.T) {
	fs := NewCrashFS()
	require.NoError(t, fs.MkdirAll("/d", 0o755))
	f := write(t, fs, "/d/a", "abc", true)
	fs.SetInject(func(op Op, path string, n int) (int, error) {
		if op == OpWrite {
			return n / 2, ErrInjected
		}
		return n, nil
	})
	n, err := f.Write([]byte("123456"))
	require.ErrorIs(t, err, ErrInjected)
	require.Equal(t, 3, n)
	fs.SetInject(nil)
	require.Equal(t, "abc123", read(t, fs, "/d/a"))
	require.NoError(t, f.Truncate(3))
	require.Equal(t, "abc", read(t, fs, "/d/a"))
}
