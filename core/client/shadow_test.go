package client_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/server"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/wire"
)

// shadowServer is a core server with device shadows over an embedded
// store (and no consumer-group services: Placement says all is here).
func shadowServer(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{FlushPolicy: store.FlushSync})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Close()) })
	svc, err := shadow.OpenLog(t.Context(), st, filepath.Join(dir, "shadows"), shadow.Options{Limits: shadow.Limits{MaxBytes: 128}}, shadow.LogOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, svc.Close()) })
	srv, err := server.New(server.Options{Addr: "127.0.0.1:0", Broker: st, Shadows: svc,
		Placement: func(context.Context, string) (server.Route, error) { return server.Route{Here: true}, nil }})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
	})
	return srv.Addr().String()
}

// TestShadowOverTheWire: a backend reads, updates and deletes a shadow
// with the Go client; each refusal arrives as its code and errors.Is its
// sentinel.
func TestShadowOverTheWire(t *testing.T) {
	addr := shadowServer(t)
	ctx := t.Context()
	c, err := client.Dial(ctx, client.Options{Addr: addr})
	require.NoError(t, err)
	defer c.Close()

	_, err = c.Shadow(ctx, "car-7")
	require.ErrorIs(t, err, shadow.ErrNotFound)
	require.Equal(t, wire.CodeShadowNotFound, wire.CodeOf(err))

	d, err := c.UpdateShadow(ctx, "car-7", json.RawMessage(`{"speed":30}`), 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), d.Version)
	require.Equal(t, json.Number("30"), d.State.Delta["speed"])

	_, err = c.UpdateShadow(ctx, "car-7", json.RawMessage(`{"speed":40}`), 7)
	require.ErrorIs(t, err, shadow.ErrVersionConflict)
	require.Equal(t, wire.CodeVersionConflict, wire.CodeOf(err))

	_, err = c.UpdateShadow(ctx, "car-7", json.RawMessage(`{"note":"`+strings.Repeat("n", 200)+`"}`), 0)
	require.ErrorIs(t, err, shadow.ErrTooLarge)
	require.Equal(t, wire.CodeShadowTooLarge, wire.CodeOf(err))

	for _, bad := range []string{`[1]`, `{"a":`, `"s"`} {
		_, err = c.UpdateShadow(ctx, "car-7", json.RawMessage(bad), 0)
		require.ErrorIs(t, err, shadow.ErrBadRequest, bad)
		require.Equal(t, wire.CodeBadRequest, wire.CodeOf(err))
	}

	got, err := c.Shadow(ctx, "car-7")
	require.NoError(t, err)
	require.Equal(t, d, got)

	v, err := c.DeleteShadow(ctx, "car-7", 1)
	require.NoError(t, err)
	require.Equal(t, int64(2), v)
	_, err = c.DeleteShadow(ctx, "car-7", 0)
	require.ErrorIs(t, err, shadow.ErrNotFound)
}

// TestShadowNotEnabled: a core port without shadows (a gateway in front
// of a remote core) answers their ops "not enabled".
func TestShadowNotEnabled(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(dir, store.Options{})
	require.NoError(t, err)
	defer st.Close()
	srv, err := server.New(server.Options{Addr: "127.0.0.1:0", Broker: st,
		Placement: func(context.Context, string) (server.Route, error) { return server.Route{Here: true}, nil }})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	defer func() { require.NoError(t, srv.Shutdown(context.Background())) }()
	c, err := client.Dial(t.Context(), client.Options{Addr: srv.Addr().String()})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Shadow(t.Context(), "car-7")
	require.ErrorIs(t, err, wire.ErrNotEnabled)
}
