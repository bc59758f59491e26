package consumer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/retry"
)

// testSchedule compresses RocketMQ's backoff so retries happen in
// milliseconds; three attempts before the dead-letter topic.
var testSchedule = []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond}

func newRetrier(t *testing.T, b core.Broker) (*retry.Service, func()) {
	t.Helper()
	r, err := retry.New(b, retry.Options{Schedule: testSchedule, MaxAttempts: len(testSchedule)})
	require.NoError(t, err)
	r.Start()
	return r, func() { _ = r.Close() }
}
