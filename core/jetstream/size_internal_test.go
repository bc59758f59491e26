package jetstream

import (
	"bytes"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// sizedMessage returns a message whose record (encodeRecord) is exactly
// record bytes.
func sizedMessage(t testing.TB, record int, fill byte) *core.Message {
	t.Helper()
	m := &core.Message{Topic: "t", ShardingKey: "car-42", Properties: map[string]string{"mqtt.topic": "cars/42/cmd"}}
	empty, err := encodeRecord(m, time.Now())
	require.NoError(t, err)
	m.Body = bytes.Repeat([]byte{fill}, record-len(empty))
	return m
}

func openSized(t testing.TB, url string, opts Options) *Engine {
	t.Helper()
	opts.URLs, opts.DefaultQueues = []string{url}, 1
	e, err := Open(t.Context(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// TestMessageLimitEdges: with the default options, on a server with the
// max_payload ferrymq documents (8 MiB), a record of exactly
// core.DefaultMaxMessageBytes is stored and read back whole, and one byte
// more is refused with core.ErrMessageTooLarge naming both sizes and the
// setting; the engine goes on storing, and the refused message left
// nothing in the stream.
func TestMessageLimitEdges(t *testing.T) {
	ctx := t.Context()
	e := openSized(t, natstest.RunServer(t).URL, Options{})
	atLimit := sizedMessage(t, core.DefaultMaxMessageBytes, 'a')
	require.Greater(t, len(atLimit.Body), core.MaxBodyBytes)
	r, err := e.Produce(ctx, atLimit)
	require.NoError(t, err)

	_, err = e.Produce(ctx, sizedMessage(t, core.DefaultMaxMessageBytes+1, 'b'))
	require.ErrorIs(t, err, core.ErrMessageTooLarge)
	require.ErrorContains(t, err, "4456449 bytes stored, limit 4456448 (store.max_message_bytes")

	_, err = e.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "car-42", Body: []byte("after")})
	require.NoError(t, err)
	got, err := e.Get(ctx, r.ID)
	require.NoError(t, err)
	require.True(t, bytes.Equal(atLimit.Body, got.Body))
	res, err := e.Read(ctx, core.ReadRequest{Topic: "t", Queue: 0, Offset: 0, MaxCount: 10, MaxBytes: 16 << 20})
	require.NoError(t, err)
	require.Len(t, res.Messages, 2, "the refused message left nothing")
	require.Equal(t, "after", string(res.Messages[1].Body))
}

// TestServerMaxPayloadCapsTheLimit: against a server left at nats-server's
// default max_payload (1 MB) the engine says so in a warning at Open and
// refuses a 4 MiB body with core.ErrMessageTooLarge naming the server's
// limit, instead of failing the publish as a broken connection; smaller
// messages go on.
func TestServerMaxPayloadCapsTheLimit(t *testing.T) {
	ctx := t.Context()
	srv := natstest.RunServer(t, func(o *server.Options) { o.MaxPayload = server.MAX_PAYLOAD_SIZE })
	var logs lockedBuffer // the engine logs from its own goroutines too
	log := zerolog.New(&logs)
	e := openSized(t, srv.URL, Options{Logger: &log})
	require.Contains(t, logs.String(), "max_payload is below the message limit")
	require.Contains(t, logs.String(), `"max_payload":1048576`)

	_, err := e.Produce(ctx, &core.Message{Topic: "t", Body: make([]byte, core.MaxBodyBytes)})
	require.ErrorIs(t, err, core.ErrMessageTooLarge)
	require.ErrorContains(t, err, "limit 1048576")
	_, err = e.Produce(ctx, &core.Message{Topic: "t", Body: make([]byte, 512<<10)})
	require.NoError(t, err)
}

// TestStreamOfASmallerLimit: a topic whose stream was created under a
// smaller limit keeps that max_msg_size (the engine never rewrites a
// stream's configuration); an engine with the default limit gets the
// server's refusal of a larger message as core.ErrMessageTooLarge naming
// the stream, not as an unavailable JetStream, and goes on.
func TestStreamOfASmallerLimit(t *testing.T) {
	ctx := t.Context()
	url := natstest.RunServer(t).URL
	old := openSized(t, url, Options{MaxMessageBytes: 64 << 10})
	_, err := old.Produce(ctx, &core.Message{Topic: "t", Body: []byte("created")})
	require.NoError(t, err)
	require.NoError(t, old.Close())

	e := openSized(t, url, Options{})
	_, err = e.Produce(ctx, &core.Message{Topic: "t", Body: make([]byte, 1<<20)})
	require.ErrorIs(t, err, core.ErrMessageTooLarge)
	require.NotErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "max_msg_size of stream "+streamName("t"))
	_, err = e.Produce(ctx, &core.Message{Topic: "t", Body: []byte("after")})
	require.NoError(t, err)
}

// TestShippedServerConfigsCarryMaxBody: the nats-server configs ferrymq
// ships (testdata/nats, scripts/nats-cluster.sh) and the test servers
// (natstest) set a max_payload that holds a message of the default limit.
func TestShippedServerConfigsCarryMaxBody(t *testing.T) {
	confs, err := filepath.Glob("../../testdata/nats/*.conf")
	require.NoError(t, err)
	require.NotEmpty(t, confs)
	for _, c := range confs {
		o, err := server.ProcessConfigFile(c)
		require.NoError(t, err, c)
		require.GreaterOrEqual(t, int(o.MaxPayload), core.DefaultMaxMessageBytes, "%s: max_payload", c)
	}
	require.GreaterOrEqual(t, natstest.MaxPayload, core.DefaultMaxMessageBytes)
}

// lockedBuffer is a bytes.Buffer safe for the engine's goroutines to log
// into while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
