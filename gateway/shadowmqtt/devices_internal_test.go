package shadowmqtt

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core/shadow"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseTopic(t *testing.T) {
	for _, tc := range []struct {
		topic, id, op string
		ok            bool
	}{
		{"$shadow/car-1/update", "car-1", "update", true},
		{"$shadow/car-1/get", "car-1", "get", true},
		{"$shadow/fleet/car/1/update", "fleet/car/1", "update", true},
		{"$shadow/car-1/update/accepted", "car-1/update", "accepted", false},
		{"$shadow/car-1/update/delta", "car-1/update", "delta", false},
		{"$shadow/car-1/delete", "car-1", "delete", false},
		{"$shadow//update", "", "", false},
		{"$shadow/update", "", "", false},
		{"shadow/car-1/update", "", "", false},
	} {
		t.Run(tc.topic, func(t *testing.T) {
			id, op, ok := parseTopic(tc.topic)
			require.Equal(t, tc.ok, ok)
			if tc.id != "" {
				require.Equal(t, tc.id, id)
				require.Equal(t, tc.op, op)
			}
		})
	}
}

func TestCodeOf(t *testing.T) {
	for err, code := range map[error]int{
		fmt.Errorf("x: %w", shadow.ErrBadRequest):      400,
		fmt.Errorf("x: %w", shadow.ErrNotFound):        404,
		fmt.Errorf("x: %w", shadow.ErrVersionConflict): 409,
		fmt.Errorf("x: %w", shadow.ErrTooLarge):        413,
		shadow.ErrBusy:                                 503,
		context.DeadlineExceeded:                       503,
		errors.New("disk on fire"):                     500,
	} {
		require.Equal(t, code, CodeOf(err), "%v", err)
	}
}

// TestTokenOf: a rejected request's token is echoed when its JSON holds
// one, and nothing else is made up.
func TestTokenOf(t *testing.T) {
	require.Equal(t, "t1", tokenOf([]byte(`{"client_token":"t1","state":3}`)))
	require.Empty(t, tokenOf([]byte(`{"client_token":"t1","state":`)), "not JSON: no token")
	require.Empty(t, tokenOf([]byte(`{"client_token":7}`)))
	require.Empty(t, tokenOf(nil))
}
