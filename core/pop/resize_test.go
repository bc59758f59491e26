package pop

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// TestOrderlyPopKeepsKeyOrderAcrossResize: 200 keys written through
// 4 → 12 → 3 queues before anyone pops; two orderly poppers then ack
// what they get, and no key's message is handed out before every earlier
// one of its key was acknowledged (the epoch barrier: a key's new queue
// waits for its old one). Without the barrier the new queues, handed out
// as soon as their turn comes, break that at once.
func TestOrderlyPopKeepsKeyOrderAcrossResize(t *testing.T) {
	const keys, rounds = 200, 6
	e := newEnv(t, "", fastRetry, fastPop)
	ctx := t.Context()
	e.createTopic(t, "ord", 4)
	seq := 0
	for round := range rounds {
		for k := range keys {
			key := "car-" + strconv.Itoa(k)
			_, err := e.b.Produce(ctx, &core.Message{Topic: "ord", ShardingKey: key, Body: []byte(key + "/" + strconv.Itoa(round))})
			require.NoError(t, err)
			seq++
		}
		switch round {
		case 1:
			_, err := e.b.ResizeTopic(ctx, "ord", 12)
			require.NoError(t, err)
		case 3:
			_, err := e.b.ResizeTopic(ctx, "ord", 3)
			require.NoError(t, err)
		}
	}

	var mu sync.Mutex
	next := map[string]int{} // per key: every round below it was acked
	var violation string
	done := 0
	var wg sync.WaitGroup
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for range 2 {
		wg.Go(func() {
			for pctx.Err() == nil {
				got, err := e.s.Pop(pctx, Request{Group: "g", Topic: "ord", Orderly: true, Max: 8, Invisible: 10 * time.Second, Wait: 20 * time.Millisecond})
				if err != nil {
					return
				}
				for _, p := range got {
					key, r, _ := splitBody(string(p.Message.Body))
					mu.Lock()
					if r != next[key] && violation == "" {
						violation = fmt.Sprintf("key %s: round %d handed out, %d not acked yet (queue %d)", key, r, next[key], p.Message.Queue)
					}
					next[key] = max(next[key], r+1)
					done++
					if done == keys*rounds {
						cancel()
					}
					mu.Unlock()
					require.NoError(t, e.s.Ack(ctx, p.Handle))
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, violation)
	require.Equal(t, keys*rounds, done, "every message popped once")
}

func splitBody(body string) (key string, round int, ok bool) {
	for i := len(body) - 1; i >= 0; i-- {
		if body[i] == '/' {
			r, err := strconv.Atoi(body[i+1:])
			return body[:i], r, err == nil
		}
	}
	return body, 0, false
}
