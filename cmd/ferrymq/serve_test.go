package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

func TestMain(m *testing.M) {
	natstest.MaybeChild()
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}

// TestServeOpensAndClosesStore runs `ferrymq serve` in-process until its
// context is cancelled, as SIGINT would, and checks that it shut the store
// down cleanly (no abort marker left).
func TestServeOpensAndClosesStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	var logs bytes.Buffer
	stderr = &logs
	t.Cleanup(func() { stderr = os.Stderr })

	ctx, cancel := context.WithCancel(t.Context())
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"serve", "--data", dir, "--flush", "sync", "--core", "127.0.0.1:0", "--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "127.0.0.1:0"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(dir, "abort"))
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "store opened")
	cancel()
	require.NoError(t, <-done)
	_, err := os.Stat(filepath.Join(dir, "abort"))
	require.True(t, os.IsNotExist(err), "clean shutdown removes the abort marker")
	require.Contains(t, logs.String(), `"message":"store closed"`)
}

func TestServeRejectsBadFlushPolicy(t *testing.T) {
	cmd := newRootCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"serve", "--data", t.TempDir(), "--flush", "sometimes", "--core", "127.0.0.1:0", "--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "127.0.0.1:0"})
	err := cmd.ExecuteContext(t.Context())
	require.ErrorContains(t, err, "flush policy")
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	cmd := newRootCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"version"})
	require.NoError(t, cmd.Execute())
	require.Contains(t, out.String(), "ferrymq ")
}

// TestServePrintsAddressesAndServesHTTP runs serve in-process, learns its
// addresses from what it prints, produces over HTTP and reads the message
// back over the core protocol's store.
func TestServePrintsAddressesAndServesHTTP(t *testing.T) {
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(t.Context())
	cmd := newRootCmd()
	cmd.SetOut(pw)
	cmd.SetArgs([]string{"serve", "--data", t.TempDir(), "--core", "127.0.0.1:0", "--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "127.0.0.1:0"})
	stderr = io.Discard
	t.Cleanup(func() { stderr = os.Stderr })
	done := make(chan error, 1)
	go func() {
		done <- cmd.ExecuteContext(ctx)
		_ = pw.Close()
	}()
	addrs := map[string]string{}
	sc := bufio.NewScanner(pr)
	for len(addrs) < 2 && sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && (f[0] == "core" || f[0] == "http") {
			addrs[f[0]] = f[1]
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	require.Len(t, addrs, 2, "serve prints its core and http addresses")
	resp, err := http.Post("http://"+addrs["http"]+"/api/v1/topics/cars/messages", "application/json",
		strings.NewReader(`{"key":"car-1","body":"hello"}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	_ = resp.Body.Close()
	cancel()
	require.NoError(t, <-done)
}

// --heap-profile writes a heap profile when serve is told to stop.
func TestServeWritesHeapProfile(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "heap.pprof")
	stderr = io.Discard
	t.Cleanup(func() { stderr = os.Stderr })
	ctx, cancel := context.WithCancel(t.Context())
	cmd := newRootCmd()
	cmd.SetOut(io.Discard)
	cmd.SetArgs([]string{"serve", "--data", filepath.Join(dir, "data"), "--heap-profile", prof,
		"--core", "127.0.0.1:0", "--http", "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--ws", "127.0.0.1:0"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(dir, "data", "abort"))
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "store opened")
	_, err := os.Stat(prof)
	require.True(t, os.IsNotExist(err), "not before shutdown")
	cancel()
	require.NoError(t, <-done)
	fi, err := os.Stat(prof)
	require.NoError(t, err)
	require.Positive(t, fi.Size())
}
