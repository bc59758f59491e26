package shadow

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func obj(t testing.TB, s string) map[string]any {
	t.Helper()
	m, err := DecodePatch([]byte(s), Limits{})
	require.NoError(t, err)
	return m
}

func jsonOf(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// TestMergeIsAMergePatch: null removes, objects merge, other values
// replace (an object replaces a scalar and the other way round), and the
// metadata follows the state's structure with the time each field was set.
func TestMergeIsAMergePatch(t *testing.T) {
	for _, tc := range []struct{ name, state, patch, want, meta string }{
		{"set", `{}`, `{"a":1}`, `{"a":1}`, `{"a":{"timestamp":7}}`},
		{"null removes", `{"a":1,"b":2}`, `{"a":null}`, `{"b":2}`, `{"b":{"timestamp":1}}`},
		{"objects merge", `{"o":{"x":1,"y":2}}`, `{"o":{"y":3,"z":null}}`, `{"o":{"x":1,"y":3}}`, `{"o":{"x":{"timestamp":1},"y":{"timestamp":7}}}`},
		{"object replaces scalar", `{"o":5}`, `{"o":{"x":1}}`, `{"o":{"x":1}}`, `{"o":{"x":{"timestamp":7}}}`},
		{"scalar replaces object", `{"o":{"x":1}}`, `{"o":"s"}`, `{"o":"s"}`, `{"o":{"timestamp":7}}`},
		{"arrays replace", `{"l":[1,2]}`, `{"l":[3]}`, `{"l":[3]}`, `{"l":{"timestamp":7}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := obj(t, tc.state)
			meta := metaOf(state, 1)
			gotState, gotMeta := merge(state, meta, obj(t, tc.patch), 7)
			require.JSONEq(t, tc.want, jsonOf(t, gotState))
			require.JSONEq(t, tc.meta, jsonOf(t, gotMeta))
		})
	}
}

// metaOf is the metadata of state as if every field was set at ts.
func metaOf(state map[string]any, ts int64) map[string]any {
	_, m := merge(nil, nil, state, ts)
	return m
}

// TestDeltaIsDesiredNotReported: fields of desired, recursively, that
// reported lacks or holds with another value; numbers by value.
func TestDeltaIsDesiredNotReported(t *testing.T) {
	for _, tc := range []struct{ name, desired, reported, want string }{
		{"equal", `{"a":1,"o":{"x":true}}`, `{"a":1,"o":{"x":true},"extra":2}`, `null`},
		{"missing and different", `{"a":1,"b":"on"}`, `{"b":"off"}`, `{"a":1,"b":"on"}`},
		{"nested", `{"o":{"x":1,"y":2}}`, `{"o":{"x":1,"y":3}}`, `{"o":{"y":2}}`},
		{"object against scalar", `{"o":{"x":1}}`, `{"o":1}`, `{"o":{"x":1}}`},
		{"numbers by value", `{"a":1,"b":1e2}`, `{"a":1.0,"b":100}`, `null`},
		{"arrays whole", `{"l":[1,2]}`, `{"l":[1,3]}`, `{"l":[1,2]}`},
		{"null is a value in arrays", `{"l":[null]}`, `{"l":[null]}`, `null`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.JSONEq(t, tc.want, jsonOf(t, delta(obj(t, tc.desired), obj(t, tc.reported))))
		})
	}
}
