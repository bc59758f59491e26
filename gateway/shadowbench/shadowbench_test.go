package shadowbench_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway/node"
	"github.com/ferrymq/ferrymq/gateway/shadowbench"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunCountsBothSides: a short run against a node counts accepted
// updates of both sides, with latencies, and the node holds them.
func TestRunCountsBothSides(t *testing.T) {
	n, err := node.New(t.Context(), node.Options{DataDir: t.TempDir(), Store: store.Options{FlushPolicy: store.FlushSync},
		Core: &node.CoreOptions{Addr: "127.0.0.1:0"}, MQTTAddr: "127.0.0.1:0", Shadows: &shadow.Options{}}, nil)
	require.NoError(t, err)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, n.Shutdown(ctx))
	}()
	var progress bytes.Buffer
	res, err := shadowbench.Run(t.Context(), shadowbench.Options{MQTT: n.Addr("tcp").String(), Core: n.CoreAddr().String(),
		Devices: 3, Backends: 2, Warmup: 100 * time.Millisecond, Duration: 1500 * time.Millisecond, Progress: &progress})
	require.NoError(t, err)
	require.Positive(t, res.Reported.Accepted)
	require.Positive(t, res.Desired.Accepted)
	require.Zero(t, res.Reported.Rejected+res.Desired.Rejected)
	require.Positive(t, res.Reported.P50us)
	require.Contains(t, progress.String(), "reported")
	d, err := n.Shadows().Get(t.Context(), "shadow-bench-0")
	require.NoError(t, err)
	require.GreaterOrEqual(t, d.Version, int64(2), "both sides changed it")
	require.Contains(t, d.State.Desired, "temp")
	require.Contains(t, d.State.Reported, "seq")

	_, err = shadowbench.Run(t.Context(), shadowbench.Options{Duration: time.Second})
	require.Error(t, err, "no devices, no backends")
}
