// Package shadowtest holds what the tests of device shadows share: one
// story every backend must tell, reading a device's history back from the
// topic, and its checks.
package shadowtest

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/shadow"
)

// Patch decodes a merge patch, failing the test if it does not decode.
func Patch(t testing.TB, s string) map[string]any {
	t.Helper()
	m, err := shadow.DecodePatch([]byte(s), shadow.Limits{})
	require.NoError(t, err)
	return m
}

func jsonOf(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// Exercise runs the same story on any service whose documents are
// limited to 256 bytes: both sides update, the delta follows, stale
// versions conflict, limits hold, delete and re-create go on counting
// versions.
func Exercise(t *testing.T, svc *shadow.Service) {
	t.Helper()
	ctx := t.Context()
	_, err := svc.Get(ctx, "car-1")
	require.ErrorIs(t, err, shadow.ErrNotFound)

	d, err := svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Desired, Patch: Patch(t, `{"temp":21,"lights":{"front":"on"}}`)})
	require.NoError(t, err)
	require.Equal(t, int64(1), d.Version)
	require.JSONEq(t, `{"temp":21,"lights":{"front":"on"}}`, jsonOf(t, d.State.Delta))

	d, err = svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Reported, Patch: Patch(t, `{"temp":21,"lights":{"front":"off"},"rpm":900}`), Version: 1})
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Version)
	require.JSONEq(t, `{"lights":{"front":"on"}}`, jsonOf(t, d.State.Delta))
	require.Contains(t, d.Metadata.Reported, "rpm")

	_, err = svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Desired, Patch: Patch(t, `{"temp":19}`), Version: 1})
	require.ErrorIs(t, err, shadow.ErrVersionConflict, "version 1 is stale")
	require.Contains(t, err.Error(), "at 2")

	big := `{"blob":"` + strings.Repeat("x", 300) + `"}`
	_, err = svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Reported, Patch: Patch(t, big)})
	require.ErrorIs(t, err, shadow.ErrTooLarge)

	d, err = svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Reported, Patch: Patch(t, `{"lights":{"front":"on"}}`)})
	require.NoError(t, err)
	require.Equal(t, int64(3), d.Version)
	require.Nil(t, d.State.Delta, "reported caught up with desired")

	got, err := svc.Get(ctx, "car-1")
	require.NoError(t, err)
	require.Equal(t, d, got)

	_, err = svc.Delete(ctx, "car-1", 2)
	require.ErrorIs(t, err, shadow.ErrVersionConflict)
	v, err := svc.Delete(ctx, "car-1", 3)
	require.NoError(t, err)
	require.Equal(t, int64(4), v)
	_, err = svc.Get(ctx, "car-1")
	require.ErrorIs(t, err, shadow.ErrNotFound)
	_, err = svc.Delete(ctx, "car-1", 0)
	require.ErrorIs(t, err, shadow.ErrNotFound)

	d, err = svc.Update(ctx, "car-1", shadow.Update{Section: shadow.Desired, Patch: Patch(t, `{"temp":18}`)})
	require.NoError(t, err)
	require.Equal(t, int64(5), d.Version, "versions go on after a delete")
	require.Nil(t, d.State.Reported)

	_, err = svc.Get(ctx, "")
	require.ErrorIs(t, err, shadow.ErrBadRequest)
	require.Equal(t, map[shadow.RequestKind]int64{
		{Section: "desired", Outcome: "accepted"}:   2,
		{Section: "reported", Outcome: "accepted"}:  2,
		{Section: "delete", Outcome: "accepted"}:    1,
		{Section: "desired", Outcome: "conflict"}:   1,
		{Section: "delete", Outcome: "conflict"}:    1,
		{Section: "reported", Outcome: "too_large"}: 1,
		{Section: "delete", Outcome: "not_found"}:   1,
	}, svc.Requests(), "every change counted by outcome")
}

// History reads every event of topic, per device in topic order.
func History(t testing.TB, b core.Broker, topic string) map[string][]*shadow.Event {
	t.Helper()
	ctx := t.Context()
	info, err := b.Topic(ctx, topic)
	require.NoError(t, err)
	out := map[string][]*shadow.Event{}
	for q, r := range info.Ranges {
		for off := r.Min; off < r.Max; {
			res, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 256})
			require.NoError(t, err)
			if len(res.Messages) == 0 {
				break
			}
			for _, m := range res.Messages {
				ev, err := shadow.DecodeEvent(m.Body)
				require.NoError(t, err)
				require.Equal(t, ev.ClientID, m.ShardingKey)
				out[ev.ClientID] = append(out[ev.ClientID], ev)
			}
			off = res.NextOffset
		}
	}
	return out
}

// CheckFirstSeen: a device's events hold every version 1..n, each first
// seen after the one before it (a repeat of a version — the bucket
// backend's — may come later: consumers skip what is not newer).
func CheckFirstSeen(t testing.TB, hist []*shadow.Event, n int64) {
	t.Helper()
	var last int64
	for _, ev := range hist {
		if ev.Version <= last {
			continue // a repeat
		}
		require.Equal(t, last+1, ev.Version, "versions first seen in order, none missing")
		last = ev.Version
	}
	require.Equal(t, n, last)
}

// BenchUpdates has 16 parallel callers send reported updates of 1,000
// devices to svc for b.N updates, and reports updates/s.
func BenchUpdates(b *testing.B, svc *shadow.Service) {
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			id := "dev-" + strconv.FormatInt(i%1000, 10)
			_, err := svc.Update(b.Context(), id, shadow.Update{Section: shadow.Reported,
				Patch: map[string]any{"temp": json.Number(strconv.FormatInt(i%40, 10)), "fw": "1.2.3", "pos": map[string]any{"lat": json.Number("52.5"), "lon": json.Number("13.4")}}})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "updates/s")
}
