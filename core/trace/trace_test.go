package trace_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/trace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRecordAndLookup(t *testing.T) {
	st, err := store.Open(t.TempDir(), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	r, err := trace.New(st, trace.Options{Topics: []string{"orders"}, Node: "n1", Flush: "sync"})
	require.NoError(t, err)
	r.Start()
	require.True(t, r.Enabled("orders"))
	require.False(t, r.Enabled("other"))
	require.False(t, r.Enabled(trace.Topic))

	id := core.NewCommitLogID(1, 100, 50)
	other := core.NewCommitLogID(1, 200, 50)
	t0 := time.Now()
	r.Record(trace.Event{ID: id, Hop: trace.HopStored, At: t0.Add(time.Millisecond), Attrs: map[string]string{"topic": "orders"}})
	r.Record(trace.Event{ID: id, Hop: trace.HopPublish, At: t0, Actor: "car-42"})
	r.Record(trace.Event{ID: other, Hop: trace.HopPublish, At: t0})
	r.Record(trace.Event{Hop: trace.HopPublish}) // no ID: ignored
	require.NoError(t, r.Close())                // flushes

	hops, err := trace.Lookup(t.Context(), st, id, 0)
	require.NoError(t, err)
	require.Len(t, hops, 2)
	require.Equal(t, trace.HopPublish, hops[0].Hop, "in time order")
	require.Equal(t, "car-42", hops[0].Actor)
	require.Equal(t, "n1", hops[0].Node)
	require.Equal(t, "orders", hops[1].Attrs["topic"])
	require.Equal(t, "sync", hops[1].Attrs["flush"], "stored hops note the flush policy")
	require.NotContains(t, hops[0].Attrs, "flush")
	written, dropped := r.Stats()
	require.EqualValues(t, 3, written)
	require.Zero(t, dropped)

	// Off: nothing enabled; a nil recorder is a no-op.
	r.SetTopics(false, nil)
	require.False(t, r.Enabled("orders"))
	var none *trace.Recorder
	require.False(t, none.Enabled("orders"))
	none.Record(trace.Event{ID: id, Hop: "x"})
	require.NoError(t, none.Close())
}

func TestRecordNeverBlocks(t *testing.T) {
	st, err := store.Open(t.TempDir(), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	r, err := trace.New(st, trace.Options{All: true, Queue: 4})
	require.NoError(t, err) // not started: nothing drains the queue
	id := core.NewCommitLogID(1, 1, 1)
	for range 100 {
		r.Record(trace.Event{ID: id, Hop: trace.HopStored})
	}
	_, dropped := r.Stats()
	require.EqualValues(t, 96, dropped)
	require.NoError(t, r.Close())
}

func TestIDOfFollowsCopies(t *testing.T) {
	orig := core.NewCommitLogID(1, 10, 10)
	m := &core.StoredMessage{ID: core.NewCommitLogID(1, 99, 10), Message: core.Message{Topic: "%RETRY%g",
		Properties: map[string]string{retry.PropOriginID: orig.String(), retry.PropOriginTopic: "orders"}}}
	require.Equal(t, orig, trace.IDOf(m))
	require.Equal(t, "orders", trace.TopicOf(m))
	d := &core.StoredMessage{ID: core.NewCommitLogID(1, 99, 10), Message: core.Message{Topic: "t",
		Properties: map[string]string{delay.PropID: orig.String()}}}
	require.Equal(t, orig, trace.IDOf(d))
	plain := &core.StoredMessage{ID: orig, Message: core.Message{Topic: "t"}}
	require.Equal(t, orig, trace.IDOf(plain))
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"id":"01000001000000000000006400000032","hop":"stored","at":"2026-11-29T15:00:00Z","attrs":{"topic":"t"}}`))
	f.Add([]byte(`{"hop":""}`))
	f.Add([]byte(strings.Repeat("[", 100)))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := trace.DecodeEvent(b)
		if err == nil && (e.Hop == "" || e.At.IsZero()) {
			t.Fatalf("accepted an event without hop or time")
		}
	})
}

// BenchmarkEnabledOff is the cost tracing adds to the data path when off.
func BenchmarkEnabledOff(b *testing.B) {
	st, err := store.Open(b.TempDir(), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	r, _ := trace.New(st, trace.Options{})
	defer r.Close()
	for b.Loop() {
		if r.Enabled("orders") {
			b.Fatal("on")
		}
	}
}

// Sampling keeps all hops of a sampled message and none of the others, about
// the asked fraction of messages.
func TestSample(t *testing.T) {
	st, err := store.Open(t.TempDir(), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	r, err := trace.New(st, trace.Options{All: true, Sample: 0.1, Queue: 100_000})
	require.NoError(t, err)
	r.Start()
	const n = 2000
	for i := range n {
		id := core.NewCommitLogID(1, int64(i)*64, 64)
		r.Record(trace.Event{ID: id, Hop: trace.HopPublish})
		r.Record(trace.Event{ID: id, Hop: trace.HopStored})
	}
	require.NoError(t, r.Close())
	written, _ := r.Stats()
	require.Zero(t, written%2, "both hops of a message or none")
	require.InDelta(t, n/10, written/2, n/20, "about a tenth of the messages")
}
