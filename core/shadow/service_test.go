package shadow_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/shadow/shadowtest"
	"github.com/ferrymq/ferrymq/core/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// embedded is a store and a log-backed service over it in dir.
type embedded struct {
	st  *store.Store
	svc *shadow.Service
}

func openEmbedded(t testing.TB, dir string, o shadow.Options) *embedded {
	t.Helper()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{FlushPolicy: store.FlushSync})
	require.NoError(t, err)
	svc, err := shadow.OpenLog(t.Context(), st, filepath.Join(dir, "shadows"), o, shadow.LogOptions{SnapshotInterval: time.Hour})
	if err != nil {
		_ = st.Close()
	}
	require.NoError(t, err)
	return &embedded{st: st, svc: svc}
}

// close closes the service (which writes its snapshot), then the store.
func (e *embedded) close(t testing.TB) {
	t.Helper()
	require.NoError(t, e.svc.Close())
	require.NoError(t, e.svc.Close(), "a second Close does nothing")
	require.NoError(t, e.st.Close())
}

// crash closes only the store: the service writes no snapshot, as after a
// kill -9 (the store's acknowledged records are fsynced: FlushSync).
func (e *embedded) crash(t testing.TB) {
	t.Helper()
	require.NoError(t, e.st.Close())
	_ = e.svc.Close() // stops its goroutine; its snapshot fails on the closed store
}

func TestEmbeddedShadowUpdatesFromBothSides(t *testing.T) {
	e := openEmbedded(t, t.TempDir(), shadow.Options{Limits: shadow.Limits{MaxBytes: 256}})
	defer e.close(t)
	shadowtest.Exercise(t, e.svc)
}

// concurrentUpdates has workers race on a few devices (desired and
// reported, some with versions) and returns the accepted documents.
func concurrentUpdates(t testing.TB, svc *shadow.Service, devices, workers, each int) map[string][]*shadow.Document {
	t.Helper()
	var mu sync.Mutex
	accepted := map[string][]*shadow.Document{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				id := "dev-" + string(rune('a'+(w+i)%devices))
				sec := shadow.Desired
				if i%2 == 1 {
					sec = shadow.Reported
				}
				u := shadow.Update{Section: sec, Patch: map[string]any{"w": json.Number(jsonInt(w)), "i": json.Number(jsonInt(i))}}
				if i%3 == 0 {
					if cur, err := svc.Get(t.Context(), id); err == nil {
						u.Version = cur.Version
					}
				}
				d, err := svc.Update(t.Context(), id, u)
				if err != nil {
					require.ErrorIs(t, err, shadow.ErrVersionConflict)
					continue
				}
				mu.Lock()
				accepted[id] = append(accepted[id], d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return accepted
}

func jsonInt(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// checkAccepted: every accepted document is the one the service and the
// topic's history hold at its version; versions are dense and in order
// per device in the topic.
func checkAccepted(t testing.TB, svc *shadow.Service, b core.Broker, accepted map[string][]*shadow.Document) {
	t.Helper()
	hist := shadowtest.History(t, b, shadow.DefaultTopic)
	for id, docs := range accepted {
		evs := hist[id]
		for i, ev := range evs {
			require.Equal(t, int64(i+1), ev.Version, "%s: events in version order, none missing", id)
		}
		var top int64
		for _, d := range docs {
			require.LessOrEqual(t, d.Version, int64(len(evs)), "%s: accepted version %d is in the history", id, d.Version)
			require.Equal(t, d, evs[d.Version-1].Shadow, "%s v%d", id, d.Version)
			top = max(top, d.Version)
		}
		cur, err := svc.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, int64(len(evs)), cur.Version)
		require.GreaterOrEqual(t, cur.Version, top)
		require.Equal(t, evs[len(evs)-1].Shadow, cur)
	}
}

// TestEmbeddedRecoversEveryAcceptedUpdate: updates race; the store closes
// under the service (no snapshot, as after a kill -9) and a new service
// finds every accepted update, from the topic alone; after a clean close
// (snapshot) and more updates, then another crash, from the snapshot plus
// the events after it.
func TestEmbeddedRecoversEveryAcceptedUpdate(t *testing.T) {
	dir := t.TempDir()
	e := openEmbedded(t, dir, shadow.Options{})
	accepted := concurrentUpdates(t, e.svc, 5, 8, 40)
	e.crash(t)
	_, err := os.Stat(filepath.Join(dir, "shadows", shadow.SnapshotFile))
	require.ErrorIs(t, err, os.ErrNotExist, "no snapshot: recovered from the topic")

	e = openEmbedded(t, dir, shadow.Options{})
	checkAccepted(t, e.svc, e.st, accepted)
	e.close(t)
	_, err = os.Stat(filepath.Join(dir, "shadows", shadow.SnapshotFile))
	require.NoError(t, err, "Close writes a snapshot")

	e = openEmbedded(t, dir, shadow.Options{})
	more := concurrentUpdates(t, e.svc, 7, 4, 30)
	e.crash(t)
	for id, docs := range more {
		accepted[id] = append(accepted[id], docs...)
	}
	e = openEmbedded(t, dir, shadow.Options{})
	defer e.close(t)
	checkAccepted(t, e.svc, e.st, accepted)
}

// TestEmbeddedDamagedSnapshotFallsBackToTheTopic: a snapshot with a bad
// CRC is ignored with a warning; the topic still has every event.
func TestEmbeddedDamagedSnapshotFallsBackToTheTopic(t *testing.T) {
	dir := t.TempDir()
	e := openEmbedded(t, dir, shadow.Options{})
	accepted := concurrentUpdates(t, e.svc, 3, 3, 10)
	e.close(t)
	p := filepath.Join(dir, "shadows", shadow.SnapshotFile)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	b[len(b)-2] ^= 0xff
	require.NoError(t, os.WriteFile(p, b, 0o600))
	e = openEmbedded(t, dir, shadow.Options{})
	defer e.close(t)
	checkAccepted(t, e.svc, e.st, accepted)
}
