package engine_test

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// lockProbe is a Router that checks, in every Subscribed and Unsubscribed,
// that the session's lock is held (hooks.go: "called under the session's
// lock"): it asks the engine for the session's window from another
// goroutine, which needs that lock, and notes the call if the answer comes
// before the call returns.
type lockProbe struct {
	e        atomic.Pointer[engine.Engine]
	wg       sync.WaitGroup
	mu       sync.Mutex
	calls    []string
	unlocked []string
}

func (p *lockProbe) Routed(*engine.Message, []string) {}
func (p *lockProbe) Subscribed(id, f string)          { p.probe(id, "subscribed "+f) }
func (p *lockProbe) Unsubscribed(id, f string)        { p.probe(id, "unsubscribed "+f) }

func (p *lockProbe) probe(id, call string) {
	done := make(chan struct{})
	e := p.e.Load()
	p.wg.Go(func() {
		e.Window(id)
		close(done)
	})
	unlocked := false
	select {
	case <-done:
		unlocked = true
	case <-time.After(100 * time.Millisecond): // held: Window waits for us
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, call)
	if unlocked {
		p.unlocked = append(p.unlocked, call)
	}
}

func (p *lockProbe) get() (calls, unlocked []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls), slices.Clone(p.unlocked)
}

// TestRouterCalledUnderTheSessionLock: Subscribed and Unsubscribed run
// under the session's lock, so that a router sees one session's calls in
// the order of its changes — a SUBSCRIBE racing a takeover that ends the
// session must not leave the router with a route the session no longer
// has.
func TestRouterCalledUnderTheSessionLock(t *testing.T) {
	p := &lockProbe{}
	e, addr := start(t, engine.Options{Hooks: engine.Hooks{Router: p}})
	p.e.Store(e)
	t.Cleanup(p.wg.Wait)
	c := dialV3(t, addr, "probe")
	wait(t, c.Subscribe("a/+", 1, nil))
	wait(t, c.Unsubscribe("a/+"))
	wait(t, c.Subscribe("b/#", 0, nil))
	c.Disconnect(50) // a clean session: its subscriptions end with it
	require.Eventually(t, func() bool { calls, _ := p.get(); return len(calls) == 4 }, 5*time.Second, 5*time.Millisecond)
	calls, unlocked := p.get()
	require.Equal(t, []string{"subscribed a/+", "unsubscribed a/+", "subscribed b/#", "unsubscribed b/#"}, calls)
	require.Empty(t, unlocked, "called without the session's lock")
}
