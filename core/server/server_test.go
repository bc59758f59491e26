package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func helloConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	_, err = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpHello, ID: 1, Payload: []byte(`{"version":1}`)}))
	require.NoError(t, err)
	f, err := wire.ReadFrame(nc, 1<<20)
	require.NoError(t, err)
	require.Zero(t, f.Flags&wire.FlagError)
	return nc
}

// TestShutdownEndsParkedLongPolls: Shutdown returns, with every goroutine
// ended (goleak), while a client holds a long poll and another is mid-handshake.
func TestShutdownEndsParkedLongPolls(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	_, err := env.Store.CreateTopic(t.Context(), coreTopic("lp", 1))
	require.NoError(t, err)
	nc := helloConn(t, env.Addr)
	_, err = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpPull, ID: 2,
		Payload: []byte(`{"topic":"lp","queue":0,"offset":0,"wait_ms":30000}`)}))
	require.NoError(t, err)
	half, err := net.Dial("tcp", env.Addr)
	require.NoError(t, err)
	defer half.Close()

	// Make sure the poll is parked before shutting down: a ping sent after
	// it is answered while the poll is still waiting.
	_, err = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpPing, ID: 3}))
	require.NoError(t, err)
	f, err := wire.ReadFrame(nc, 1<<20)
	require.NoError(t, err)
	require.Equal(t, uint64(3), f.ID)

	// The poll waits 30 s; shutdown gets 10 s: only a shutdown that answers
	// parked polls at once delivers the empty answer checked below.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, env.Server.Shutdown(ctx))
	// The parked poll got its empty answer (not a dropped connection), then
	// the connection was closed.
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err = wire.ReadFrame(nc, 1<<20)
	require.NoError(t, err)
	require.Equal(t, uint64(2), f.ID)
	require.Zero(t, f.Flags&wire.FlagError)
	res, err := wire.DecodePull(f.Payload)
	require.NoError(t, err)
	require.Empty(t, res.Messages)
	for {
		if _, err := wire.ReadFrame(nc, 1<<20); err != nil {
			var ne net.Error
			require.False(t, isTimeout(err, &ne), "connection closed by shutdown")
			break
		}
	}
}

// TestLongPollAnsweredOnArrival: a parked pull is answered as soon as a
// message is stored, long before its wait.
func TestLongPollAnsweredOnArrival(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	_, err := env.Store.CreateTopic(t.Context(), coreTopic("lp", 1))
	require.NoError(t, err)
	nc := helloConn(t, env.Addr)
	_, err = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpPull, ID: 2,
		Payload: []byte(`{"topic":"lp","queue":0,"offset":0,"wait_ms":30000}`)}))
	require.NoError(t, err)
	// A ping sent after the pull is answered first: the poll holds nothing up.
	_, err = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpPing, ID: 3}))
	require.NoError(t, err)
	f, err := wire.ReadFrame(nc, 1<<20)
	require.NoError(t, err)
	require.Equal(t, uint64(3), f.ID)
	start := time.Now()
	_, err = env.Store.Produce(t.Context(), coreMsg("lp", "x"))
	require.NoError(t, err)
	_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	f, err = wire.ReadFrame(nc, 1<<20)
	require.NoError(t, err)
	require.Equal(t, uint64(2), f.ID)
	res, err := wire.DecodePull(f.Payload)
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	require.Less(t, time.Since(start), 20*time.Second)
}

// TestParkedPollsOfManyQueuesEachWokenByItsArrival: one long poll parked
// per queue of a topic; messages arrive one at a time on changing queues,
// and each answered poll parks again at once (its kick races the next
// arrival). Every message is answered long before the polls' 30 s wait:
// the holder, which on a kick tries only the new poll, never loses an
// arrival for the others.
func TestParkedPollsOfManyQueuesEachWokenByItsArrival(t *testing.T) {
	const queues, n = 8, 48
	env := servertest.Start(t, servertest.Options{})
	_, err := env.Store.CreateTopic(t.Context(), coreTopic("lp", queues))
	require.NoError(t, err)
	nc := helloConn(t, env.Addr)
	next := make([]int64, queues) // each queue's next offset
	park := func(q int) {
		t.Helper()
		_, err := nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpPull, ID: uint64(100 + q),
			Payload: []byte(fmt.Sprintf(`{"topic":"lp","queue":%d,"offset":%d,"wait_ms":30000}`, q, next[q]))}))
		require.NoError(t, err)
	}
	for q := range queues {
		park(q)
	}
	keys := core.QueueKeys(queues) // a sharding key for each queue
	for i := range n {
		q := (i * 5) % queues
		_, err := env.Store.Produce(t.Context(), &core.Message{Topic: "lp", ShardingKey: keys[q], Body: []byte(fmt.Sprint(i))})
		require.NoError(t, err)
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		f, err := wire.ReadFrame(nc, 1<<20)
		require.NoError(t, err, "message %d on queue %d not answered within 10 s (the polls wait 30 s)", i, q)
		require.Equal(t, uint64(100+q), f.ID, "message %d", i)
		res, err := wire.DecodePull(f.Payload)
		require.NoError(t, err)
		require.Len(t, res.Messages, 1)
		require.Equal(t, fmt.Sprint(i), string(res.Messages[0].Body))
		next[q] = res.NextOffset
		park(q)
	}
}

// TestLargeAnswersBesideSmallOnes: pull answers of hundreds of KiB (written
// from where they are, beside the batch of small frames) arrive whole and
// in order with the small answers around them.
func TestLargeAnswersBesideSmallOnes(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	_, err := env.Store.CreateTopic(t.Context(), coreTopic("big", 1))
	require.NoError(t, err)
	var bodies [][]byte
	for i := range 6 {
		b := bytes.Repeat([]byte{byte('a' + i)}, 100<<10+i)
		bodies = append(bodies, b)
		_, err := env.Store.Produce(t.Context(), &core.Message{Topic: "big", Body: b})
		require.NoError(t, err)
	}
	nc := helloConn(t, env.Addr)
	var req []byte
	for i := range 6 { // pings between pulls of 1, 2 and 3 messages
		req = wire.AppendFrame(req, wire.Frame{Op: wire.OpPing, ID: uint64(10 + i)})
		if i < 3 {
			req = wire.AppendFrame(req, wire.Frame{Op: wire.OpPull, ID: uint64(20 + i),
				Payload: fmt.Appendf(nil, `{"topic":"big","queue":0,"offset":%d,"max":%d}`, i*(i+1)/2, i+1)})
		}
	}
	_, err = nc.Write(req)
	require.NoError(t, err)
	answers := map[uint64][]*core.StoredMessage{} // handlers answer in any order
	pings := 0
	for pings < 6 || len(answers) < 3 {
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		f, err := wire.ReadFrame(nc, 4<<20)
		require.NoError(t, err)
		require.Zero(t, f.Flags&wire.FlagError, "%s", f.Payload)
		if f.Op == wire.OpPing {
			pings++
			continue
		}
		res, err := wire.DecodePull(f.Payload)
		require.NoError(t, err)
		require.Len(t, res.Messages, int(f.ID-20)+1)
		answers[f.ID] = res.Messages
	}
	var got [][]byte
	for id := uint64(20); id < 23; id++ {
		for _, m := range answers[id] {
			got = append(got, m.Body)
		}
	}
	require.Len(t, got, 6)
	for i := range got {
		require.True(t, bytes.Equal(bodies[i], got[i]), "message %d", i)
	}
}
