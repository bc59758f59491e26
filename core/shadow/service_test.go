package shadow_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}

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

func patch(t testing.TB, s string) map[string]any {
	t.Helper()
	m, err := shadow.DecodePatch([]byte(s), shadow.Limits{})
	require.NoError(t, err)
	return m
}

func stateJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// exercise runs the same story on any service: both sides update, the
// delta follows, stale versions conflict, limits hold, delete and
// re-create go on counting versions.
func exercise(t *testing.T, svc *shadow.Service) {
	ctx := t.Context()
	_, err := svc.Get(ctx, "car-1")
	require.ErrorIs(t, err, shadow.ErrNotFound)

	d, err := svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Desired, Patch: patch(t, `{"temp":21,"lights":{"front":"on"}}`)})
	require.NoError(t, err)
	require.Equal(t, int64(1), d.Version)
	require.JSONEq(t, `{"temp":21,"lights":{"front":"on"}}`, stateJSON(t, d.State.Delta))

	d, err = svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Reported, Patch: patch(t, `{"temp":21,"lights":{"front":"off"},"rpm":900}`), Version: 1})
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Version)
	require.JSONEq(t, `{"lights":{"front":"on"}}`, stateJSON(t, d.State.Delta))
	require.Contains(t, d.Metadata.Reported, "rpm")

	_, err = svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Desired, Patch: patch(t, `{"temp":19}`), Version: 1})
	require.ErrorIs(t, err, shadow.ErrVersionConflict, "version 1 is stale")
	require.Contains(t, err.Error(), "at 2")

	big := `{"blob":"` + strings.Repeat("x", 300) + `"}`
	_, err = svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Reported, Patch: patch(t, big)})
	require.ErrorIs(t, err, shadow.ErrTooLarge)

	d, err = svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Reported, Patch: patch(t, `{"lights":{"front":"on"}}`)})
	require.NoError(t, err)
	require.Equal(t, int64(3), d.Version)
	require.Nil(t, d.State.Delta, "reported caught up with desired")

	got, err := svc.Get(ctx, "car-1")
	require.NoError(t, err)
	require.Equal(t, d, got)

	_, err = svc.Delete(ctx, "car-1", 2)
	require.ErrorIs(t, err, shadow.ErrVersionConflict)
	v, err := svc.Delete(ctx, "car-1", 3)
	require.NoError(t, err)
	require.Equal(t, int64(4), v)
	_, err = svc.Get(ctx, "car-1")
	require.ErrorIs(t, err, shadow.ErrNotFound)
	_, err = svc.Delete(ctx, "car-1", 0)
	require.ErrorIs(t, err, shadow.ErrNotFound)

	d, err = svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Desired, Patch: patch(t, `{"temp":18}`)})
	require.NoError(t, err)
	require.Equal(t, int64(5), d.Version, "versions go on after a delete")
	require.Nil(t, d.State.Reported)

	_, err = svc.Get(ctx, "")
	require.ErrorIs(t, err, shadow.ErrBadRequest)
}

func TestEmbeddedShadowUpdatesFromBothSides(t *testing.T) {
	e := openEmbedded(t, t.TempDir(), shadow.Options{Limits: shadow.Limits{MaxBytes: 256}})
	defer e.close(t)
	exercise(t, e.svc)
}

func TestKVShadowUpdatesFromBothSides(t *testing.T) {
	ns := natstest.RunServer(t)
	eng, err := jetstream.Open(t.Context(), jetstream.Options{URLs: []string{ns.URL}})
	require.NoError(t, err)
	defer eng.Close()
	svc, err := shadow.OpenKV(t.Context(), eng.JetStream(), eng, shadow.Options{Limits: shadow.Limits{MaxBytes: 256}}, shadow.KVOptions{})
	require.NoError(t, err)
	defer func() { require.NoError(t, svc.Close()) }()
	exercise(t, svc)
}

// history reads every event of the topic, per device in topic order.
func history(t testing.TB, b core.Broker, topic string) map[string][]*shadow.Event {
	t.Helper()
	ctx := t.Context()
	info, err := b.Topic(ctx, topic)
	require.NoError(t, err)
	out := map[string][]*shadow.Event{}
	for q, r := range info.Ranges {
		for off := r.Min; off < r.Max; {
			res, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 256})
			require.NoError(t, err)
			if len(res.Messages) == 0 {
				break
			}
			for _, m := range res.Messages {
				ev, err := shadow.DecodeEvent(m.Body)
				require.NoError(t, err)
				require.Equal(t, ev.ClientID, m.ShardingKey)
				out[ev.ClientID] = append(out[ev.ClientID], ev)
			}
			off = res.NextOffset
		}
	}
	return out
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
	hist := history(t, b, shadow.DefaultTopic)
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

// TestKVTwoServicesShareOneBucket: two services (two nodes) race on the
// same devices through one bucket: no version is accepted twice, each
// hears the other's changes (Watch: the bucket keeps only the latest, so
// a watcher may skip versions overwritten before it read them, never the
// last), and the events carry every version.
func TestKVTwoServicesShareOneBucket(t *testing.T) {
	ns := natstest.RunServer(t)
	open := func() (*jetstream.Engine, *shadow.Service, chan *shadow.Event) {
		eng, err := jetstream.Open(t.Context(), jetstream.Options{URLs: []string{ns.URL}})
		require.NoError(t, err)
		svc, err := shadow.OpenKV(t.Context(), eng.JetStream(), eng, shadow.Options{}, shadow.KVOptions{})
		require.NoError(t, err)
		heard := make(chan *shadow.Event, 1024)
		svc.Watch(func(ev *shadow.Event) { heard <- ev })
		return eng, svc, heard
	}
	e1, s1, heard1 := open()
	defer e1.Close()
	defer s1.Close()
	e2, s2, heard2 := open()
	defer e2.Close()
	defer s2.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	versions := map[int64]int{}
	for i, svc := range []*shadow.Service{s1, s2, s1, s2} {
		wg.Go(func() {
			for j := range 15 {
				d, err := svc.Update(ctx, "shared", shadow.Update{Section: shadow.Reported, Patch: map[string]any{"n": json.Number(jsonInt(i*100 + j))}})
				require.NoError(t, err)
				mu.Lock()
				versions[d.Version]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, versions, 60, "60 accepted updates, 60 distinct versions")
	for v, n := range versions {
		require.Equal(t, 1, n, "version %d accepted once", v)
	}
	for _, heard := range []chan *shadow.Event{heard1, heard2} {
		var last int64
		require.Eventually(t, func() bool {
			for {
				select {
				case ev := <-heard:
					require.GreaterOrEqual(t, ev.Version, last, "heard in version order (a change, then its mark)")
					last = ev.Version
				default:
					return last == 60
				}
			}
		}, 10*time.Second, 10*time.Millisecond, "each node hears the other node's changes, up to the last")
	}
	checkKVHistory(t, history(t, e1, shadow.DefaultTopic)["shared"], 60)
}

// checkKVHistory: a device's events on the JetStream engine hold every
// version 1..n, each first seen after the one before it (a repeat of a
// version may come later: consumers skip what is not newer).
func checkKVHistory(t testing.TB, hist []*shadow.Event, n int64) {
	t.Helper()
	var last int64
	for _, ev := range hist {
		if ev.Version <= last {
			continue // a repeat
		}
		require.Equal(t, last+1, ev.Version, "versions first seen in order, none missing")
		last = ev.Version
	}
	require.Equal(t, n, last)
}

// TestKVEventOfAKilledNodeIsNotLost: a node stores changes and dies
// before appending their events (SkipEvents). Another node's change of
// the same device appends the missing event first, then its own; a device
// that changes no more gets its event from the other node's repair.
func TestKVEventOfAKilledNodeIsNotLost(t *testing.T) {
	ns := natstest.RunServer(t)
	open := func() (*jetstream.Engine, *shadow.Service) {
		eng, err := jetstream.Open(t.Context(), jetstream.Options{URLs: []string{ns.URL}})
		require.NoError(t, err)
		svc, err := shadow.OpenKV(t.Context(), eng.JetStream(), eng, shadow.Options{}, shadow.KVOptions{RepairAfter: 200 * time.Millisecond})
		require.NoError(t, err)
		return eng, svc
	}
	e1, dying := open()
	defer e1.Close()
	defer dying.Close()
	e2, alive := open()
	defer e2.Close()
	defer alive.Close()
	shadow.SkipEvents(dying, func() bool { return true })
	ctx := t.Context()

	for _, id := range []string{"busy", "idle"} {
		_, err := dying.Update(ctx, id, shadow.Update{Section: shadow.Reported, Patch: patch(t, `{"a":1}`)})
		require.NoError(t, err)
	}
	require.Empty(t, history(t, e1, shadow.DefaultTopic), "the dying node appended nothing")

	d, err := alive.Update(ctx, "busy", shadow.Update{Section: shadow.Desired, Patch: patch(t, `{"a":2}`), Version: 1})
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Version)
	checkKVHistory(t, history(t, e1, shadow.DefaultTopic)["busy"], 2)

	require.Eventually(t, func() bool { return len(history(t, e1, shadow.DefaultTopic)["idle"]) > 0 },
		10*time.Second, 50*time.Millisecond, "the other node repairs the idle device's event")
	checkKVHistory(t, history(t, e1, shadow.DefaultTopic)["idle"], 1)
}
