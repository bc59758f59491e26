package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/shadow"
)

// TestShadowCommands: get, update (with and without a version) and delete
// a shadow; every refusal is one line naming what went wrong.
func TestShadowCommands(t *testing.T) {
	addr := servertest.Start(t, servertest.Options{Shadows: &shadow.Options{}}).Addr

	r := cli(t, t.Context(), "", "shadow", "get", "car-1", "--server", addr)
	require.Error(t, r.runErr)
	require.Contains(t, r.err, "no shadow")

	r = mustCLI(t, "", "shadow", "update", "car-1", `{"temp":21,"lights":{"front":"on"}}`, "--server", addr)
	require.Contains(t, r.out, "shadow of car-1: version 1\n")
	require.Contains(t, r.out, `"delta"`)

	r = mustCLI(t, "", "shadow", "update", "car-1", `{"lights":null}`, "--version", "1", "--json", "--server", addr)
	d, err := shadow.DecodeDocument([]byte(r.out))
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Version)
	require.Equal(t, map[string]any{"temp": json.Number("21")}, d.State.Desired)

	r = cli(t, t.Context(), "", "shadow", "update", "car-1", `{"temp":22}`, "--version", "1", "--server", addr)
	require.Error(t, r.runErr)
	require.Contains(t, r.err, "version conflict")
	require.Contains(t, r.err, "at 2")

	r = cli(t, t.Context(), "", "shadow", "update", "car-1", `{"temp":`, "--server", addr)
	require.Error(t, r.runErr)
	require.Contains(t, r.err, "not JSON")

	r = mustCLI(t, "", "shadow", "delete", "car-1", "--version", "2", "--server", addr)
	require.Equal(t, "shadow of car-1 deleted (version 3)\n", r.out)
	r = cli(t, t.Context(), "", "shadow", "delete", "car-1", "--server", addr)
	require.Error(t, r.runErr)
	require.Contains(t, r.err, "no shadow")
}
