package gateway_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// admitN is a Limiter that admits the first n sockets at a time (the auth
// package's quotas do the same per IP).
type admitN struct {
	n, open atomic.Int64
}

func (a *admitN) AllowPublish(*engine.Client, string, int) (engine.ReasonCode, time.Duration, bool) {
	return engine.Success, 0, false
}

func (a *admitN) AllowSubscription(*engine.Client, string, int) engine.ReasonCode {
	return engine.Success
}

func (a *admitN) Admit(string) (func(), error) {
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

// A Limiter refuses sockets before a byte is read; released slots are
// reused.
func TestAdmitterRefusesBeforeReading(t *testing.T) {
	a := &admitN{}
	a.n.Store(1)
	env := gatewaytest.Start(t, gatewaytest.Options{Gateway: gateway.Options{Hooks: engine.Hooks{Limits: a}}})
	first := rawConn(t, env.TCP, connectV4("first"))
	second := rawConn(t, env.TCP, nil)
	requireClosed(t, second, 5*time.Second)
	require.NoError(t, first.Close())
	require.Eventually(t, func() bool { return a.open.Load() == 0 }, 5*time.Second, 10*time.Millisecond)
	rawConn(t, env.TCP, connectV4("third"))
}
