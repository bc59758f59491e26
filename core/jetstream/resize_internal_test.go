package jetstream

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// TestResizeLeftHalfDoneIsFinished: the node resizing a topic dies after
// one of the resize's steps — after the intent (the stream already refuses
// the old subjects), after the marker, after the commit — still holding
// the resize lock. Another node that still has the old queue count
// produces: it is refused, reads the new epoch (begun or committed) and
// its message lands under the new count at once, without an error; it
// finds the resize unfinished, takes the lock once it expires and
// finishes it in the background. The history is the one a whole resize
// writes: each queue's Begin one past its last message, and a node opened
// afterwards (a restart) reads the same; once committed, the message is
// read where its result said.
func TestResizeLeftHalfDoneIsFinished(t *testing.T) {
	for _, step := range []string{"intent", "marker", "commit"} {
		t.Run("after-"+step, func(t *testing.T) {
			ctx := t.Context()
			s := natstest.RunServer(t, natstest.SyncAlways())
			open := func() *Engine { return openEngine(t, s.URL, 500*time.Millisecond) }
			dead, live := open(), open()
			_, err := dead.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 8})
			require.NoError(t, err)
			want := make([]int64, 16)
			for i := range 40 {
				res, err := live.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k" + strconv.Itoa(i), Body: []byte("old")})
				require.NoError(t, err)
				want[res.Queue] = res.QueueOffset + 1
			}

			dieDuringResize(t, dead, "t", 16, step)
			require.NoError(t, dead.Close())

			start := time.Now()
			res, err := live.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k1", Body: []byte("new")})
			require.NoError(t, err)
			t.Logf("the produce that found the resize after %s returned in %v", step, time.Since(start))
			require.Equal(t, core.QueueFor("k1", 16), res.Queue)
			if step != "commit" {
				// Acknowledged under the new count while the epoch is only
				// begun: the produce did not wait for the resize to be
				// finished (the dead node's lock expires 1.5 s after the
				// resize began; the produce takes 0.5 s).
				info, err := live.Topic(ctx, "t")
				require.NoError(t, err)
				require.Len(t, info.Epochs, 1, "the produce waited for the commit")
			}
			got, err := live.Get(ctx, res.ID)
			require.NoError(t, err, "an acknowledged message of the epoch begun is found by its ID before the commit")
			require.Equal(t, "new", string(got.Body))

			var info core.TopicInfo
			require.Eventually(t, func() bool {
				info, err = live.Topic(ctx, "t")
				require.NoError(t, err)
				return len(info.Epochs) == 2
			}, 15*time.Second, 20*time.Millisecond, "the resize left half done was not finished")
			require.Equal(t, 16, info.Queues)
			require.Equal(t, want, info.Epochs[1].Begin)
			read, err := live.Read(ctx, core.ReadRequest{Topic: "t", Queue: res.Queue, Offset: info.Epochs[1].Begin[res.Queue]})
			require.NoError(t, err)
			require.Len(t, read.Messages, 1)
			require.Equal(t, res.ID, read.Messages[0].ID)
			restarted := open()
			again, err := restarted.Topic(ctx, "t")
			require.NoError(t, err)
			require.Equal(t, info.Epochs, again.Epochs)
			got, err = restarted.Get(ctx, res.ID)
			require.NoError(t, err)
			require.Equal(t, "new", string(got.Body))
			require.Equal(t, res.Queue, got.Queue)
		})
	}
}

// openEngine opens an engine on the server at url, as one node does, with
// the request timeout given; it is closed when the test ends.
func openEngine(t testing.TB, url string, timeout time.Duration) *Engine {
	t.Helper()
	e, err := Open(t.Context(), Options{URLs: []string{url}, Timeout: timeout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// dieDuringResize runs a resize of e's topic up to step and stops there
// as a node that died would: the lock held, nothing cleaned up.
func dieDuringResize(t *testing.T, e *Engine, name string, queues int, step string) {
	t.Helper()
	ctx := context.Background()
	tp, err := e.topic(ctx, name, false)
	require.NoError(t, err)
	info, lay, err := e.info(ctx, tp)
	require.NoError(t, err)
	lk, err := e.lockResize(ctx, tp, true)
	require.NoError(t, err)
	intent := lay.withIntent(queues, time.Now())
	info, err = e.updateStream(ctx, tp, info, intent)
	require.NoError(t, err)
	if step == "intent" {
		return
	}
	marker, err := e.publishMarker(ctx, tp, intent.cur()+1)
	require.NoError(t, err)
	if step == "marker" {
		return
	}
	begin, err := e.boundaries(ctx, tp, intent, marker)
	require.NoError(t, err)
	require.NoError(t, lk.renew(ctx))
	_, err = e.updateStream(ctx, tp, info, intent.committed(marker, begin))
	require.NoError(t, err)
	require.Equal(t, "commit", step, fmt.Sprintf("unknown step %q", step))
}

// TestLateOldMessageDoesNotHideNewEpoch: what JetStream does not close
// (resize.go) — a message of the ended epoch stored after one of the new
// epoch in the same queue, made here by letting the stream take the ended
// epoch's subjects again for a moment. The boundary is set below the new
// epoch's message, so a reader of the queue gets it; the late one is left
// unread (logged) rather than hiding an acknowledged message.
func TestLateOldMessageDoesNotHideNewEpoch(t *testing.T) {
	ctx := t.Context()
	s := natstest.RunServer(t)
	e := openEngine(t, s.URL, time.Second)
	_, err := e.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 4})
	require.NoError(t, err)
	_, err = e.ResizeTopic(ctx, "t", 8) // epoch 1: subjects fmq.<tok>.<q>.1
	require.NoError(t, err)
	const q = 3
	key := ""
	for k := 0; key == ""; k++ {
		if c := "car-" + strconv.Itoa(k); core.QueueFor(c, 8) == q {
			key = c
		}
	}
	old, err := e.Produce(ctx, &core.Message{Topic: "t", ShardingKey: key, Body: []byte("old")})
	require.NoError(t, err)
	require.Equal(t, q, old.Queue)

	tp, err := e.topic(ctx, "t", false)
	require.NoError(t, err)
	info, lay, err := e.info(ctx, tp)
	require.NoError(t, err)
	lk, err := e.lockResize(ctx, tp, true)
	require.NoError(t, err)
	intent := lay.withIntent(8, time.Now()) // epoch 2, the same queue numbers
	info, err = e.updateStream(ctx, tp, info, intent)
	require.NoError(t, err)
	record := func(body string) []byte {
		b, err := encodeRecord(&core.Message{Topic: "t", ShardingKey: key, Body: []byte(body)}, time.Now())
		require.NoError(t, err)
		return b
	}
	newer, err := e.js.Publish(ctx, queueSubject(tp.tok, q, 2), record("new"))
	require.NoError(t, err)
	cfg := info.Config
	cfg.Subjects = append(slices.Clone(cfg.Subjects), epochPattern(tp.tok, 1))
	_, err = e.js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	late, err := e.js.Publish(ctx, queueSubject(tp.tok, q, 1), record("late"))
	require.NoError(t, err)
	require.Greater(t, late.Sequence, newer.Sequence)
	_, err = e.js.UpdateStream(ctx, info.Config)
	require.NoError(t, err)

	info2, done, err := e.complete(ctx, tp, lk, nil, info, intent)
	require.NoError(t, err)
	lk.release()
	require.Nil(t, done.intent)
	require.Len(t, topicInfo(tp, info2, done).Epochs, 3)
	require.Equal(t, int64(newer.Sequence)-1, done.epochs[2].Begin[q], "the boundary is below the new epoch's message")
	res, err := e.Read(ctx, core.ReadRequest{Topic: "t", Queue: q, Offset: old.QueueOffset})
	require.NoError(t, err)
	var bodies []string
	for _, m := range res.Messages {
		bodies = append(bodies, string(m.Body))
	}
	require.Equal(t, []string{"old", "new"}, bodies)
}

// TestReplayFromTimeDuringAnIntent: a group reset to a time while an
// epoch is begun but not committed gets an offset at or below the
// messages already stored in the new epoch, so once readers follow it
// they read them (the range's end, which an offset past the ended
// epoch's messages would be, lies above them).
func TestReplayFromTimeDuringAnIntent(t *testing.T) {
	ctx := t.Context()
	s := natstest.RunServer(t)
	open := func() *Engine { return openEngine(t, s.URL, 500*time.Millisecond) }
	dead, live := open(), open()
	_, err := dead.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 8})
	require.NoError(t, err)
	key := ""
	for k := 0; key == ""; k++ { // a key in a queue both counts have
		if c := "car-" + strconv.Itoa(k); core.QueueFor(c, 16) < 8 {
			key = c
		}
	}
	_, err = live.Produce(ctx, &core.Message{Topic: "t", ShardingKey: key, Body: []byte("old")})
	require.NoError(t, err)
	dieDuringResize(t, dead, "t", 16, "marker")
	require.NoError(t, dead.Close())

	at := time.Now()
	res, err := live.Produce(ctx, &core.Message{Topic: "t", ShardingKey: key, Body: []byte("new")})
	require.NoError(t, err)
	off, err := live.OffsetAt(ctx, "t", res.Queue, at)
	require.NoError(t, err)
	require.LessOrEqual(t, off, res.QueueOffset, "replay from a time would pass a message of the begun epoch by")

	require.Eventually(t, func() bool {
		info, err := live.Topic(ctx, "t")
		require.NoError(t, err)
		return len(info.Epochs) == 2
	}, 15*time.Second, 20*time.Millisecond, "the resize left half done was not finished")
	read, err := live.Read(ctx, core.ReadRequest{Topic: "t", Queue: res.Queue, Offset: off})
	require.NoError(t, err)
	require.NotEmpty(t, read.Messages)
	require.Equal(t, res.ID, read.Messages[0].ID)
}

// TestMarkerIsNoMessage: an ID that names an epoch marker's sequence is
// not found, as an ID of a deleted message.
func TestMarkerIsNoMessage(t *testing.T) {
	ctx := t.Context()
	s := natstest.RunServer(t)
	e := openEngine(t, s.URL, time.Second)
	_, err := e.Produce(ctx, &core.Message{Topic: "t", Body: []byte("x")})
	require.NoError(t, err)
	_, err = e.ResizeTopic(ctx, "t", 3)
	require.NoError(t, err)
	tp, err := e.topic(ctx, "t", false)
	require.NoError(t, err)
	marker := tp.lay.Load().epochs[1].Marker
	_, err = e.Get(ctx, newID("t", marker))
	require.ErrorIs(t, err, core.ErrMessageNotFound)
}

// TestResizeWithLargeMessages: the boundaries are read as the last message
// of each queue, whole: 20 queues whose last messages are at the message
// limit are read in batches the server does not cut short.
func TestResizeWithLargeMessages(t *testing.T) {
	ctx := t.Context()
	e := openSized(t, natstest.RunServer(t).URL, Options{})
	_, err := e.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 20})
	require.NoError(t, err)
	want := make([]int64, 20)
	for q := range 20 {
		m := sizedMessage(t, core.DefaultMaxMessageBytes, byte('a'+q))
		for k := 0; ; k++ { // a key of queue q
			if m.ShardingKey = "car-" + strconv.Itoa(k); core.QueueFor(m.ShardingKey, 20) == q {
				break
			}
		}
		res, err := e.Produce(ctx, m)
		require.NoError(t, err)
		want[q] = res.QueueOffset + 1
	}
	info, err := e.ResizeTopic(ctx, "t", 3)
	require.NoError(t, err)
	require.Equal(t, want, info.Epochs[1].Begin)
}

// TestFenceAnswersAfterASecondResize: a node with a stale queue count is
// refused by the resizing node's fence, which reads (and caches) the
// stream's subjects to do so; the topic is resized again before that
// cache expires, and the stale node publishes with the count it learned,
// which the second resize ended. The fence must refuse that publish too —
// it let go instead (the cached subjects said the stream still took it),
// left it unanswered, and the producer timed out (CI:
// TestServicesGroupAcrossResize). The cache is made to last an hour so the
// interleaving does not depend on the machine's speed.
func TestFenceAnswersAfterASecondResize(t *testing.T) {
	ctx := t.Context()
	s := natstest.RunServer(t, natstest.SyncAlways())
	open := func() *Engine { return openEngine(t, s.URL, 2*time.Second) }
	resizer, stale := open(), open()
	resizer.subjectsTTL = time.Hour
	_, err := resizer.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 2})
	require.NoError(t, err)
	produce := func(round int) {
		t.Helper()
		for k := range 8 {
			res, err := stale.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k" + strconv.Itoa(k), Body: fmt.Appendf(nil, "%d", round)})
			require.NoError(t, err, "round %d key %d", round, k)
			info, err := resizer.Topic(ctx, "t")
			require.NoError(t, err)
			require.Equal(t, core.QueueFor("k"+strconv.Itoa(k), info.Queues), res.Queue)
		}
	}
	produce(0) // stale learns 2 queues
	for round, n := range []int{4, 8, 3} {
		_, err := resizer.ResizeTopic(ctx, "t", n)
		require.NoError(t, err)
		before := stale.republished.Load()
		produce(round + 1)
		require.Positive(t, stale.republished.Load()-before, "round %d: the stale node was refused and published again", round+1)
	}
}
