package core_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

func TestBarriersSources(t *testing.T) {
	epochs := []core.Epoch{
		{Queues: 8},
		{Queues: 16, Begin: []int64{10, 11, 12, 13, 14, 15, 16, 17, 0, 0, 0, 0, 0, 0, 0, 0}},
		{Queues: 4, Begin: make([]int64, 16)},
	}
	// Queue 12 of epoch 1 waits for queue 4 (12 mod 8) up to 14 only.
	done := map[int]int64{}
	pos := func(q int) (int64, error) { return done[q], nil }
	at, err := core.Gate(epochs, 12, pos)
	require.NoError(t, err)
	require.Equal(t, int64(0), at, "queue 12 waits at its first offset")
	done[4] = 14
	at, err = core.Gate(epochs, 12, pos)
	require.NoError(t, err)
	require.Equal(t, int64(-1), at, "queue 4 is done up to 14: 12 is open (epoch 2 does not write 12)")
	require.Len(t, core.Barriers(epochs, 12), 1)
	require.Len(t, core.Barriers(epochs, 2), 2)
}

// TestGateKeepsKeyOrder simulates producers writing keys through random
// resizes and a group that reads its queues in a random interleaving, one
// message at a time, committing at once, and taking a message only below
// its queue's gate: every key must come out in the order it went in.
func TestGateKeepsKeyOrder(t *testing.T) {
	for seed := range uint64(300) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			type msg struct {
				key string
				seq int
			}
			counts := []int{1, 2, 3, 4, 5, 6, 8, 12, 16}
			n := counts[rng.IntN(len(counts))]
			epochs := []core.Epoch{{Queues: n}}
			var queues [][]msg
			grow := func(n int) {
				for len(queues) < n {
					queues = append(queues, nil)
				}
			}
			grow(n)
			seq := map[string]int{}
			keys := 20
			for e := 0; e < 5; e++ {
				writes := rng.IntN(60) // an epoch may write nothing
				for range writes {
					k := fmt.Sprintf("k%d", rng.IntN(keys))
					q := core.QueueFor(k, n)
					queues[q] = append(queues[q], msg{k, seq[k]})
					seq[k]++
				}
				n = counts[rng.IntN(len(counts))]
				grow(n)
				begin := make([]int64, len(queues))
				for q := range queues {
					begin[q] = int64(len(queues[q]))
				}
				epochs = append(epochs, core.Epoch{Queues: n, Begin: begin})
			}
			for range rng.IntN(60) {
				k := fmt.Sprintf("k%d", rng.IntN(keys))
				q := core.QueueFor(k, n)
				queues[q] = append(queues[q], msg{k, seq[k]})
				seq[k]++
			}
			committed := make([]int64, len(queues))
			pos := func(q int) (int64, error) { return committed[q], nil }
			next := map[string]int{}
			total := 0
			for _, q := range queues {
				total += len(q)
			}
			for delivered := 0; delivered < total; {
				var ready []int
				for q := range queues {
					if committed[q] >= int64(len(queues[q])) {
						continue
					}
					until, err := core.Gate(epochs, q, pos)
					require.NoError(t, err)
					if until < 0 || committed[q] < until {
						ready = append(ready, q)
					}
				}
				require.NotEmpty(t, ready, "the gates deadlocked with %d of %d delivered", delivered, total)
				q := ready[rng.IntN(len(ready))]
				m := queues[q][committed[q]]
				require.Equal(t, next[m.key], m.seq, "key %s out of order from queue %d", m.key, q)
				next[m.key]++
				committed[q]++
				delivered++
			}
		})
	}
}
