package jetstream

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestSetupErrTellsWaitingFromRefused: the errors a setup call gets from
// nats.go while a cluster elects its leaders (a deadline, no responders,
// a 503 "temporarily unavailable") are ErrUnavailable, which a node's
// start retries; a refusal (a bad configuration, JetStream not enabled)
// and a cancelled start are not, so it fails at once.
func TestSetupErrTellsWaitingFromRefused(t *testing.T) {
	var e Engine
	waiting := []error{
		context.DeadlineExceeded,
		fmt.Errorf("create: %w", nats.ErrNoResponders),
		nats.ErrTimeout,
		&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"},
	}
	for _, err := range waiting {
		require.ErrorIs(t, e.setupErr("bucket b", err), ErrUnavailable, "%v", err)
		require.ErrorIs(t, e.setupErr("bucket b", err), err)
	}
	refused := []error{
		context.Canceled,
		jetstream.ErrJetStreamNotEnabled,
		jetstream.ErrJetStreamNotEnabledForAccount,
		&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamNameInUse, Description: "stream name already in use with a different configuration"},
	}
	for _, err := range refused {
		got := e.setupErr("stream s", err)
		require.False(t, errors.Is(got, ErrUnavailable), "%v is a refusal", err)
		require.ErrorIs(t, got, err)
		require.Contains(t, got.Error(), "stream s")
	}
}
