package engine_test

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
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

// presenceProbe is a RouterPresence that records its calls.
type presenceProbe struct {
	mu    sync.Mutex
	calls []string
}

func (p *presenceProbe) Routed(*engine.Message, []string) {}
func (p *presenceProbe) Subscribed(id, f string)          { p.add(id + " subscribed " + f) }
func (p *presenceProbe) Unsubscribed(id, f string)        { p.add(id + " unsubscribed " + f) }
func (p *presenceProbe) Online(id string, online bool) {
	if online {
		p.add(id + " online")
	} else {
		p.add(id + " offline")
	}
}

func (p *presenceProbe) add(call string) {
	p.mu.Lock()
	p.calls = append(p.calls, call)
	p.mu.Unlock()
}

func (p *presenceProbe) get() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// TestRouterPresence: a RouterPresence hears a session get its connection
// and lose it, in order with its subscriptions; a takeover is no change,
// and a deleted session goes offline before its subscriptions end.
func TestRouterPresence(t *testing.T) {
	p := &presenceProbe{}
	e, addr := start(t, engine.Options{Hooks: engine.Hooks{Router: p}})
	persistent := func(o *paho3.ClientOptions) { o.SetCleanSession(false) }
	c := dialV3(t, addr, "dev", persistent)
	wait(t, c.Subscribe("$share/g/jobs/#", 1, nil))
	c.Disconnect(50)
	require.Eventually(t, func() bool { return !e.Connected("dev") }, 5*time.Second, 5*time.Millisecond)
	dialV3(t, addr, "dev", persistent)
	dialV3(t, addr, "dev", persistent) // takes the session over
	require.True(t, e.DeleteSession("dev"))
	require.Equal(t, []string{
		"dev online", "dev subscribed $share/g/jobs/#", "dev offline",
		"dev online",
		"dev offline", "dev unsubscribed $share/g/jobs/#",
	}, p.get())
}
