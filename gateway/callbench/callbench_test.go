package callbench_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway/callbench"
	"github.com/ferrymq/ferrymq/gateway/node"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A short run against a real node: every call is answered by its device
// and counted once; the quantiles are ordered.
func TestRunCallsEveryDevice(t *testing.T) {
	n, err := node.New(t.Context(), node.Options{DataDir: t.TempDir(), Store: store.Options{},
		Core: &node.CoreOptions{Addr: "127.0.0.1:0"}, MQTTAddr: "127.0.0.1:0"}, nil)
	require.NoError(t, err)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, n.Shutdown(ctx))
	}()
	for _, target := range []string{callbench.TargetFerryMQ, callbench.TargetMQTT} {
		r, err := callbench.Run(t.Context(), callbench.Options{Target: target, MQTT: n.Addr("tcp").String(), Core: n.CoreAddr().String(),
			Devices: 20, Rate: 200, Duration: time.Second, Warmup: 200 * time.Millisecond, Prefix: target + "-"})
		require.NoError(t, err, target)
		require.Positive(t, r.Calls, target)
		require.Equal(t, r.Calls, r.Answered, "%s: first error: %s", target, r.FirstError)
		require.Zero(t, r.Timeouts+r.NotConnected+r.Errors, target)
		require.LessOrEqual(t, r.P50, r.P99, target)
		require.LessOrEqual(t, r.P99, r.Max, target)
	}
}
