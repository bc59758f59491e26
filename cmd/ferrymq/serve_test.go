package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	cmd.SetArgs([]string{"serve", "--data", dir, "--flush", "sync", "--core", "127.0.0.1:0"})
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
	cmd.SetArgs([]string{"serve", "--data", t.TempDir(), "--flush", "sometimes"})
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
