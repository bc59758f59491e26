package jetstream_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

func openEngine(t *testing.T, url string) *jetstream.Engine { return openEngineB(t, url) }

func openEngineB(t testing.TB, url string) *jetstream.Engine {
	t.Helper()
	e, err := jetstream.Open(t.Context(), jetstream.Options{URLs: []string{url}, DefaultQueues: 4, Timeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// TestElectionOneHolder: two candidates, one holder at a time; closing the
// holder hands over at once; a holder that can no longer renew (its NATS
// connection gone) gives the lease up and the other takes it after the TTL.
func TestElectionOneHolder(t *testing.T) {
	s := natstest.RunServer(t)
	ea, eb := openEngine(t, s.URL), openEngine(t, s.URL)
	var heldA, heldB atomic.Bool
	both := atomic.Bool{}
	check := func() {
		if heldA.Load() && heldB.Load() {
			both.Store(true)
		}
	}
	opts := func(holder string, flag *atomic.Bool) jetstream.LeaseOptions {
		return jetstream.LeaseOptions{Name: "core", Holder: holder, TTL: 1500 * time.Millisecond, Retry: 100 * time.Millisecond,
			OnChange: func(h bool) { flag.Store(h); check() }}
	}
	a, err := ea.Elect(t.Context(), opts("a", &heldA))
	require.NoError(t, err)
	require.Eventually(t, heldA.Load, 5*time.Second, 10*time.Millisecond)
	b, err := eb.Elect(t.Context(), opts("b", &heldB))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.Holder() == "a" }, 5*time.Second, 10*time.Millisecond, "b sees a as the holder")
	// Several renewals (TTL 1.5 s): a keeps the lease all along, b never gets it.
	require.Never(t, func() bool { return !heldA.Load() || heldB.Load() }, 2*time.Second, 10*time.Millisecond,
		"while a renews: a lost the lease or b got it")
	require.True(t, heldA.Load())
	require.False(t, heldB.Load())

	start := time.Now()
	require.NoError(t, a.Close())
	require.False(t, heldA.Load())
	require.Eventually(t, heldB.Load, 5*time.Second, 10*time.Millisecond)
	t.Logf("hand-over after Close: %v", time.Since(start))

	// b's engine loses NATS: b gives up within 2/3 TTL; a new candidate c
	// takes over once the entry expired.
	var heldC atomic.Bool
	ec := openEngine(t, s.URL)
	c, err := ec.Elect(t.Context(), opts("c", &heldC))
	require.NoError(t, err)
	defer c.Close()
	defer b.Close()
	start = time.Now()
	require.NoError(t, eb.Close())
	require.Eventually(t, func() bool { return !heldB.Load() }, 3*time.Second, 10*time.Millisecond)
	require.Eventually(t, heldC.Load, 10*time.Second, 10*time.Millisecond)
	t.Logf("take-over after the holder lost NATS: %v", time.Since(start))
	require.False(t, both.Load(), "two holders at once")
}

// TestElectionFollowsEligible: the lease goes where Eligible says — a
// holder that stops being eligible hands it over at its next renewal, the
// eligible candidate takes it, and one that is not eligible never takes
// it (even free) but still names the holder.
func TestElectionFollowsEligible(t *testing.T) {
	s := natstest.RunServer(t)
	ea, eb := openEngine(t, s.URL), openEngine(t, s.URL)
	var placed atomic.Value // the candidate placed to hold it
	placed.Store("a")
	var heldA, heldB atomic.Bool
	opts := func(holder string, flag *atomic.Bool) jetstream.LeaseOptions {
		return jetstream.LeaseOptions{Name: "placed", Holder: holder, TTL: 1500 * time.Millisecond, Retry: 50 * time.Millisecond,
			Eligible: func() bool { return placed.Load() == holder }, OnChange: func(h bool) { flag.Store(h) }}
	}
	b, err := eb.Elect(t.Context(), opts("b", &heldB))
	require.NoError(t, err)
	defer b.Close()
	require.Never(t, heldB.Load, 500*time.Millisecond, 10*time.Millisecond, "b took a free lease it is not placed to hold")
	a, err := ea.Elect(t.Context(), opts("a", &heldA))
	require.NoError(t, err)
	defer a.Close()
	require.Eventually(t, heldA.Load, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return b.Holder() == "a" }, 5*time.Second, 10*time.Millisecond, "b names the holder")

	placed.Store("b")
	require.Eventually(t, func() bool { return heldB.Load() && !heldA.Load() }, 5*time.Second, 10*time.Millisecond, "handed over to b")
	require.Eventually(t, func() bool { return a.Holder() == "b" }, 5*time.Second, 10*time.Millisecond, "a names the new holder")
}

// TestSharedValueIsTheFirstNodes: two nodes ask for the same shared value
// at once; both get one of the generated values, the same one.
func TestSharedValueIsTheFirstNodes(t *testing.T) {
	s := natstest.RunServer(t)
	ea, eb := openEngine(t, s.URL), openEngine(t, s.URL)
	got := make(chan string, 2)
	for i, e := range []*jetstream.Engine{ea, eb} {
		go func() {
			v, err := e.Shared(t.Context(), "token", func() (string, error) { return fmt.Sprint("from-", i), nil })
			if err != nil {
				v = "error: " + err.Error()
			}
			got <- v
		}()
	}
	a, b := <-got, <-got
	require.Equal(t, a, b)
	require.Contains(t, []string{"from-0", "from-1"}, a)
	again, err := eb.Shared(t.Context(), "token", func() (string, error) { return "later", nil })
	require.NoError(t, err)
	require.Equal(t, a, again)
}
