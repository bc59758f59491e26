package session

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// natsJS starts a real nats-server with JetStream and connects to it.
func natsJS(t testing.TB) (*natstest.Server, jetstream.JetStream) {
	t.Helper()
	ns := natstest.RunServer(t)
	return ns, connectJS(t, ns.URL)
}

func connectJS(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
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

// flush waits until the writes queued for session id have landed.
func flush(t testing.TB, s *Store, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.kv.w.flush(ctx, sessionLane(id)))
}

func claim(t testing.TB, s *Store, id string, clean bool) *engine.StoredSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.Claim(ctx, id, clean)
	require.NoError(t, err)
	return st
}

var validToken = regexp.MustCompile(`^[-_=A-Za-z0-9]+$`)

// Every client ID, filter and topic — dots, slashes, wildcards, spaces,
// any script, empty, very long — becomes one valid KV key token, and each
// bucket key maps back to the store's key it came from.
func TestKVKeysRoundTrip(t *testing.T) {
	ids := []string{"car-7", "a.b.c", "cars/7/door", "ünïcødé/車/🚗", "*>", "with space", "", "nul\x00", strings.Repeat("long/", 100)}
	seen := map[string]string{}
	for _, id := range ids {
		tok := token(id)
		require.Regexp(t, validToken, tok, "token of %q", id)
		require.LessOrEqual(t, len(tok), maxTokenBytes+1)
		if other, dup := seen[tok]; dup {
			t.Fatalf("%q and %q share token %s", id, other, tok)
		}
		seen[tok] = id
		if back, ok := untoken(tok); ok {
			require.Equal(t, id, back)
		} else {
			require.True(t, strings.HasPrefix(tok, "="), "only hashed tokens do not map back")
		}
		filter := "f/" + id + "/#"
		sub, err := encodeSub(filter, topictree.Options{QoS: 1})
		require.NoError(t, err)
		for _, k := range []key{{kind: kClient, id: id}, {kind: kOffline, id: id}, {kind: kSub, id: id, sub: filter},
			{kind: kMessage, id: id, pid: 0xBEEF}, {kind: kReleased, id: id, pid: 1}, {kind: kInbound, id: id, pid: 2}} {
			bk := bucketKey(k)
			for _, part := range strings.Split(bk, ".") {
				require.Regexp(t, validToken, part, "key %q", bk)
			}
			back, err := storeKey(id, bk, sub)
			require.NoError(t, err, "key %q", bk)
			require.Equal(t, k, back)
			_, err = storeKey(id+"x", bk, sub)
			require.ErrorIs(t, err, ErrBadKey, "another client's key")
		}
	}
	o := owner{gen: 3, inc: 9, since: 12345, node: "gw-1", id: "ünï/c.d"}
	got, err := decodeOwner(encodeOwner(o))
	require.NoError(t, err)
	require.Equal(t, o, got)
}

// A session stored by one node is what another node's claim loads: every
// kind of record, in order.
func TestKVClaimLoadsWhatAnotherNodeStored(t *testing.T) {
	_, js := natsJS(t)
	a := openKV(t, js, KVOptions{NodeID: "a"})
	b := openKV(t, js, KVOptions{NodeID: "b"})
	require.Nil(t, claim(t, a, "dev", false), "no session anywhere")
	fill(a, "dev")
	flush(t, a, "dev")
	require.Empty(t, a.Stats().WriteErrors)

	st := claim(t, b, "dev", false)
	require.NotNil(t, st)
	wantFilled(t, *st, "dev")
	msgs, err := b.LoadMessages("dev")
	require.NoError(t, err)
	require.Equal(t, st.Messages, msgs, "LoadMessages serves the claimed session's messages")
	require.Eventually(t, func() bool { return a.Stats().TakenOver == 1 && a.Stats().Sessions == 0 }, 10*time.Second, 10*time.Millisecond,
		"a's watcher saw b's claim")
	require.Nil(t, claim(t, b, "dev", false), "b holds it now")
}

// A node that lost a session cannot write it any more: its writes after
// another node's claim — before its watcher told it — are refused by the
// stream itself.
func TestKVWritesAreFencedByOwner(t *testing.T) {
	_, js := natsJS(t)
	a := openKV(t, js, KVOptions{NodeID: "a"})
	b := openKV(t, js, KVOptions{NodeID: "b"})
	claim(t, a, "dev", false)
	a.SaveClient(engine.ClientRecord{ID: "dev", Protocol: 4, Expiry: 60})
	flush(t, a, "dev")
	a.mu.Lock()
	rev := a.kv.held["dev"]
	a.mu.Unlock()

	require.NotNil(t, claim(t, b, "dev", false))
	require.Eventually(t, func() bool { return a.Stats().Sessions == 0 }, 10*time.Second, 10*time.Millisecond)

	// a's state before its watcher told it: a write racing the takeover.
	a.mu.Lock()
	a.kv.holdLocked("dev", rev)
	a.ix.putClient("dev", loc{n: 1}, false)
	a.mu.Unlock()
	a.SaveSubscription("dev", "x/#", topictree.Options{QoS: 1})
	a.Delete("dev")
	flush(t, a, "dev") // tried: an unchecked flush does not say how
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.Error(t, a.kv.w.flushChecked(ctx, sessionLane("dev")), "a checked flush reports the refused writes")
	require.NoError(t, a.kv.w.flushChecked(ctx, sessionLane("dev")), "once")
	require.Equal(t, int64(5), a.Stats().WriteErrors[reasonFenced],
		"the subscription, then the session's delete: its client, offline and subscription keys and its owner record")

	kv, err := js.KeyValue(t.Context(), DefaultBucket)
	require.NoError(t, err)
	_, err = kv.Get(t.Context(), bucketKey(key{kind: kSub, id: "dev", sub: "x/#"}))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
	_, err = kv.Get(t.Context(), bucketKey(key{kind: kClient, id: "dev"}))
	require.NoError(t, err, "the client record is still there")

	b.SaveSubscription("dev", "x/#", topictree.Options{QoS: 1})
	flush(t, b, "dev")
	_, err = kv.Get(t.Context(), bucketKey(key{kind: kSub, id: "dev", sub: "x/#"}))
	require.NoError(t, err, "the owner writes")
	b.Delete("dev")
	flush(t, b, "dev")
	_, err = kv.Get(t.Context(), ownerKey("dev"))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "released")
	require.Empty(t, b.Stats().WriteErrors)
}

// A clean session with no stored session anywhere costs one read: no
// claim is written.
func TestKVCleanSessionClaimsNothing(t *testing.T) {
	_, js := natsJS(t)
	a := openKV(t, js, KVOptions{NodeID: "a"})
	require.Nil(t, claim(t, a, "dev", true))
	kv, err := js.KeyValue(t.Context(), DefaultBucket)
	require.NoError(t, err)
	_, err = kv.Get(t.Context(), ownerKey("dev"))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
}

// A record larger than a message may be is refused and counted; the
// store goes on.
func TestKVRefusesOversizeValues(t *testing.T) {
	_, js := natsJS(t)
	s := openKV(t, js, KVOptions{NodeID: "a", MaxValueBytes: 1 << 10})
	claim(t, s, "dev", false)
	s.SaveClient(engine.ClientRecord{ID: "dev", Protocol: 4, Expiry: 60})
	s.SaveMessage("dev", 1, &engine.Message{Topic: "t", QoS: 1, Payload: make([]byte, 2<<10)}, nil)
	s.SaveMessage("dev", 2, &engine.Message{Topic: "t", QoS: 1, Payload: []byte("small")}, nil)
	s.SaveRetained(&engine.Message{Topic: "big", Payload: make([]byte, 2<<10)})
	flush(t, s, "dev")
	require.Equal(t, int64(2), s.Stats().WriteErrors[reasonTooLarge])
	require.Equal(t, 1, s.Stats().Messages)
}

// A node restarted with the same NodeID takes back the sessions it owned,
// as they were.
func TestKVNodeRestartTakesBackItsSessions(t *testing.T) {
	_, js := natsJS(t)
	a := openKV(t, js, KVOptions{NodeID: "a"})
	claim(t, a, "dev", false)
	fill(a, "dev")
	claim(t, a, "online", false)
	a.SaveClient(engine.ClientRecord{ID: "online", Protocol: 4, Expiry: 60})
	a.SaveRetained(&engine.Message{Topic: "r/1", Payload: []byte("x"), QoS: 1})
	require.NoError(t, a.Close())

	a = openKV(t, js, KVOptions{NodeID: "a"})
	sessions, retained, err := a.Load()
	require.NoError(t, err)
	require.Len(t, sessions, 2)
	byID := map[string]engine.StoredSession{}
	for _, st := range sessions {
		byID[st.Client.ID] = st
	}
	wantFilled(t, byID["dev"], "dev")
	require.True(t, byID["online"].Offline.IsZero(), "connected when its node stopped")
	require.Len(t, retained, 1)
	require.Equal(t, "r/1", retained[0].Topic)
	require.Equal(t, 2, a.Stats().Sessions)
	flush(t, a, "online")
	require.Empty(t, a.Stats().WriteErrors)

	b := openKV(t, js, KVOptions{NodeID: "b"})
	sessions, _, err = b.Load()
	require.NoError(t, err)
	require.Empty(t, sessions, "not b's")
}

func TestKVOptionsAreValidated(t *testing.T) {
	_, js := natsJS(t)
	_, err := OpenKV(t.Context(), js, KVOptions{Replicas: 9, MarkerTTL: time.Millisecond, Writers: -1})
	require.ErrorContains(t, err, "replicas")
	require.ErrorContains(t, err, "marker TTL")
	require.ErrorContains(t, err, "writers")
}

// A clean start that asks for a session expiry claims nothing at CONNECT
// (Claim cannot tell it will be stored) but its first client record
// claims it, ahead of its writes, which are fenced by that claim.
func TestKVCleanStartWithExpiryClaimsAtItsFirstWrite(t *testing.T) {
	_, js := natsJS(t)
	a := openKV(t, js, KVOptions{NodeID: "a"})
	b := openKV(t, js, KVOptions{NodeID: "b"})
	require.Nil(t, claim(t, a, "dev", true))
	a.SaveClient(engine.ClientRecord{ID: "dev", Protocol: 5, Expiry: 300})
	a.SaveSubscription("dev", "x", topictree.Options{QoS: 1})
	flush(t, a, "dev")
	require.Empty(t, a.Stats().WriteErrors)
	st := claim(t, b, "dev", false)
	require.NotNil(t, st, "stored, under a's claim")
	require.Equal(t, []engine.StoredSubscription{{Filter: "x", Options: topictree.Options{QoS: 1}}}, st.Subscriptions)
}

// TestKVOpenAsksAgainWhileTheBucketIsUnavailable: opening the bucket asks
// again while its watch does not answer in time (a JetStream cluster just
// started or restarted), until the caller's context ends — it does not
// give up at the first timeout. Here every watch times out (a timeout of
// 1 ns), so the open retries and finally fails with ErrUnavailable.
func TestKVOpenAsksAgainWhileTheBucketIsUnavailable(t *testing.T) {
	_, js := natsJS(t)
	var logs strings.Builder // written by OpenKV's goroutine only, read after it returned
	log := zerolog.New(&logs)
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	_, err := OpenKV(ctx, js, KVOptions{NodeID: "a", Timeout: time.Nanosecond, Logger: &log})
	require.ErrorIs(t, err, ErrUnavailable)
	require.GreaterOrEqual(t, strings.Count(logs.String(), "session bucket not available yet"), 2, logs.String())
}
