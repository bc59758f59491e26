package brokertest

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// bigMessage is a message with a body of n bytes (a pattern, so a shifted
// or truncated body shows) and metadata of every kind: a sharding key, a
// tag, index keys and 16 KiB of properties.
func bigMessage(topic string, n int, fill byte) *core.Message {
	body := bytes.Repeat([]byte{fill, fill + 1, fill + 2, fill + 3, fill + 4, fill + 5, fill + 6}, n/7+1)[:n]
	props := map[string]string{}
	for i := range 8 {
		props["p"+strconv.Itoa(i)] = strings.Repeat(string(rune('a'+i)), 2<<10)
	}
	return &core.Message{Topic: topic, ShardingKey: strings.Repeat("k", 1<<10), Tag: "big",
		Keys: []string{"order-" + string(fill)}, Properties: props, Body: body}
}

// testMaxBody: with its default limits an engine stores a message whose
// body is core.MaxBodyBytes (with a kilobyte sharding key, a tag, a key
// and 16 KiB of properties), by Produce and by ProduceAsync, and serves
// both whole by Get, Read (one at a time: they exceed Read's default
// MaxBytes together) and FindByKey, after a restart too. A message whose
// body alone is core.DefaultMaxMessageBytes — whatever the engine's record
// adds, over its default limit — is refused with core.ErrMessageTooLarge
// saying the limit, leaves nothing behind, and the engine goes on storing.
func testMaxBody(t *testing.T, f Factory) {
	ctx := t.Context()
	b := f.Open(t)
	const topic = "big"
	createTopic(t, b, topic, 1)

	sync := bigMessage(topic, core.MaxBodyBytes, 'a')
	r1 := produce(t, b, sync)
	async := bigMessage(topic, core.MaxBodyBytes, 'A')
	r2 := produceAsync(t, b, []*core.Message{async})[0]

	tooBig := bigMessage(topic, core.DefaultMaxMessageBytes, 'x')
	_, err := b.Produce(ctx, tooBig)
	require.ErrorIs(t, err, core.ErrMessageTooLarge)
	require.ErrorContains(t, err, "limit", "the error says the limit")
	_, err = awaitAsync(t, b, []*core.Message{tooBig})
	require.ErrorIs(t, err, core.ErrMessageTooLarge, "ProduceAsync")

	after := produce(t, b, &core.Message{Topic: topic, ShardingKey: "small", Body: []byte("after")})

	check := func(b core.Broker) {
		t.Helper()
		for _, w := range []struct {
			r core.SendResult
			m *core.Message
		}{{r1, sync}, {r2, async}} {
			got, err := b.Get(ctx, w.r.ID)
			require.NoError(t, err)
			requireSameBig(t, w.m, got)
		}
		var read []*core.StoredMessage
		off := int64(0)
		for range 4 {
			res, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: 0, Offset: off})
			require.NoError(t, err)
			if len(res.Messages) == 0 {
				break
			}
			if len(read) < 2 {
				require.Len(t, res.Messages, 1, "two 4 MiB messages exceed a read's default MaxBytes: one at a time")
			}
			read = append(read, res.Messages...)
			off = res.NextOffset
		}
		require.Len(t, read, 3, "the two large messages and the one after; nothing of the refused one")
		requireSameBig(t, sync, read[0])
		requireSameBig(t, async, read[1])
		require.Equal(t, "after", string(read[2].Body))
		require.Equal(t, after.ID, read[2].ID)
		found, err := b.FindByKey(ctx, topic, "order-a", core.KeyQuery{})
		require.NoError(t, err)
		require.Len(t, found, 1)
		requireSameBig(t, sync, found[0])
	}
	check(b)
	if f.Reopen != nil {
		check(f.Reopen(t, b))
	}
}

// requireSameBig fails unless got is m as stored (without printing a
// multi-megabyte body on failure).
func requireSameBig(t testing.TB, m *core.Message, got *core.StoredMessage) {
	t.Helper()
	require.Equal(t, len(m.Body), len(got.Body), "body length")
	require.True(t, bytes.Equal(m.Body, got.Body), "body differs")
	require.Equal(t, m.ShardingKey, got.ShardingKey)
	require.Equal(t, m.Tag, got.Tag)
	require.Equal(t, m.Keys, got.Keys)
	require.Equal(t, m.Properties, got.Properties)
}
