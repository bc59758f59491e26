package node

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/store"
)

// statsExtra keeps the topics with the most messages and the group rows
// with the most lag, at most 50 of each, with the totals.
func TestStatsExtraBounded(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(t.TempDir(), store.Options{DefaultQueues: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	for i := range maxStatsTopics + 10 {
		name := fmt.Sprintf("t%02d", i)
		for range i % 7 {
			_, err := st.Produce(ctx, &core.Message{Topic: name, Body: []byte("x")})
			require.NoError(t, err)
		}
		if i%7 == 0 {
			_, err := st.CreateTopic(ctx, core.TopicConfig{Name: name})
			require.NoError(t, err)
		}
	}
	g, err := group.New(st, group.Options{})
	require.NoError(t, err)
	g.Start()
	t.Cleanup(func() { _ = g.Close() })
	_, err = g.Heartbeat(ctx, group.HeartbeatRequest{Group: "slow", ClientID: "c1",
		Subscriptions: []group.Subscription{{Topic: "t06"}, {Topic: "t05"}}})
	require.NoError(t, err)
	_, err = g.Heartbeat(ctx, group.HeartbeatRequest{Group: "fans", ClientID: "b1", Mode: group.Broadcast,
		Subscriptions: []group.Subscription{{Topic: "t13"}}})
	require.NoError(t, err)
	_, err = g.Heartbeat(ctx, group.HeartbeatRequest{Group: "fans", ClientID: "b2", Mode: group.Broadcast,
		Subscriptions: []group.Subscription{{Topic: "t13"}}})
	require.NoError(t, err)

	extra := statsExtra(st, g)(ctx)
	topics := extra["topics"].([]TopicStats)
	require.Len(t, topics, maxStatsTopics)
	require.Equal(t, maxStatsTopics+10, extra["topics_total"])
	for i := 1; i < len(topics); i++ {
		require.GreaterOrEqual(t, topics[i-1].Messages, topics[i].Messages)
		if topics[i-1].Messages == topics[i].Messages {
			require.Less(t, topics[i-1].Name, topics[i].Name, "by name within")
		}
	}
	require.Equal(t, int64(6), topics[0].Messages)
	require.Equal(t, 2, topics[0].Queues)

	rows := extra["groups"].([]GroupStats)
	require.Equal(t, len(rows), extra["groups_total"])
	byKey := map[string]GroupStats{}
	for _, r := range rows {
		byKey[r.Group+"/"+r.Topic+"/"+r.Member] = r
	}
	require.Equal(t, int64(6), byKey["slow/t06/"].Lag)
	require.Equal(t, int64(5), byKey["slow/t05/"].Lag)
	require.Equal(t, 2, byKey["slow/t06/"].Queues)
	require.Equal(t, "clustering", byKey["slow/t06/"].Mode)
	require.Equal(t, int64(6), byKey["fans/t13/b1"].Lag, "broadcast: a row per member")
	require.Equal(t, int64(6), byKey["fans/t13/b2"].Lag)
	require.Equal(t, 2, byKey["fans/t13/b2"].Members)
	for i := 1; i < len(rows); i++ {
		require.GreaterOrEqual(t, rows[i-1].Lag, rows[i].Lag)
	}

	// Many groups: the 50 rows with the most lag.
	for i := range maxStatsGroups + 5 {
		_, err = g.Heartbeat(ctx, group.HeartbeatRequest{Group: fmt.Sprintf("g%02d", i), ClientID: "c",
			Subscriptions: []group.Subscription{{Topic: "t00"}}})
		require.NoError(t, err)
	}
	extra = statsExtra(st, g)(ctx)
	rows = extra["groups"].([]GroupStats)
	require.Len(t, rows, maxStatsGroups)
	require.Greater(t, extra["groups_total"], maxStatsGroups)
	require.Equal(t, int64(6), rows[0].Lag)

	// Without a coordinator (and on a closed store) sections are left out.
	require.NoError(t, st.Close())
	extra = statsExtra(st, nil)(ctx)
	require.NotContains(t, extra, "topics")
	require.NotContains(t, extra, "groups")
	require.Equal(t, []string{"topics"}, extra["unavailable"])
}
