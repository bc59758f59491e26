package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/server"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/core/wire"
)

func dialClient(t testing.TB, addr string) *client.Client {
	t.Helper()
	c, err := client.Dial(t.Context(), client.Options{Addr: addr})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// listDelayed pages through every pending delayed message of topic.
func listDelayed(t require.TestingT, ctx context.Context, c *client.Client, topic string) map[string]wire.Delayed {
	out := map[string]wire.Delayed{}
	req := wire.ListDelayedReq{Topic: topic}
	for {
		page, err := c.ListDelayed(ctx, req)
		require.NoError(t, err)
		for _, d := range page.Pending {
			out[d.ID] = d
		}
		if page.Done {
			return out
		}
		req.Level, req.Offset = page.NextLevel, page.NextOffset
	}
}

// request sends one request on a raw connection and returns its response,
// skipping pushes.
func request(t *testing.T, nc net.Conn, f wire.Frame) wire.Frame {
	t.Helper()
	_, err := nc.Write(wire.AppendFrame(nil, f))
	require.NoError(t, err)
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		r, err := wire.ReadFrame(nc, 1<<20)
		require.NoError(t, err)
		if r.Flags&wire.FlagResponse != 0 {
			require.Equal(t, f.ID, r.ID)
			return r
		}
	}
}

// TestDelayedDeliveryOverTheWire: a message produced with a deliver-at
// time is placed nowhere at first (queue and offset -1), is listed with its
// topic and due time, cannot be read from its topic before it is due and
// can after; a cancelled one is never delivered; cancel and produce refuse
// bad requests with the delay package's sentinels.
func TestDelayedDeliveryOverTheWire(t *testing.T) {
	env := servertest.Start(t, servertest.Options{})
	c := dialClient(t, env.Addr)
	ctx := t.Context()
	const topic = "later"
	_, err := c.CreateTopic(ctx, topic, 1)
	require.NoError(t, err)
	p := c.NewProducer()
	read := func(t require.TestingT) []*core.StoredMessage {
		res, err := c.Pull(ctx, topic, 0, 0, 100, 0)
		require.NoError(t, err)
		return res.Messages
	}

	due := time.Now().Add(1500 * time.Millisecond)
	kept, err := p.Send(ctx, &core.Message{Topic: topic, ShardingKey: "car-1", Tag: "tick", Keys: []string{"k1"},
		Properties: map[string]string{"p": "1"}, Body: []byte("kept"), DeliverAt: due})
	require.NoError(t, err)
	require.Equal(t, topic, kept.Topic)
	require.Equal(t, -1, kept.Queue, "placed only when due")
	require.Equal(t, int64(-1), kept.QueueOffset)
	dropped, err := p.Send(ctx, &core.Message{Topic: topic, Body: []byte("dropped"), DeliverAt: due})
	require.NoError(t, err)
	require.Equal(t, -1, dropped.Queue)

	pending := listDelayed(t, ctx, c, topic)
	require.Len(t, pending, 2)
	d := pending[kept.ID.String()]
	require.Equal(t, topic, d.Topic)
	require.True(t, d.Due.Equal(due), "due %v, want %v", d.Due, due)
	require.Equal(t, "car-1", d.Key)
	require.Equal(t, "tick", d.Tag)
	require.Equal(t, len("kept"), d.Size)
	require.False(t, d.Cancelled)
	require.Empty(t, listDelayed(t, ctx, c, "other-topic"), "the topic filter applies")

	require.True(t, time.Now().Before(due), "the checks below run before the due time")
	require.Empty(t, read(t), "not readable before it is due")

	t.Run("cancel", func(t *testing.T) {
		got, err := c.CancelDelayed(ctx, dropped.ID)
		require.NoError(t, err)
		require.Equal(t, dropped.ID.String(), got.ID)
		require.Equal(t, topic, got.Topic)
		require.True(t, got.Due.Equal(due))
		require.True(t, got.Cancelled)
		_, err = c.CancelDelayed(ctx, dropped.ID)
		require.ErrorIs(t, err, delay.ErrAlreadyCancelled)
		require.NotContains(t, listDelayed(t, ctx, c, topic), dropped.ID.String(), "a cancelled message is not listed")
	})
	t.Run("cancel refusals", func(t *testing.T) {
		plain, err := p.Send(ctx, &core.Message{Topic: "plain", Body: []byte("now")})
		require.NoError(t, err)
		_, err = c.CancelDelayed(ctx, plain.ID)
		require.ErrorIs(t, err, delay.ErrNotDelayed)
		_, err = c.CancelDelayed(ctx, core.MessageID{})
		require.ErrorIs(t, err, core.ErrMessageNotFound)
		forged := core.NewCommitLogID(kept.ID.StoreID(), kept.ID.Offset()+1<<30, kept.ID.Size())
		_, err = c.CancelDelayed(ctx, forged)
		require.ErrorIs(t, err, core.ErrMessageNotFound)

		// A malformed ID cannot be built with the client: raw frames.
		nc := helloConn(t, env.Addr)
		for i, id := range []string{"", "xyz", strings.Repeat("g", 32), kept.ID.String() + "00"} {
			r := request(t, nc, wire.Frame{Op: wire.OpCancelDelay, ID: uint64(10 + i), Payload: fmt.Appendf(nil, `{"id":%q}`, id)})
			require.NotZero(t, r.Flags&wire.FlagError, "id %q", id)
			require.Equal(t, wire.CodeBadRequest, wire.DecodeError(r.Payload).Code, "id %q", id)
		}
	})
	t.Run("deliver-at out of bounds", func(t *testing.T) {
		_, err := p.Send(ctx, &core.Message{Topic: topic, Body: []byte("far"), DeliverAt: time.Now().Add(41 * 24 * time.Hour)})
		require.ErrorIs(t, err, delay.ErrDelayTooLong)
		_, err = p.Send(ctx, &core.Message{Topic: topic, Body: []byte("past"), DeliverAt: time.Now().Add(-time.Hour)})
		require.ErrorIs(t, err, delay.ErrDeliverAtPast)
		require.Len(t, listDelayed(t, ctx, c, topic), 1, "nothing scheduled")
	})

	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		require.Len(ct, read(ct), 1)
	}, 5*time.Second, 10*time.Millisecond, "delivered when due")
	m := read(t)[0]
	require.False(t, m.StoredAt.Before(due), "stored at %v, due %v", m.StoredAt, due)
	require.True(t, m.DeliverAt.Equal(due))
	require.Equal(t, "kept", string(m.Body))
	require.Equal(t, "car-1", m.ShardingKey)
	require.Equal(t, "tick", m.Tag)
	require.Equal(t, []string{"k1"}, m.Keys)
	require.Equal(t, "1", m.Properties["p"])
	require.Equal(t, kept.ID.String(), m.Properties[delay.PropID], "traceable to the ID its producer got")
	for k := range m.Properties {
		if k != delay.PropID {
			require.False(t, strings.HasPrefix(k, "delay."), "waiting property %s left on the delivered message", k)
		}
	}

	// The cancelled copy is dropped, not delivered.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		st, err := env.Delay.Stats(ctx)
		require.NoError(ct, err)
		require.Equal(ct, int64(1), st.Dropped)
		require.Equal(ct, int64(1), st.Delivered)
	}, 5*time.Second, 10*time.Millisecond)
	require.Len(t, read(t), 1, "the cancelled message was never delivered")
	require.Empty(t, listDelayed(t, ctx, c, topic))
	_, err = c.CancelDelayed(ctx, kept.ID)
	require.ErrorIs(t, err, delay.ErrAlreadyDue)
}

// TestCheckBackPushOnTheWire speaks the transaction protocol by hand: a
// connection naming its producer group in the hello gets the check-back as
// a push frame (ID 0) holding the half; an OpTxnRegister without the group
// withdraws it, and further checks wait, uncounted, for a producer.
func TestCheckBackPushOnTheWire(t *testing.T) {
	// First check after 200 ms, then every 300 ms: room to withdraw the
	// group between the first and the second.
	const checkEvery = 300 * time.Millisecond
	env := servertest.Start(t, servertest.Options{Txn: txn.Options{CheckInterval: checkEvery}})
	nc, err := net.Dial("tcp", env.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	_, err = nc.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpHello, ID: 1,
		Payload: []byte(`{"version":1,"producer_groups":["pg"]}`)}))
	require.NoError(t, err)
	f, err := wire.ReadFrame(nc, 1<<20)
	require.NoError(t, err)
	require.Zero(t, f.Flags&wire.FlagError)

	half, err := wire.EncodeTxnHalf("pg", &core.Message{Topic: "real", Body: []byte("half")})
	require.NoError(t, err)
	r := request(t, nc, wire.Frame{Op: wire.OpTxnHalf, ID: 2, Payload: half})
	require.Zero(t, r.Flags&wire.FlagError, "%v", wire.DecodeError(r.Payload))
	res, err := wire.DecodeSendResults(r.Payload)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, -1, res[0].Queue)

	// The check-back arrives after the first check time (200 ms).
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	push, err := wire.ReadFrame(nc, 1<<20)
	require.NoError(t, err)
	require.Equal(t, wire.OpCheckTxn, push.Op)
	require.Equal(t, wire.FlagPush, push.Flags)
	require.Zero(t, push.ID)
	msgs, err := wire.DecodeStored(push.Payload)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, res[0].ID, msgs[0].ID)
	require.Equal(t, "real", msgs[0].Properties[txn.PropTopic])
	require.Equal(t, "pg", msgs[0].Properties[txn.PropGroup])
	require.Equal(t, "half", string(msgs[0].Body))

	// The service counts the check once it has handed it over, which may
	// be a moment after the push reached us.
	require.Eventually(t, func() bool {
		list := env.Txn.Pending()
		return len(list) == 1 && list[0].Checks == 1
	}, 2*time.Second, time.Millisecond)
	// Withdraw the group: no more check-backs here, and none counted.
	r = request(t, nc, wire.Frame{Op: wire.OpTxnRegister, ID: 3, Payload: []byte(`{"groups":[]}`)})
	require.Zero(t, r.Flags&wire.FlagError, "%v", wire.DecodeError(r.Payload))
	require.Never(t, func() bool {
		list := env.Txn.Pending()
		return len(list) != 1 || list[0].Checks != 1
	}, 4*checkEvery, 20*time.Millisecond, "unchecked while no producer of its group is registered")
	list := env.Txn.Pending()
	require.Len(t, list, 1)
	require.True(t, list[0].Waiting, "due, and waiting for a producer")

	// Register again and commit the check-back that follows.
	r = request(t, nc, wire.Frame{Op: wire.OpTxnRegister, ID: 4, Payload: []byte(`{"groups":["pg"]}`)})
	require.Zero(t, r.Flags&wire.FlagError)
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	push, err = wire.ReadFrame(nc, 1<<20)
	require.NoError(t, err)
	require.Equal(t, wire.OpCheckTxn, push.Op)
	end, err := json.Marshal(wire.TxnEndReq{ID: res[0].ID.String(), Group: "pg", Action: wire.TxnCommit, FromCheck: true})
	require.NoError(t, err)
	r = request(t, nc, wire.Frame{Op: wire.OpTxnEnd, ID: 5, Payload: end})
	require.Zero(t, r.Flags&wire.FlagError, "%v", wire.DecodeError(r.Payload))
	committed, err := wire.DecodeSendResults(r.Payload)
	require.NoError(t, err)
	require.Len(t, committed, 1)
	require.Equal(t, 0, committed[0].Queue)
	require.Empty(t, env.Txn.Pending())

	// A hello naming an invalid group is refused.
	bad, err := net.Dial("tcp", env.Addr)
	require.NoError(t, err)
	defer bad.Close()
	_, err = bad.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpHello, ID: 1, Payload: []byte(`{"version":1,"producer_groups":["no spaces"]}`)}))
	require.NoError(t, err)
	_ = bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err = wire.ReadFrame(bad, 1<<20)
	require.NoError(t, err)
	require.NotZero(t, f.Flags&wire.FlagError)
	require.Equal(t, wire.CodeInvalidGroup, wire.DecodeError(f.Payload).Code)
}

// startPlain runs a server without delayed delivery and transactions, as a
// gateway without them would.
func startPlain(t *testing.T) string {
	t.Helper()
	st, err := store.Open(t.TempDir(), store.Options{IndexSlots: 1 << 12, IndexEntries: 1 << 16})
	require.NoError(t, err)
	gc, err := group.New(st, group.Options{})
	require.NoError(t, err)
	gc.Start()
	rs, err := retry.New(st, retry.Options{})
	require.NoError(t, err)
	rs.Start()
	ps, err := pop.New(st, rs, pop.Options{})
	require.NoError(t, err)
	ps.Start()
	srv, err := server.New(server.Options{Addr: "127.0.0.1:0", Broker: st, Groups: gc, Retry: rs, Pop: ps})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = ps.Close()
		_ = rs.Close()
		_ = gc.Close()
		_ = st.Close()
	})
	return srv.Addr().String()
}

// TestDelayAndTxnNotEnabled: a server run without the delay and
// transaction services refuses their operations with ErrNotEnabled, and a
// hello naming producer groups.
func TestDelayAndTxnNotEnabled(t *testing.T) {
	addr := startPlain(t)
	c := dialClient(t, addr)
	ctx := t.Context()

	_, err := c.CancelDelayed(ctx, core.MessageID{1})
	require.ErrorIs(t, err, wire.ErrNotEnabled)
	_, err = c.ListDelayed(ctx, wire.ListDelayedReq{})
	require.ErrorIs(t, err, wire.ErrNotEnabled)
	_, err = c.PendingTransactions(ctx)
	require.ErrorIs(t, err, wire.ErrNotEnabled)
	_, err = c.NewTransactionProducer(ctx, "pg", func(context.Context, *core.StoredMessage) client.TxnAction { return client.Commit })
	require.ErrorIs(t, err, wire.ErrNotEnabled)

	nc := helloConn(t, addr)
	half, err := wire.EncodeTxnHalf("pg", &core.Message{Topic: "t", Body: []byte("x")})
	require.NoError(t, err)
	end, err := json.Marshal(wire.TxnEndReq{ID: core.MessageID{1}.String(), Group: "pg", Action: wire.TxnCommit})
	require.NoError(t, err)
	for i, f := range []wire.Frame{
		{Op: wire.OpTxnHalf, Payload: half},
		{Op: wire.OpTxnEnd, Payload: end},
		{Op: wire.OpTxnRegister, Payload: []byte(`{"groups":["pg"]}`)},
		{Op: wire.OpCancelDelay, Payload: []byte(`{"id":"` + core.MessageID{1}.String() + `"}`)},
	} {
		f.ID = uint64(2 + i)
		r := request(t, nc, f)
		require.NotZero(t, r.Flags&wire.FlagError, "op %s", f.Op)
		require.ErrorIs(t, wire.DecodeError(r.Payload), wire.ErrNotEnabled, "op %s", f.Op)
	}

	raw, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer raw.Close()
	_, err = raw.Write(wire.AppendFrame(nil, wire.Frame{Op: wire.OpHello, ID: 1, Payload: []byte(`{"version":1,"producer_groups":["pg"]}`)}))
	require.NoError(t, err)
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := wire.ReadFrame(raw, 1<<20)
	require.NoError(t, err)
	require.NotZero(t, f.Flags&wire.FlagError)
	require.ErrorIs(t, wire.DecodeError(f.Payload), wire.ErrNotEnabled)

	// Plain produce and consume still work.
	_, err = c.NewProducer().Send(ctx, &core.Message{Topic: "t", Body: []byte("fine")})
	require.NoError(t, err)
}
