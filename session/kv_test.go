package session

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// natsJS starts a real nats-server with JetStream and connects to it.
func natsJS(t testing.TB) (*natstest.Server, jetstream.JetStream) {
	t.Helper()
	ns := natstest.RunServer(t)
	nc, err := nats.Connect(ns.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return ns, js
}

func openKV(t testing.TB, js jetstream.JetStream, o KVOptions) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := OpenKV(ctx, js, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

var validToken = regexp.MustCompile(`^[-_=A-Za-z0-9]+$`)

// Every client ID, filter and topic — dots, slashes, wildcards, spaces,
// any script, empty, very long — becomes one valid KV key token, and each
// key maps back from the bucket to the same store key.
func TestKVKeysRoundTrip(t *testing.T) {
	ids := []string{"car-7", "a.b.c", "cars/7/door", "ünïcødé/車/🚗", "*>", "with space", "", strings.Repeat("long/", 100)}
	seen := map[string]string{}
	for _, id := range ids {
		tok := token(id)
		require.Regexp(t, validToken, tok, "token of %q", id)
		require.LessOrEqual(t, len(tok), maxTokenBytes+1)
		if other, dup := seen[tok]; dup {
			t.Fatalf("%q and %q share token %s", id, other, tok)
		}
		seen[tok] = id

		client, _ := (&storage.Client{ID: id}).MarshalBinary()
		filter := "f/" + id + "/#"
		sub, _ := (&storage.Subscription{Filter: filter, Qos: 1}).MarshalBinary()
		msg, err := encodeMsg(&storage.Message{TopicName: "t"}, 0)
		require.NoError(t, err)
		for key, value := range map[string][]byte{
			clientKey(id): client, kGone + id: make([]byte, 8), subKey(id, filter): sub, inflightKey(id, 0xBEEF): msg,
		} {
			kk, owner, err := kvKey(key)
			require.NoError(t, err)
			require.Equal(t, id, owner)
			for _, part := range strings.Split(kk, ".") {
				require.Regexp(t, validToken, part, "key %q", kk)
			}
			back, err := logicalKey(id, kk, value)
			require.NoError(t, err, "key %q", kk)
			require.Equal(t, key, back)
			_, err = logicalKey(id+"x", kk, value)
			require.ErrorIs(t, err, ErrBadKey, "another client's key")
		}
		kk, owner, err := kvKey(retainedKey("r/" + id))
		require.NoError(t, err)
		require.Empty(t, owner)
		rm, _ := (&storage.Message{TopicName: "r/" + id, Payload: []byte("x")}).MarshalBinary()
		m, err := decodeRetained(strings.TrimPrefix(kk, kvRetained), rm)
		require.NoError(t, err)
		require.Equal(t, "r/"+id, m.TopicName)
	}
	o := owner{gen: 3, inc: 9, since: 12345, node: "gw-1", id: "ünï/c.d"}
	got, err := decodeOwner(encodeOwner(o))
	require.NoError(t, err)
	require.Equal(t, o, got)
}

// A node that lost a session cannot write it any more: once another node
// claimed it (a newer owner revision), the stream refuses the first node's
// puts and deletes, and its watcher tells it.
func TestKVWritesAreFencedByOwner(t *testing.T) {
	_, js := natsJS(t)
	a := openKV(t, js, KVOptions{NodeID: "a"})
	b := openKV(t, js, KVOptions{NodeID: "b"})
	client, _ := (&storage.Client{ID: "dev", T: storage.ClientKey}).MarshalBinary()
	sub, _ := (&storage.Subscription{Filter: "x/#", Qos: 1}).MarshalBinary()

	a.mu.Lock()
	rev, prev, err := a.kv.claim("dev", nil, false)
	if err == nil {
		a.kv.hold("dev", rev, nil)
	}
	ce, putErr := a.putLocked(clientKey("dev"), client)
	a.mu.Unlock()
	require.NoError(t, err)
	require.Zero(t, prev)
	require.NoError(t, putErr)

	cur, err := b.kv.getOwner("dev")
	require.NoError(t, err)
	b.mu.Lock()
	rev2, prev2, err := b.kv.claim("dev", cur, false)
	b.kv.hold("dev", rev2, nil)
	b.mu.Unlock()
	require.NoError(t, err)
	require.Equal(t, rev, prev2)

	require.Eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.kv.held["dev"] == 0
	}, 10*time.Second, 10*time.Millisecond, "a's watcher saw b's claim")
	require.Equal(t, int64(1), a.Stats().TakenOver)
	require.Zero(t, b.Stats().TakenOver)

	// Holding the old revision again is a's state before its watcher told
	// it: a write racing the takeover. The stream itself must refuse it.
	a.mu.Lock()
	a.kv.hold("dev", rev, nil)
	_, putErr = a.putLocked(subKey("dev", "x/#"), sub)
	delErr := a.b.del(clientKey("dev"), ce)
	a.mu.Unlock()
	require.ErrorIs(t, putErr, ErrFenced)
	require.ErrorIs(t, delErr, ErrFenced)
	require.Equal(t, int64(2), a.Stats().WriteErrors["fenced"])

	kv, err := js.KeyValue(t.Context(), "ferrymq_sessions")
	require.NoError(t, err)
	e, err := kv.Get(t.Context(), kvClient+token("dev"))
	require.NoError(t, err, "the client record is still there")
	require.Equal(t, uint64(ce.off), e.Revision())
	_, err = kv.Get(t.Context(), kvSub+token("dev")+"."+token("x/#"))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound)

	b.mu.Lock()
	_, err = b.putLocked(subKey("dev", "x/#"), sub)
	b.kv.release("dev")
	b.mu.Unlock()
	require.NoError(t, err, "the owner writes")
	_, err = kv.Get(t.Context(), ownerKey("dev"))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "released")
}

// A record larger than a message may be is refused with an error and
// counted; the store goes on.
func TestKVRefusesOversizeValues(t *testing.T) {
	_, js := natsJS(t)
	s := openKV(t, js, KVOptions{NodeID: "a", MaxValueBytes: 1 << 10})
	s.mu.Lock()
	_, bigErr := s.putLocked(retainedKey("big"), make([]byte, 2<<10))
	_, smallErr := s.putLocked(retainedKey("small"), []byte(`{"topic_name":"small"}`))
	s.mu.Unlock()
	require.ErrorIs(t, bigErr, ErrValueTooLarge)
	require.NoError(t, smallErr)
	require.Equal(t, int64(1), s.Stats().WriteErrors["too_large"])
}

// FuzzKVValues: the decoders of what is read from the bucket — owner
// records, session keys with their values, retained messages — never
// panic, and what they accept is consistent.
func FuzzKVValues(f *testing.F) {
	f.Add("o."+token("dev"), encodeOwner(owner{gen: 1, inc: 2, since: 3, node: "gw-1", id: "dev"}))
	client, _ := (&storage.Client{ID: "dev"}).MarshalBinary()
	f.Add(kvClient+token("dev"), client)
	sub, _ := (&storage.Subscription{Filter: "x/#", Qos: 1}).MarshalBinary()
	f.Add(kvSub+token("dev")+"."+token("x/#"), sub)
	f.Add(kvInflight+token("dev")+".00ff", []byte{msgVersion, 0, 0, 0, 0, 0, 0, 0, 0, '{', '}'})
	f.Add(kvGone+token("dev"), make([]byte, 8))
	rm, _ := (&storage.Message{TopicName: "a/b", Payload: []byte("x")}).MarshalBinary()
	f.Add(kvRetained+token("a/b"), rm)
	f.Add("o.x", []byte{ownerMagic, ownerVersion, 0xFF})
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		if o, err := decodeOwner(value); err == nil {
			again, err := decodeOwner(encodeOwner(o))
			require.NoError(t, err)
			require.Equal(t, o, again)
			require.NotEmpty(t, o.node)
		}
		if k, err := logicalKey("dev", key, value); err == nil {
			kk, id, err := kvKey(k)
			require.NoError(t, err)
			require.Equal(t, "dev", id)
			require.Equal(t, key, kk, "the key maps back to itself")
		}
		if tok, ok := strings.CutPrefix(key, kvRetained); ok {
			if m, err := decodeRetained(tok, value); err == nil {
				require.Equal(t, tok, token(m.TopicName))
			}
		}
	})
}
