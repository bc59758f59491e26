package shadow_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/shadow"
)

// TestDecodeRequestRefusesWhatIsNotAnUpdate: every malformed request gets
// ErrBadRequest or ErrTooLarge with a reason, never a panic.
func TestDecodeRequestRefusesWhatIsNotAnUpdate(t *testing.T) {
	lim := shadow.Limits{MaxBytes: 256, MaxDepth: 3}
	for _, tc := range []struct {
		name, in string
		want     error
		says     string
	}{
		{"not json", `{"state":`, shadow.ErrBadRequest, "not JSON"},
		{"empty", ``, shadow.ErrBadRequest, "not JSON"},
		{"array", `[1]`, shadow.ErrBadRequest, "want"},
		{"no state", `{"version":1}`, shadow.ErrBadRequest, "no state"},
		{"state not object", `{"state":3}`, shadow.ErrBadRequest, "state"},
		{"other section", `{"state":{"desired":{"a":1}}}`, shadow.ErrBadRequest, "only state.reported"},
		{"delta", `{"state":{"reported":{},"delta":{}}}`, shadow.ErrBadRequest, "state.delta"},
		{"section not object", `{"state":{"reported":[1]}}`, shadow.ErrBadRequest, "an array"},
		{"unknown field", `{"state":{"reported":{}},"x":1}`, shadow.ErrBadRequest, "unknown field"},
		{"trailing", `{"state":{"reported":{}}} {}`, shadow.ErrBadRequest, "after the JSON"},
		{"negative version", `{"state":{"reported":{}},"version":-1}`, shadow.ErrBadRequest, "version"},
		{"fraction version", `{"state":{"reported":{}},"version":1.5}`, shadow.ErrBadRequest, "version"},
		{"too deep", `{"state":{"reported":{"a":{"b":{"c":{"d":1}}}}}}`, shadow.ErrBadRequest, "deep"},
		{"long token", `{"state":{"reported":{}},"client_token":"` + strings.Repeat("t", 65) + `"}`, shadow.ErrBadRequest, "client_token"},
		{"too large", `{"state":{"reported":{"a":"` + strings.Repeat("x", 256+1024) + `"}}}`, shadow.ErrTooLarge, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := shadow.DecodeRequest([]byte(tc.in), shadow.Reported, lim)
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), tc.says)
		})
	}
}

func TestDecodeRequest(t *testing.T) {
	u, err := shadow.DecodeRequest([]byte(`{"state":{"desired":{"temp":21,"mode":null}},"version":4,"client_token":"t1"}`), shadow.Desired, shadow.Limits{})
	require.NoError(t, err)
	require.Equal(t, shadow.Desired, u.Section)
	require.Equal(t, int64(4), u.Version)
	require.Equal(t, "t1", u.ClientToken)
	require.False(t, u.Clear)
	require.Contains(t, u.Patch, "mode")
	require.Nil(t, u.Patch["mode"])

	u, err = shadow.DecodeRequest([]byte(`{"state":{"reported":null}}`), shadow.Reported, shadow.Limits{})
	require.NoError(t, err)
	require.True(t, u.Clear, "a null section clears it")
}
