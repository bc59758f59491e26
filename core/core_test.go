package core

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMessageIDRoundTrip(t *testing.T) {
	id := NewCommitLogID(0xABCDEF, 1<<40+5, 1234)
	s := id.String()
	require.Len(t, s, 32)
	require.Equal(t, "01abcdef0000010000000005000004d2", s)
	back, err := ParseMessageID(s)
	require.NoError(t, err)
	require.Equal(t, id, back)
	require.Equal(t, byte(IDKindCommitLog), back.Kind())
	require.Equal(t, uint32(0xABCDEF), back.StoreID())
	require.Equal(t, int64(1<<40+5), back.Offset())
	require.Equal(t, 1234, back.Size())

	b, err := json.Marshal(struct{ ID MessageID }{id})
	require.NoError(t, err)
	require.Contains(t, string(b), s)
	var v struct{ ID MessageID }
	require.NoError(t, json.Unmarshal(b, &v))
	require.Equal(t, id, v.ID)
}

func TestParseMessageIDRejects(t *testing.T) {
	for _, s := range []string{"", "abc", strings.Repeat("z", 32), strings.Repeat("0", 31), strings.Repeat("0", 33)} {
		_, err := ParseMessageID(s)
		require.ErrorIs(t, err, ErrInvalidMessageID, "%q", s)
	}
}

// The queue a key maps to is part of the contract between engines and
// clients: these values must never change.
func TestQueueForIsStable(t *testing.T) {
	cases := []struct {
		key  string
		n    int
		want int
	}{
		{"", 8, 5}, {"car-42", 8, 6}, {"device-1", 8, 1}, {"device-1", 16, 1}, {"a", 3, 1}, // computed independently (Python FNV-1a)
	}
	for _, c := range cases {
		require.Equal(t, c.want, QueueFor(c.key, c.n), "QueueFor(%q, %d)", c.key, c.n)
	}
	require.Equal(t, int64(0), TagHash(""))
	require.NotZero(t, TagHash("alarm"))
}

func TestValidateTopic(t *testing.T) {
	for _, ok := range []string{"a", "orders", "A.b_c-9", strings.Repeat("x", 127)} {
		require.NoError(t, ValidateTopic(ok), ok)
	}
	for _, bad := range []string{"", "a/b", "a b", "%DLQ%x", "ü", strings.Repeat("x", 128)} {
		err := ValidateTopic(bad)
		require.ErrorIs(t, err, ErrInvalidTopic, bad)
		var te *TopicError
		require.True(t, errors.As(err, &te))
	}
	require.NoError(t, ValidateSystemTopic("%DLQ%group-1"))
	require.Error(t, ValidateSystemTopic("DLQ"))
	require.Error(t, ValidateSystemTopic("%a/b"))
}

func FuzzParseMessageID(f *testing.F) {
	f.Add("01abcdef0000010000000005000004d2")
	f.Add("")
	f.Add(strings.Repeat("g", 32))
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseMessageID(s)
		if err != nil {
			return
		}
		if id.String() != strings.ToLower(s) {
			t.Fatalf("round trip %q -> %q", s, id.String())
		}
	})
}

func TestQueueKeysPickTheirQueue(t *testing.T) {
	for n := 1; n <= 64; n++ {
		for q, k := range QueueKeys(n) {
			require.Equal(t, q, QueueFor(k, n), "n=%d", n)
		}
	}
}
