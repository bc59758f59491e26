package jetstream_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// TestMain checks that every engine, election and server the tests open is
// gone when they end (the in-process nats-servers stop with their tests).
func TestMain(m *testing.M) {
	natstest.MaybeChild()
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}
