package query

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
)

// fixture stores, on a fake clock one second apart, 30 messages of topic
// "tel" (client car-N for i%3, key = client), 5 of topic "other" from car-0
// and returns the store and the times.
func fixture(t *testing.T) (*store.Store, []time.Time) {
	t.Helper()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	st, err := store.Open(t.TempDir(), store.Options{Now: clock, DefaultQueues: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	var times []time.Time
	for i := range 30 {
		c := "car-" + strconv.Itoa(i%3)
		_, err := st.Produce(t.Context(), &core.Message{Topic: "tel", ShardingKey: c, Keys: []string{"order-" + strconv.Itoa(i)},
			Properties: map[string]string{PropClientID: c}, Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
		times = append(times, now)
		now = now.Add(time.Second)
	}
	for i := range 5 {
		_, err := st.Produce(t.Context(), &core.Message{Topic: "other", ShardingKey: "car-0", Properties: map[string]string{PropClientID: "car-0"}, Body: []byte("o" + strconv.Itoa(i))})
		require.NoError(t, err)
		now = now.Add(time.Second)
	}
	return st, times
}

func bodies(msgs []*core.StoredMessage) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, string(m.Body))
	}
	return out
}

// all follows cursors to the end.
func all(t *testing.T, st *store.Store, req Request) [][]string {
	t.Helper()
	var pages [][]string
	for range 100 {
		res, err := Run(t.Context(), st, req)
		require.NoError(t, err)
		pages = append(pages, bodies(res.Messages))
		if res.Next == "" {
			return pages
		}
		req.Cursor = res.Next
	}
	t.Fatal("cursor never ended")
	return nil
}

func TestByKeyPaged(t *testing.T) {
	st, _ := fixture(t)
	pages := all(t, st, Request{Topic: "tel", Key: "car-1", Max: 4})
	require.Equal(t, [][]string{{"1", "4", "7", "10"}, {"13", "16", "19", "22"}, {"25", "28"}}, pages)
	res, err := Run(t.Context(), st, Request{Topic: "tel", Key: "order-7"})
	require.NoError(t, err)
	require.Equal(t, []string{"7"}, bodies(res.Messages), "index keys too")
}

func TestByClientAcrossTopics(t *testing.T) {
	st, times := fixture(t)
	res, err := Run(t.Context(), st, Request{ClientID: "car-0", Max: 100})
	require.NoError(t, err)
	require.Equal(t, []string{"0", "3", "6", "9", "12", "15", "18", "21", "24", "27", "o0", "o1", "o2", "o3", "o4"}, bodies(res.Messages))
	// Bounded by time.
	res, err = Run(t.Context(), st, Request{ClientID: "car-0", Topic: "tel", Begin: times[10], End: times[20]})
	require.NoError(t, err)
	require.Equal(t, []string{"12", "15", "18"}, bodies(res.Messages))
}

func TestByTimeMergesQueues(t *testing.T) {
	st, times := fixture(t)
	pages := all(t, st, Request{Topic: "tel", Begin: times[5], End: times[16], Max: 5})
	require.Equal(t, [][]string{{"5", "6", "7", "8", "9"}, {"10", "11", "12", "13", "14"}, {"15", "16"}}, pages)
	res, err := Run(t.Context(), st, Request{Topic: "tel", Begin: times[28]})
	require.NoError(t, err)
	require.Equal(t, []string{"28", "29"}, bodies(res.Messages))
	require.Empty(t, res.Next)
}

func TestBadRequests(t *testing.T) {
	st, times := fixture(t)
	for _, r := range []Request{
		{},
		{Topic: "tel"},
		{Key: "a", ClientID: "b"},
		{Topic: "tel", Begin: times[5], End: times[1]},
		{Topic: "tel", Key: "car-0", Cursor: "nope"},
	} {
		_, err := Run(t.Context(), st, r)
		require.ErrorIs(t, err, ErrBadRequest, "%+v", r)
	}
	_, err := Run(t.Context(), st, Request{Topic: "missing", Begin: times[0]})
	require.ErrorIs(t, err, core.ErrTopicNotFound)
}
