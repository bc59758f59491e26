package shadow_test

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/store"
)

// BenchmarkUpdate: reported updates of 1,000 devices from parallel
// callers through the embedded backend (merge, delta, encode, produce),
// with each flush policy — sync fsyncs every accepted update (concurrent
// ones share an fsync) — and through the JetStream backend on an
// in-process nats-server (bucket read, write, event, mark).
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
			benchUpdates(b, svc)
		})
	}
	b.Run("engine=nats", func(b *testing.B) {
		ns := natstest.RunServer(b)
		eng, err := jetstream.Open(b.Context(), jetstream.Options{URLs: []string{ns.URL}})
		require.NoError(b, err)
		defer eng.Close()
		svc, err := shadow.OpenKV(b.Context(), eng.JetStream(), eng, shadow.Options{}, shadow.KVOptions{})
		require.NoError(b, err)
		defer svc.Close()
		benchUpdates(b, svc)
	})
}

func benchUpdates(b *testing.B, svc *shadow.Service) {
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			id := "dev-" + strconv.FormatInt(i%1000, 10)
			_, err := svc.Update(b.Context(), id, shadow.Update{Section: shadow.Reported,
				Patch: map[string]any{"temp": json.Number(strconv.FormatInt(i%40, 10)), "fw": "1.2.3", "pos": map[string]any{"lat": json.Number("52.5"), "lon": json.Number("13.4")}}})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "updates/s")
}
