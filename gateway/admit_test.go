package gateway_test

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// admitN is a hook that admits the first n sockets at a time (the auth
// package's quotas implement the same interface).
type admitN struct {
	mqtt.HookBase
	n, open atomic.Int64
}

func (a *admitN) ID() string { return "admit-n" }

func (a *admitN) AdmitConnection(net.Addr) (func(), error) {
	if a.open.Add(1) > a.n.Load() {
		a.open.Add(-1)
		return nil, errors.New("too many connections")
	}
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			a.open.Add(-1)
		}
	}, nil
}

// A hook implementing gateway.Admitter refuses sockets before a byte is
// read; released slots are reused.
func TestAdmitterRefusesBeforeReading(t *testing.T) {
	a := &admitN{}
	a.n.Store(1)
	var _ gateway.Admitter = a
	env := gatewaytest.Start(t, gatewaytest.Options{Gateway: gateway.Options{Hooks: []mqtt.Hook{a}}})
	first := rawConn(t, env.TCP, connectV4("first"))
	second := rawConn(t, env.TCP, nil)
	requireClosed(t, second, 5*time.Second)
	require.NoError(t, first.Close())
	require.Eventually(t, func() bool { return a.open.Load() == 0 }, 5*time.Second, 10*time.Millisecond)
	rawConn(t, env.TCP, connectV4("third"))
}
