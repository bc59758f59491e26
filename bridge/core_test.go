package bridge

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
)

// TestEmbeddedBroadcastKeepsKeyOrderAcrossResize: the downlink reader of a
// gateway with its own store reads a command topic resized 4 → 8 → 2 while
// it held a backlog: every device gets its commands in the order they were
// sent, and the commands left in the retired queues are delivered too.
func TestEmbeddedBroadcastKeepsKeyOrderAcrossResize(t *testing.T) {
	ctx := t.Context()
	s, err := store.Open(t.TempDir(), store.Options{IndexSlots: 64, IndexEntries: 4096})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	const topic, devices, rounds = "commands", 60, 6
	_, err = s.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 4})
	require.NoError(t, err)
	since := time.Now().Add(-time.Second)
	for r := range rounds {
		for d := range devices {
			key := "car-" + strconv.Itoa(d)
			_, err := s.Produce(ctx, &core.Message{Topic: topic, ShardingKey: key, Body: fmt.Appendf(nil, "%s/%d", key, r)})
			require.NoError(t, err)
		}
		switch r {
		case 1:
			_, err = s.ResizeTopic(ctx, topic, 8)
		case 3:
			_, err = s.ResizeTopic(ctx, topic, 2)
		}
		require.NoError(t, err)
	}

	var mu sync.Mutex
	next := map[string]int{}
	var violation string
	got := 0
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Embedded(s).Broadcast(rctx, topic, "node-1", "node-1", since, func(_ context.Context, m *core.StoredMessage) {
			key, r, _ := strings.Cut(string(m.Body), "/")
			round, _ := strconv.Atoi(r)
			mu.Lock()
			defer mu.Unlock()
			if round != next[key] && violation == "" {
				violation = fmt.Sprintf("%s: command %d delivered, %d expected (queue %d)", key, round, next[key], m.Queue)
			}
			next[key] = round + 1
			got++
		})
	}()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got >= devices*rounds
	}, 30*time.Second, 10*time.Millisecond)
	cancel()
	<-done
	require.Empty(t, violation)
	require.Equal(t, devices*rounds, got, "each command once")
}
