package shadow_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/shadow/shadowtest"
	"github.com/ferrymq/ferrymq/core/store"
)

// BenchmarkUpdate: reported updates of 1,000 devices from parallel
// callers through the embedded backend (merge, delta, encode, produce),
// with each flush policy: sync fsyncs every accepted update (concurrent
// ones share an fsync). The bucket backend's is in package bucket.
func BenchmarkUpdate(b *testing.B) {
	for _, flush := range []store.FlushPolicy{store.FlushAsync, store.FlushSync} {
		b.Run("flush="+string(flush), func(b *testing.B) {
			dir := b.TempDir()
			st, err := store.Open(filepath.Join(dir, "store"), store.Options{FlushPolicy: flush})
			require.NoError(b, err)
			defer st.Close()
			svc, err := shadow.OpenLog(b.Context(), st, filepath.Join(dir, "shadows"), shadow.Options{}, shadow.LogOptions{SnapshotInterval: time.Hour})
			require.NoError(b, err)
			defer svc.Close()
			shadowtest.BenchUpdates(b, svc)
		})
	}
}
