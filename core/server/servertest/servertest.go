// Package servertest starts a real core server for tests: an embedded store
// in a temporary directory, the group coordinator, retry and POP services,
// and the TCP server on a loopback port — the same parts `ferrymq serve`
// runs, with timings compressed for tests.
package servertest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/server"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/txn"
)

// Env is a running server and its parts.
type Env struct {
	Dir    string
	Store  *store.Store
	Groups *group.Coordinator
	Retry  *retry.Service
	Pop    *pop.Service
	Delay  *delay.Service
	Txn    *txn.Service
	// Shadows is the shadow service (Options.Shadows), or nil.
	Shadows *shadow.Service
	Server  *server.Server
	// Trace is the recorder the parts share; nil unless Options.Trace.
	Trace *trace.Recorder
	Addr  string
	stop  func()
}

// Options adjust a test server.
type Options struct {
	Dir         string // reuse a data directory (restart tests); default t.TempDir()
	Addr        string // default 127.0.0.1:0
	Token       string
	FlushPolicy store.FlushPolicy
	// TailCacheBytes is the store's (store.Options): small, reads of older
	// messages take the cold path.
	TailCacheBytes int64
	Server         server.Options // fields left zero get the test defaults
	// Delay and Txn configure delayed delivery (folder Dir/delay) and
	// transactions, which always run; zero fields get the test defaults
	// (transactions: first check after 200 ms, then every 200 ms, 3 checks).
	Delay delay.Options
	Txn   txn.Options
	// Trace, when set, starts a trace.Recorder over the store with these
	// options and gives it to the group coordinator, the retry, POP and
	// delay services and the server (Env.Trace); it is closed after them,
	// before the store.
	Trace *trace.Options
	// GroupsBroker, when set, is what the group coordinator reads instead
	// of the store itself (a test wraps the store to count its reads).
	GroupsBroker func(*store.Store) core.Broker
	// Shadows, when set, serves device shadows with these options over
	// the store (snapshot in Dir/shadows): Env.Shadows.
	Shadows *shadow.Options
	// ServerBroker, when set, wraps what the server's own requests
	// (produce, read, admin) go to — a test injects faults with it.
	ServerBroker func(core.Broker) core.Broker
}

// Start runs a server until the test ends (or Stop).
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	st, err := store.Open(o.Dir, store.Options{FlushPolicy: o.FlushPolicy, IndexSlots: 1 << 12, IndexEntries: 1 << 16,
		CheckpointInterval: 50 * time.Millisecond, TailCacheBytes: o.TailCacheBytes})
	require.NoError(t, err)
	var rec *trace.Recorder
	if o.Trace != nil {
		rec, err = trace.New(st, *o.Trace)
		require.NoError(t, err)
		rec.Start()
	}
	var gb core.Broker = st
	if o.GroupsBroker != nil {
		gb = o.GroupsBroker(st)
	}
	gc, err := group.New(gb, group.Options{HeartbeatTimeout: 500 * time.Millisecond, CheckInterval: 25 * time.Millisecond, Trace: rec})
	require.NoError(t, err)
	gc.Start()
	rs, err := retry.New(st, retry.Options{Schedule: []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond}, Trace: rec})
	require.NoError(t, err)
	rs.Start()
	ps, err := pop.New(st, rs, pop.Options{MinInvisible: 50 * time.Millisecond, Trace: rec})
	require.NoError(t, err)
	ps.Start()
	if o.Delay.PollInterval == 0 {
		o.Delay.PollInterval = 20 * time.Millisecond
	}
	if o.Delay.Trace == nil {
		o.Delay.Trace = rec
	}
	ds, err := delay.New(st, filepath.Join(o.Dir, "delay"), o.Delay)
	require.NoError(t, err)
	ds.Start()
	to := o.Txn
	if to.FirstCheck == 0 {
		to.FirstCheck = 200 * time.Millisecond
	}
	if to.CheckInterval == 0 {
		to.CheckInterval = 200 * time.Millisecond
	}
	if to.MaxChecks == 0 {
		to.MaxChecks = 3
	}
	if to.PollInterval == 0 {
		to.PollInterval = 20 * time.Millisecond
	}
	ts, err := txn.New(ds.Broker(), to)
	require.NoError(t, err)
	require.NoError(t, ts.Start(context.Background()))
	so := o.Server
	so.Addr, so.Broker, so.Groups, so.Retry, so.Pop, so.Token = o.Addr, ds.Broker(), gc, rs, ps, o.Token
	so.Delay, so.Txn = ds, ts
	if o.ServerBroker != nil {
		so.Broker = o.ServerBroker(so.Broker)
	}
	var sh *shadow.Service
	if o.Shadows != nil {
		sh, err = shadow.OpenLog(context.Background(), st, filepath.Join(o.Dir, "shadows"), *o.Shadows, shadow.LogOptions{})
		require.NoError(t, err)
		so.Shadows = sh
	}
	if so.Trace == nil {
		so.Trace = rec
	}
	srv, err := server.New(so)
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	e := &Env{Dir: o.Dir, Store: st, Groups: gc, Retry: rs, Pop: ps, Delay: ds, Txn: ts, Shadows: sh, Server: srv, Trace: rec, Addr: srv.Addr().String()}
	stopped := false
	e.stop = func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if sh != nil {
			_ = sh.Close()
		}
		_ = ts.Close()
		_ = ds.Close()
		_ = ps.Close()
		_ = rs.Close()
		_ = gc.Close()
		_ = rec.Close() // after everything that records, before the store it writes to
		_ = st.Close()
	}
	t.Cleanup(e.stop)
	return e
}

// Stop shuts the server down (as a clean restart would).
func (e *Env) Stop() { e.stop() }
