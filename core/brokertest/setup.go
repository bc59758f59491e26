package brokertest

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// createTopic creates a topic with n queues (0: the default).
func createTopic(t testing.TB, b core.Broker, name string, n int) core.TopicInfo {
	t.Helper()
	info, err := b.CreateTopic(t.Context(), core.TopicConfig{Name: name, Queues: n})
	require.NoError(t, err, "create topic %s", name)
	if n > 0 {
		require.Equal(t, n, info.Queues)
	}
	return info
}

func produce(t testing.TB, b core.Broker, m *core.Message) core.SendResult {
	t.Helper()
	r, err := b.Produce(t.Context(), m)
	require.NoError(t, err, "produce to %s", m.Topic)
	return r
}

// produceAsync produces msgs with ProduceAsync and waits for done.
func produceAsync(t testing.TB, b core.Broker, msgs []*core.Message) []core.SendResult {
	t.Helper()
	res, err := awaitAsync(t, b, msgs)
	require.NoError(t, err, "ProduceAsync")
	require.Len(t, res, len(msgs), "ProduceAsync: one result per message")
	return res
}

// awaitAsync produces msgs with ProduceAsync and returns what done was
// called with, failing the test only if done is never called.
func awaitAsync(t testing.TB, b core.Broker, msgs []*core.Message) ([]core.SendResult, error) {
	t.Helper()
	type answer struct {
		res []core.SendResult
		err error
	}
	done := make(chan answer, 1)
	b.ProduceAsync(msgs, func(res []core.SendResult, err error) {
		select { // never block an engine goroutine, even if done runs twice
		case done <- answer{res, err}:
		default:
		}
	})
	select {
	case a := <-done:
		return a.res, a.err
	case <-time.After(wait):
		require.FailNow(t, "ProduceAsync never called done")
		return nil, nil
	}
}

// keysForQueues returns n sharding keys, the q-th of which core.QueueFor
// puts in queue q of n.
func keysForQueues(n int) []string {
	keys := make([]string, n)
	found := 0
	for i := 0; found < n; i++ {
		k := "key-" + strconv.Itoa(i)
		if q := core.QueueFor(k, n); keys[q] == "" {
			keys[q] = k
			found++
		}
	}
	return keys
}
