package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/jetstream"
)

// A start step that meets a JetStream not answering yet is tried again,
// waiting longer each time, until it succeeds; any other error ends the
// start at once; a deadline that passes while JetStream still does not
// answer ends it with the last error.
func TestStartStepRetriesWhileJetStreamIsUnavailable(t *testing.T) {
	unavailable := fmt.Errorf("create %%DELAY%%: %w: context deadline exceeded", jetstream.ErrUnavailable)
	var waits []time.Duration
	onRetry := func(_ error, d time.Duration) { waits = append(waits, d) }

	calls := 0
	err := retryUnavailable(t.Context(), "delayed delivery", func() error {
		calls++
		if calls < 4 {
			return unavailable
		}
		return nil
	}, onRetry)
	require.NoError(t, err)
	require.Equal(t, 4, calls)
	require.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}, waits)

	calls, waits = 0, nil
	err = retryUnavailable(t.Context(), "delayed delivery", func() error {
		calls++
		return fmt.Errorf("create: %w", core.ErrTopicExists)
	}, onRetry)
	require.ErrorIs(t, err, core.ErrTopicExists)
	require.Equal(t, "delayed delivery: create: "+core.ErrTopicExists.Error(), err.Error(), "the error names the step once")
	require.Equal(t, 1, calls, "an error other than unavailable is not retried")
	require.Empty(t, waits)

	ctx, cancel := context.WithTimeout(t.Context(), 250*time.Millisecond)
	defer cancel()
	err = retryUnavailable(ctx, "core lease", func() error { return unavailable }, onRetry)
	require.ErrorIs(t, err, jetstream.ErrUnavailable)
	require.ErrorContains(t, err, "core lease: still unavailable")
}
