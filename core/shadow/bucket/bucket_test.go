package bucket_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/shadow/bucket"
	"github.com/ferrymq/ferrymq/core/shadow/shadowtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}

// node is one gateway node's engine and shadow service on a nats-server.
func node(t testing.TB, url string, o shadow.Options, bo bucket.Options) (*jetstream.Engine, *shadow.Service) {
	t.Helper()
	eng, err := jetstream.Open(t.Context(), jetstream.Options{URLs: []string{url}})
	require.NoError(t, err)
	svc, err := bucket.Open(t.Context(), eng.JetStream(), eng, o, bo)
	if err != nil {
		_ = eng.Close()
	}
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, svc.Close())
		require.NoError(t, eng.Close())
	})
	return eng, svc
}

func TestBucketShadowUpdatesFromBothSides(t *testing.T) {
	ns := natstest.RunServer(t)
	_, svc := node(t, ns.URL, shadow.Options{Limits: shadow.Limits{MaxBytes: 256}}, bucket.Options{})
	shadowtest.Exercise(t, svc)
}

// TestTwoNodesShareOneBucket: two services (two nodes) race on the same
// device through one bucket: no version is accepted twice, each hears the
// other's changes (Watch: the bucket keeps only the latest, so a watcher
// may skip versions overwritten before it read them, never the last), and
// the events carry every version.
func TestTwoNodesShareOneBucket(t *testing.T) {
	ns := natstest.RunServer(t)
	e1, s1 := node(t, ns.URL, shadow.Options{}, bucket.Options{})
	_, s2 := node(t, ns.URL, shadow.Options{}, bucket.Options{})
	heard := []chan *shadow.Event{make(chan *shadow.Event, 1024), make(chan *shadow.Event, 1024)}
	s1.Watch(func(ev *shadow.Event) { heard[0] <- ev })
	s2.Watch(func(ev *shadow.Event) { heard[1] <- ev })

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
	for _, h := range heard {
		var last int64
		require.Eventually(t, func() bool {
			for {
				select {
				case ev := <-h:
					require.GreaterOrEqual(t, ev.Version, last, "heard in version order (a change, then its mark)")
					last = ev.Version
				default:
					return last == 60
				}
			}
		}, 10*time.Second, 10*time.Millisecond, "each node hears the other node's changes, up to the last")
	}
	shadowtest.CheckFirstSeen(t, shadowtest.History(t, e1, shadow.DefaultTopic)["shared"], 60)
}

func jsonInt(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// TestEventOfAKilledNodeIsNotLost: a node stores changes and dies before
// appending their events (SkipEvents). Another node's change of the same
// device appends the missing event first, then its own; a device that
// changes no more gets its event from the other node's repair.
func TestEventOfAKilledNodeIsNotLost(t *testing.T) {
	ns := natstest.RunServer(t)
	bo := bucket.Options{RepairAfter: 200 * time.Millisecond}
	e1, dying := node(t, ns.URL, shadow.Options{}, bo)
	_, alive := node(t, ns.URL, shadow.Options{}, bo)
	bucket.SkipEvents(dying, func() bool { return true })
	ctx := t.Context()

	for _, id := range []string{"busy", "idle"} {
		_, err := dying.Update(ctx, id, shadow.Update{Section: shadow.Reported, Patch: shadowtest.Patch(t, `{"a":1}`)})
		require.NoError(t, err)
	}
	require.Empty(t, shadowtest.History(t, e1, shadow.DefaultTopic), "the dying node appended nothing")

	d, err := alive.Update(ctx, "busy", shadow.Update{Section: shadow.Desired, Patch: shadowtest.Patch(t, `{"a":2}`), Version: 1})
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Version)
	shadowtest.CheckFirstSeen(t, shadowtest.History(t, e1, shadow.DefaultTopic)["busy"], 2)

	require.Eventually(t, func() bool { return len(shadowtest.History(t, e1, shadow.DefaultTopic)["idle"]) > 0 },
		10*time.Second, 50*time.Millisecond, "the other node repairs the idle device's event")
	shadowtest.CheckFirstSeen(t, shadowtest.History(t, e1, shadow.DefaultTopic)["idle"], 1)
}

// BenchmarkUpdate: reported updates of 1,000 devices from parallel
// callers through the bucket on an in-process nats-server (its default
// sync interval): a bucket read, a bucket write, the event, the mark.
func BenchmarkUpdate(b *testing.B) {
	ns := natstest.RunServer(b)
	_, svc := node(b, ns.URL, shadow.Options{}, bucket.Options{})
	shadowtest.BenchUpdates(b, svc)
}
