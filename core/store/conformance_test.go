package store_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/brokertest"
	"github.com/ferrymq/ferrymq/core/store"
)

// TestConformance runs the shared core.Broker suite against the embedded
// engine. TestMain (store_test.go) checks for leaked goroutines afterwards,
// so every store opened here is closed by its test's cleanup.
func TestConformance(t *testing.T) {
	runConformance(t, store.Options{DefaultQueues: 4})
}

// TestConformanceNoAutoCreate runs the suite again with auto-creation off,
// so the refusal the AutoCreate case checks for is exercised on a real
// engine and every other case is shown not to depend on auto-creation.
func TestConformanceNoAutoCreate(t *testing.T) {
	runConformance(t, store.Options{DefaultQueues: 4, DisableAutoCreate: true})
}

// runConformance runs the suite against stores opened with opts, declaring
// the capabilities those options give.
func runConformance(t *testing.T, opts store.Options) {
	var dirs sync.Map // *store.Store → its data directory, for Reopen
	open := func(t *testing.T, dir string) core.Broker {
		t.Helper()
		s, err := store.Open(dir, opts)
		require.NoError(t, err)
		dirs.Store(s, dir)
		t.Cleanup(func() {
			_ = s.Close()
			dirs.Delete(s)
		})
		return s
	}
	brokertest.Run(t, brokertest.Factory{
		Open: func(t *testing.T) core.Broker { return open(t, t.TempDir()) },
		Reopen: func(t *testing.T, b core.Broker) core.Broker {
			t.Helper()
			dir, ok := dirs.Load(b)
			require.True(t, ok, "Reopen of a store this factory did not open")
			require.NoError(t, b.Close()) // a no-op if the test closed it
			return open(t, dir.(string))
		},
		NoAutoCreate: opts.DisableAutoCreate,
	})
}
