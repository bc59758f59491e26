package devicesim_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/gateway/devicesim"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The simulated device answers calls with its template and logs them.
func TestDeviceAnswersCalls(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	var log lockedBuffer
	d, err := devicesim.Connect(t.Context(), devicesim.Options{Addr: env.TCP, ClientID: "sim-1", Answer: "ok {payload}!", Log: &log})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	a, err := env.Node.RPC().Call(context.Background(), "sim-1", []byte("lights"), 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ok lights!", string(a.Payload))
	require.Eventually(t, func() bool { return bytes.Contains([]byte(log.String()), []byte("answered $rpc/sim-1/response/")) },
		5*time.Second, 10*time.Millisecond, log.String())
}
