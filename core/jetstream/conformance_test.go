package jetstream_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/brokertest"
	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// TestConformance runs the shared core.Broker suite against the JetStream
// engine on a real single-node nats-server (in process, file storage, fsync
// on every write). Each case gets its own server; Reopen closes the engine
// and opens a new one on the same server, as a gateway restart does.
func TestConformance(t *testing.T) {
	runConformance(t, jetstream.Options{DefaultQueues: 4})
}

// TestConformanceNoAutoCreate runs the suite again with auto-creation off,
// so the refusal the AutoCreate case checks for is exercised on a real
// engine and every other case is shown not to depend on auto-creation.
func TestConformanceNoAutoCreate(t *testing.T) {
	runConformance(t, jetstream.Options{DefaultQueues: 4, DisableAutoCreate: true})
}

// runConformance runs the suite against engines opened with opts (URLs
// filled in per case), declaring the capabilities those options give.
func runConformance(t *testing.T, opts jetstream.Options) {
	var urls sync.Map // *jetstream.Engine → server URL
	open := func(t *testing.T, url string) core.Broker {
		t.Helper()
		o := opts
		o.URLs = []string{url}
		e, err := jetstream.Open(t.Context(), o)
		require.NoError(t, err)
		urls.Store(e, url)
		t.Cleanup(func() {
			_ = e.Close()
			urls.Delete(e)
		})
		return e
	}
	brokertest.Run(t, brokertest.Factory{
		Open: func(t *testing.T) core.Broker {
			return open(t, natstest.RunServer(t, natstest.SyncAlways()).URL)
		},
		Reopen: func(t *testing.T, b core.Broker) core.Broker {
			t.Helper()
			url, ok := urls.Load(b)
			require.True(t, ok, "Reopen of an engine this factory did not open")
			require.NoError(t, b.Close())
			return open(t, url.(string))
		},
		NoAutoCreate:  opts.DisableAutoCreate,
		SparseOffsets: true,
		StoredAtSkew:  time.Second,
	})
}
