package jetstream

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

func TestRecordRoundTrip(t *testing.T) {
	m := &core.Message{Topic: "%DLQ%g", ShardingKey: "car-1", Tag: "t", Keys: []string{"k1", "k2"},
		Properties: map[string]string{"mqtt.qos": "1"}, Body: []byte("hello"),
		DeliverAt: time.Unix(0, 123456789), ReconsumeCount: 3}
	born := time.Unix(1700000000, 42)
	b, err := encodeRecord(m, born)
	require.NoError(t, err)
	got, err := decodeRecord(b)
	require.NoError(t, err)
	require.Equal(t, m.Topic, got.Topic)
	require.Equal(t, m.ShardingKey, got.ShardingKey)
	require.Equal(t, m.Keys, got.Keys)
	require.Equal(t, m.Properties, got.Properties)
	require.Equal(t, m.Body, got.Body)
	require.True(t, m.DeliverAt.Equal(got.DeliverAt))
	require.True(t, born.Equal(got.BornAt))
	require.Equal(t, 3, got.ReconsumeCount)
}

func TestDecodeRecordRejects(t *testing.T) {
	good, err := encodeRecord(&core.Message{Topic: "a", Body: []byte("x")}, time.Now())
	require.NoError(t, err)
	for name, b := range map[string][]byte{
		"empty":       nil,
		"short":       good[:5],
		"version":     append([]byte{9}, good[1:]...),
		"truncated":   good[:len(good)-1],
		"trailing":    append(append([]byte{}, good...), 0),
		"not ferrymq": []byte("hello world, this is not a record"),
	} {
		_, err := decodeRecord(b)
		require.Error(t, err, name)
		require.True(t, errors.Is(err, ErrBadRecord), "%s: %v", name, err)
	}
}

// FuzzDecodeRecord: any payload found on a ferrymq subject decodes or is
// refused with ErrBadRecord; it never panics.
func FuzzDecodeRecord(f *testing.F) {
	for _, m := range []*core.Message{
		{Topic: "orders", Body: []byte("x")},
		{Topic: "t", ShardingKey: "k", Tag: "tag", Keys: []string{"a"}, Properties: map[string]string{"p": "v"}},
	} {
		b, err := encodeRecord(m, time.Unix(1, 0))
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeRecord(b)
		if err != nil {
			require.ErrorIs(t, err, ErrBadRecord)
			return
		}
		again, err := encodeRecord(&m, m.BornAt)
		if err == nil {
			_, err = decodeRecord(again)
			require.NoError(t, err)
		}
	})
}

func TestTokenIsInjectiveAndSafe(t *testing.T) {
	seen := map[string]string{}
	for _, name := range []string{"a", "a.b", "a_b", "a_2Eb", "%DLQ%g", "%25", "A-b", "x.y.z"} {
		tok := token(name)
		require.NotContains(t, tok, ".", name)
		require.NotContains(t, tok, "%", name)
		if prev, ok := seen[tok]; ok {
			t.Fatalf("%q and %q share token %q", prev, name, tok)
		}
		seen[tok] = name
	}
	long := token(string(make([]byte, 127)))
	require.LessOrEqual(t, len(long), maxTokenLen)
}

func TestIDRoundTrip(t *testing.T) {
	id := newID("orders", 1<<40+7)
	require.Equal(t, byte(IDKindJetStream), id.Kind())
	h, seq := idParts(id)
	require.Equal(t, topicHash("orders"), h)
	require.Equal(t, uint64(1<<40+7), seq)
}
