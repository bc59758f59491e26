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
	"github.com/ferrymq/ferrymq/core/server"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/wire"
)

// joinGroup makes the connection's client the only member of group g on
// topic, so it holds every queue.
func joinGroup(t *testing.T, nc net.Conn, g, topic string) {
	t.Helper()
	_, err := nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpHeartbeat, ID: 9,
		Payload: fmt.Appendf(nil, `{"group":%q,"client_id":"c1","subscriptions":[{"topic":%q}]}`, g, topic)}))
	require.NoError(t, err)
	f := readFrame(t, nc, 10*time.Second)
	require.Equal(t, uint64(9), f.ID)
	require.Zero(t, f.Flags&wire.FlagError, "heartbeat: %s", f.Payload)
}

// memberConn starts a server with o, creates topic with its queues and
// returns a connection whose client is the only member of group "g" on it.
func memberConn(t *testing.T, o servertest.Options, topic string, queues int) (*servertest.Env, net.Conn) {
	t.Helper()
	env := servertest.Start(t, o)
	_, err := env.Store.CreateTopic(t.Context(), coreTopic(topic, queues))
	require.NoError(t, err)
	nc := helloConn(t, env.Addr)
	joinGroup(t, nc, "g", topic)
	return env, nc
}

func readFrame(t *testing.T, nc net.Conn, within time.Duration) wire.Frame {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(within))
	f, err := wire.ReadFrame(nc, 1<<20)
	require.NoError(t, err)
	return f
}

// readPull reads the next frame, which must answer request id without
// an error, and decodes its pull result.
func readPull(t *testing.T, nc net.Conn, id uint64) (wire.Frame, wire.PullResult) {
	t.Helper()
	f := readFrame(t, nc, 10*time.Second)
	require.Equal(t, id, f.ID)
	require.Zero(t, f.Flags&wire.FlagError, "%s", f.Payload)
	res, err := wire.DecodePull(f.Payload)
	require.NoError(t, err)
	return f, res
}

func streamPull(t *testing.T, nc net.Conn, id uint64, topic string, offset int64, max int, wait time.Duration) {
	t.Helper()
	_, err := nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpGroupPull, ID: id,
		Payload: fmt.Appendf(nil, `{"group":"g","client_id":"c1","topic":%q,"queue":0,"offset":%d,"max":%d,"wait_ms":%d,"stream":true}`,
			topic, offset, max, wait.Milliseconds())}))
	require.NoError(t, err)
}

// TestStreamingGroupPullSendsEachArrival: one streaming pull with Max 4
// gets each of four messages produced one at a time as its own answer, in
// order, FlagMore on all but the last; the stream then ends, so a fifth
// message is not sent on it.
func TestStreamingGroupPullSendsEachArrival(t *testing.T) {
	env, nc := memberConn(t, servertest.Options{}, "st", 1)
	streamPull(t, nc, 20, "st", 0, 4, 30*time.Second)
	for i := range 4 {
		_, err := env.Store.Produce(t.Context(), coreMsg("st", fmt.Sprint(i)))
		require.NoError(t, err)
		f, res := readPull(t, nc, 20) // the stream waits 30 s: only an answer on arrival comes in time
		require.Equal(t, i < 3, f.Flags&wire.FlagMore != 0, "answer %d: FlagMore on all but the last", i)
		require.Len(t, res.Messages, 1, "answer %d", i)
		require.Equal(t, fmt.Sprint(i), string(res.Messages[0].Body))
		require.Equal(t, int64(i), res.Offset)
		require.Equal(t, int64(i+1), res.NextOffset)
	}
	_, err := env.Store.Produce(t.Context(), coreMsg("st", "4"))
	require.NoError(t, err)
	// The stream has ended: a ping is answered, and nothing of it before.
	_, err = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpPing, ID: 21}))
	require.NoError(t, err)
	require.Equal(t, uint64(21), readFrame(t, nc, 10*time.Second).ID)
	_ = nc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	f, err := wire.ReadFrame(nc, 1<<20)
	var ne net.Error
	require.True(t, isTimeout(err, &ne), "nothing more on an ended stream; got frame %d %x", f.ID, f.Flags)
}

// TestStreamingGroupPullLargeAnswersIntact: a stream's answers of 100 KiB
// go out of buffers the connection's writer takes back once written and
// hands out again (answerBuf): every one of 200 answers reaches the client
// with the bytes produced, none overwritten by a later answer before it
// went out. "backlog": the messages are stored first, behind a small tail
// cache, so the stream reads them on the cold path, into run buffers the
// server gives back once it encoded each answer (ReadResult.Release).
func TestStreamingGroupPullLargeAnswersIntact(t *testing.T) {
	for _, backlog := range []bool{false, true} {
		t.Run(map[bool]string{false: "arrivals", true: "backlog"}[backlog], func(t *testing.T) {
			streamLargeAnswers(t, backlog)
		})
	}
}

func streamLargeAnswers(t *testing.T, backlog bool) {
	o := servertest.Options{}
	if backlog {
		o.TailCacheBytes = 1 << 20
	}
	env, nc := memberConn(t, o, "big", 1)
	const n = 200
	before := server.AnswersRecycled()
	body := func(i int) []byte {
		b := make([]byte, 100<<10)
		for j := range b {
			b[j] = byte(i*7 + j*13)
		}
		return b
	}
	produce := func() {
		for i := range n {
			if _, err := env.Store.Produce(context.Background(), &core.Message{Topic: "big", Body: body(i)}); err != nil {
				return
			}
		}
	}
	done := make(chan struct{})
	defer close(done)
	go func() { // the member stays alive however slow the run (-race)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				_, _ = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpHeartbeat, ID: 9,
					Payload: []byte(`{"group":"g","client_id":"c1","subscriptions":[{"topic":"big"}]}`)}))
			}
		}
	}()
	coldBefore := env.Store.Stats().ColdReadBytes
	if backlog {
		produce()
	}
	streamPull(t, nc, 30, "big", 0, n, 30*time.Second)
	if !backlog {
		go produce()
	}
	for got := 0; got < n; {
		f := readFrame(t, nc, 10*time.Second)
		if f.ID == 9 {
			continue // a heartbeat's answer
		}
		require.Equal(t, uint64(30), f.ID)
		require.Zero(t, f.Flags&wire.FlagError, "%s", f.Payload)
		res, err := wire.DecodePull(f.Payload)
		require.NoError(t, err)
		for _, m := range res.Messages {
			require.Equal(t, int64(got), m.QueueOffset)
			require.True(t, string(body(got)) == string(m.Body), "message %d arrived with other bytes", got)
			got++
		}
	}
	require.Greater(t, server.AnswersRecycled(), before, "no answer went out of a recycled buffer")
	if backlog {
		require.Greater(t, env.Store.Stats().ColdReadBytes-coldBefore, int64(10<<20), "the backlog was not read cold")
	}
}

// TestStreamingGroupPullAnswersWhatIsThereAtOnce: messages already stored
// go in the first answer (up to Max), and a backlog past one read's
// worth is sent on without waiting for another arrival.
func TestStreamingGroupPullAnswersWhatIsThereAtOnce(t *testing.T) {
	env, nc := memberConn(t, servertest.Options{}, "st", 1)
	for i := range 3 { // stored before the pull
		_, err := env.Store.Produce(t.Context(), coreMsg("st", fmt.Sprint(i)))
		require.NoError(t, err)
	}
	streamPull(t, nc, 30, "st", 0, 10, 30*time.Second)
	f, res := readPull(t, nc, 30)
	require.NotZero(t, f.Flags&wire.FlagMore, "7 more may come")
	require.Len(t, res.Messages, 3)
	for i := 3; i < 10; i++ {
		_, err := env.Store.Produce(t.Context(), coreMsg("st", fmt.Sprint(i)))
		require.NoError(t, err)
	}
	got := 3
	for got < 10 {
		f, res := readPull(t, nc, 30)
		require.NotEmpty(t, res.Messages)
		require.Equal(t, int64(got), res.Offset)
		got += len(res.Messages)
		require.Equal(t, got < 10, f.Flags&wire.FlagMore != 0, "at %d", got)
	}
	require.Equal(t, 10, got)
}

// TestStreamingGroupPullEndsEmptyAtItsWait: after an answer the stream
// waits its wait again; with nothing arriving its last answer is empty,
// at the offset it reached.
func TestStreamingGroupPullEndsEmptyAtItsWait(t *testing.T) {
	env, nc := memberConn(t, servertest.Options{}, "st", 1)
	streamPull(t, nc, 40, "st", 0, 8, 400*time.Millisecond)
	_, err := env.Store.Produce(t.Context(), coreMsg("st", "x"))
	require.NoError(t, err)
	f, _ := readPull(t, nc, 40)
	require.NotZero(t, f.Flags&wire.FlagMore)
	f, res := readPull(t, nc, 40)
	require.Zero(t, f.Flags&wire.FlagMore)
	require.Empty(t, res.Messages)
	require.Equal(t, int64(1), res.NextOffset)
}

// TestStreamingGroupPullWithinTheInflightBound: each further answer of a
// stream needs an in-flight slot of its own. With MaxInflight 1 the
// stream holds the only one, so its first answer is its last: the
// connection never queues more responses than its bound.
func TestStreamingGroupPullWithinTheInflightBound(t *testing.T) {
	env, nc := memberConn(t, servertest.Options{Server: server.Options{MaxInflight: 1}}, "st", 1)
	streamPull(t, nc, 50, "st", 0, 8, 30*time.Second)
	_, err := env.Store.Produce(t.Context(), coreMsg("st", "x"))
	require.NoError(t, err)
	f, res := readPull(t, nc, 50)
	require.Zero(t, f.Flags&wire.FlagMore, "no slot for a further answer: this one is the last")
	require.Len(t, res.Messages, 1)
}

// countingStore is the store, counting the reads made through it.
type countingStore struct {
	*store.Store
	reads atomic.Int64
}

func (c *countingStore) Read(ctx context.Context, req core.ReadRequest) (core.ReadResult, error) {
	c.reads.Add(1)
	return c.Store.Read(ctx, req)
}

// TestArrivalRereadsOnlyItsQueue: with a stream parked on each of 8
// queues, a message on one queue is read for that queue's stream alone,
// not for all 8 (the holder asks the store where each queue ends before
// reading it again).
func TestArrivalRereadsOnlyItsQueue(t *testing.T) {
	const queues, n = 8, 40
	var cs *countingStore
	env, nc := memberConn(t, servertest.Options{GroupsBroker: func(st *store.Store) core.Broker {
		cs = &countingStore{Store: st}
		return cs
	}}, "lp", queues)
	for q := range queues {
		_, err := nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpGroupPull, ID: uint64(100 + q),
			Payload: fmt.Appendf(nil, `{"group":"g","client_id":"c1","topic":"lp","queue":%d,"offset":0,"max":%d,"wait_ms":30000,"stream":true}`, q, n)}))
		require.NoError(t, err)
	}
	// Each stream's first read (by its handler) finds nothing; the holder
	// does not read again what ends where the stream stands.
	require.Eventually(t, func() bool { return cs.reads.Load() >= queues }, 10*time.Second, 5*time.Millisecond)
	before := cs.reads.Load()
	keys := core.QueueKeys(queues)
	for i := range n {
		q := (i * 3) % queues
		_, err := env.Store.Produce(t.Context(), &core.Message{Topic: "lp", ShardingKey: keys[q], Body: fmt.Append(nil, i)})
		require.NoError(t, err)
		_, res := readPull(t, nc, uint64(100+q))
		require.Len(t, res.Messages, 1)
	}
	reads := cs.reads.Load() - before
	// One read per message, and one more where a try races the next
	// message; every parked stream per message (8 × 40) without the check.
	require.LessOrEqual(t, reads, int64(2*n), "%d reads for %d messages on %d queues", reads, n, queues)
}
