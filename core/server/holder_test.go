package server_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/wire"
)

// gatedStore holds every Read of one reader (a consumer group) while
// hold is set, until gate closes or the read's ctx ends: the way a read
// waits for its group's budget of cold reads.
type gatedStore struct {
	*store.Store
	reader  string
	hold    atomic.Bool
	gate    chan struct{}
	waiting atomic.Int32
	readers chan string // the Reader of every read, as the coordinator names it
}

func (g *gatedStore) Read(ctx context.Context, req core.ReadRequest) (core.ReadResult, error) {
	select {
	case g.readers <- req.Reader:
	default:
	}
	if req.Reader == g.reader && g.hold.Load() {
		g.waiting.Add(1)
		defer g.waiting.Add(-1)
		select {
		case <-g.gate:
		case <-ctx.Done():
			return core.ReadResult{}, ctx.Err()
		}
	}
	return g.Store.Read(ctx, req)
}

func groupStream(t *testing.T, nc net.Conn, id uint64, group, client, topic string) {
	t.Helper()
	_, err := nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpHeartbeat, ID: id - 1,
		Payload: fmt.Appendf(nil, `{"group":%q,"client_id":%q,"subscriptions":[{"topic":%q}]}`, group, client, topic)}))
	require.NoError(t, err)
	f := readFrame(t, nc, 10*time.Second)
	require.Zero(t, f.Flags&wire.FlagError, "heartbeat: %s", f.Payload)
	_, err = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpGroupPull, ID: id,
		Payload: fmt.Appendf(nil, `{"group":%q,"client_id":%q,"topic":%q,"queue":0,"offset":0,"max":100,"wait_ms":30000,"stream":true}`,
			group, client, topic)}))
	require.NoError(t, err)
}

// TestWaitingReadHoldsUpOnlyItsGroup: the parked polls of two groups on
// one topic are retried by separate goroutines, so a group whose read
// waits (for its budget of cold reads, say) does not keep another group
// at the tail of the same topic from its messages. With one goroutine per
// topic the tail group's poll sat behind the waiting one.
func TestWaitingReadHoldsUpOnlyItsGroup(t *testing.T) {
	gs := &gatedStore{reader: "backlog", gate: make(chan struct{}), readers: make(chan string, 64)}
	env := servertest.Start(t, servertest.Options{GroupsBroker: func(st *store.Store) core.Broker {
		gs.Store = st
		return gs
	}})
	_, err := env.Store.CreateTopic(t.Context(), coreTopic("iso", 1))
	require.NoError(t, err)
	backlog, tail := helloConn(t, env.Addr), helloConn(t, env.Addr)
	groupStream(t, backlog, 11, "backlog", "b1", "iso") // parked first: tried first on arrival
	require.Equal(t, "backlog", <-gs.readers, "the coordinator names the group as the reader")
	groupStream(t, tail, 21, "tail", "t1", "iso")
	require.Equal(t, "tail", <-gs.readers)

	gs.hold.Store(true)
	defer close(gs.gate)
	_, err = env.Store.Produce(t.Context(), coreMsg("iso", "m0"))
	require.NoError(t, err)
	_, res := readPull(t, tail, 21)
	require.Len(t, res.Messages, 1)
	require.Equal(t, "m0", string(res.Messages[0].Body))
	// The backlog group's poll, tried on the same arrival by its own
	// goroutine, reaches its read and waits there (it may get there after
	// the tail's answer: the goroutines are separate).
	require.Eventually(t, func() bool { return gs.waiting.Load() == 1 }, 10*time.Second, time.Millisecond,
		"the backlog group's read is waiting")
	_, err = env.Store.Produce(t.Context(), coreMsg("iso", "m1"))
	require.NoError(t, err)
	_, res = readPull(t, tail, 21)
	require.Len(t, res.Messages, 1, "the tail group goes on while the backlog group's read waits")
	require.Equal(t, "m1", string(res.Messages[0].Body))
	require.Equal(t, int32(1), gs.waiting.Load(), "the backlog group's read is still waiting")
}
