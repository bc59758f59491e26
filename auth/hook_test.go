package auth

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// passwords is a Provider of the users it lists (username → password).
type passwords map[string]string

func (passwords) Name() string { return "passwords" }

func (p passwords) Authenticate(r *Request) (Identity, error) {
	want, ok := p[r.Username]
	if !ok {
		return Identity{}, ErrNotMine
	}
	if string(r.Password) != want {
		return Identity{}, fmt.Errorf("%w: wrong password", ErrDenied)
	}
	return Identity{}, nil
}

// authenticated runs the hook's Authenticate for a CONNECT and returns the
// Client the engine would show the other hooks (nil when refused).
func authenticated(t *testing.T, h *Hook, id, user, pass string) *engine.Client {
	t.Helper()
	ci := &engine.ConnectInfo{ClientID: id, Username: user, Password: []byte(pass), Protocol: 4}
	ident, err := h.Authenticate(context.Background(), ci)
	if err != nil {
		return nil
	}
	return engine.NewClient(ci, ident)
}

// A delayed publish "$delayed/{seconds}/{topic}" is checked as a publish to
// {topic}, deny rules included; a malformed one passes, for the bridge to
// refuse with its own reason code. Subscriptions and deliveries are not
// translated.
func TestHookDelayedPublishACL(t *testing.T) {
	acl, err := NewACL([]ACLRule{
		{Action: ActionDeny, Publish: []string{"cars/+/secret"}},
		{Action: ActionAllow, Publish: []string{"cars/%c/#"}, Subscribe: []string{"cars/%c/#"}},
	})
	require.NoError(t, err)
	h := NewHook(HookOptions{ACL: acl})
	cl := authenticated(t, h, "c1", "", "")
	require.NotNil(t, cl)
	for _, tc := range []struct {
		topic string
		write bool
		want  bool
	}{
		{"$delayed/1/cars/c1/x", true, true},
		{"$delayed/0/cars/c1", true, true},
		{"$delayed/3600/cars/c1/a/b", true, true},
		{"$delayed/1/cars/c2/x", true, false},
		{"$delayed/1/trucks/c1/x", true, false},
		{"$delayed/1/cars/c1/secret", true, false},
		{"$DELAYED/1/cars/c1/x", true, false}, // the prefix is case-sensitive: an ordinary '$' topic
		{"cars/c1/x", true, true},
		{"cars/c2/x", true, false},
		// Malformed: passed on to the bridge, which answers 0x90.
		{"$delayed/abc/cars/c2/x", true, true},
		{"$delayed/-1/cars/c2/x", true, true},
		{"$delayed/1/", true, true},
		{"$delayed/1/$SYS/x", true, true},
		// The internal namespace stays closed whatever the prefix.
		{"$ferrymq/p2p/c2", true, false},
		// Reading is not translated.
		{"$delayed/1/cars/c1/x", false, false},
		{"$delayed/#", false, false},
		{"cars/c1/#", false, true},
	} {
		var got bool
		if tc.write {
			got = h.CanPublish(cl, tc.topic)
		} else {
			got = h.CanSubscribe(cl, tc.topic)
		}
		require.Equal(t, tc.want, got, "%s (write %v)", tc.topic, tc.write)
	}
}

// Nothing reaches into the internal namespace: not a publish, not a plain
// or shared subscription, not a delivery.
func TestHookInternalNamespace(t *testing.T) {
	h := NewHook(HookOptions{})
	cl := authenticated(t, h, "dev", "", "")
	for _, f := range []string{"$ferrymq/p2p/other", "$ferrymq/#", "$share/g/$ferrymq/p2p/other", "$share/g/$ferrymq/p2p/dev"} {
		require.False(t, h.CanSubscribe(cl, f), f)
	}
	require.False(t, h.CanPublish(cl, "$ferrymq/p2p/other"))
	require.False(t, h.CanRead(cl, "dev", "", "$ferrymq/p2p/dev"))
	require.True(t, h.CanSubscribe(cl, "$share/g/devices/#"), "no ACL: other shared subscriptions pass")
	require.True(t, h.CanPublish(cl, "$other/x"), "other '$' topics are the engine's to refuse or not")
}

// The subscription cap and topic limits; the engine asks only for filters
// the client does not hold yet.
func TestHookSubscriptionCap(t *testing.T) {
	h := NewHook(HookOptions{Quotas: NewQuotas(QuotaConfig{MaxSubscriptions: 2, MaxTopicLevels: 3}, nil)})
	cl := authenticated(t, h, "dev", "", "")
	require.Equal(t, engine.Success, h.AllowSubscription(cl, "a/#", 0))
	require.Equal(t, engine.TopicFilterInvalid, h.AllowSubscription(cl, "a/b/c/d", 1), "too deep")
	require.Equal(t, engine.TopicFilterInvalid, h.AllowSubscription(cl, "$share/g/a/b/c/d", 1), "the shared filter is what counts")
	require.Equal(t, engine.Success, h.AllowSubscription(cl, "b", 1))
	require.Equal(t, engine.QuotaExceeded, h.AllowSubscription(cl, "c", 2), "two of two")
	code, _, _ := h.AllowPublish(cl, "a/b/c/d", 1)
	require.Equal(t, engine.TopicNameInvalid, code, "publish topics are limited too")
}

// Templates are filled in with the identity's username, which a provider
// may derive from the credential: one unusable in a filter is refused at
// CONNECT when the ACL uses %u.
func TestHookTemplateSafeIdentity(t *testing.T) {
	acl, err := NewACL([]ACLRule{{Action: ActionAllow, Publish: []string{"users/%u/#"}}})
	require.NoError(t, err)
	named := namedBy("spiffe://fleet/car-1")
	h := NewHook(HookOptions{Chain: &Chain{Providers: []Provider{named}}, ACL: acl})
	require.Nil(t, authenticated(t, h, "car-1", "", "x"), "'/' in the derived username")
	h = NewHook(HookOptions{Chain: &Chain{Providers: []Provider{named}}})
	require.NotNil(t, authenticated(t, h, "car-1", "", "x"), "no templates: any name will do")
}

// namedBy is a Provider that admits everyone under one derived username.
type namedBy string

func (namedBy) Name() string { return "named" }

func (n namedBy) Authenticate(*Request) (Identity, error) { return Identity{Username: string(n)}, nil }

// CanRead with no connection is the check for an offline session's queue:
// the read ACL by username alone.
func TestHookReadOffline(t *testing.T) {
	acl, err := NewACL([]ACLRule{
		{Action: ActionDeny, Subscribe: []string{"devices/secret"}},
		{Action: ActionAllow, Subscribe: []string{"devices/#"}, Users: []string{"ops"}},
	})
	require.NoError(t, err)
	h := NewHook(HookOptions{ACL: acl})
	require.True(t, h.CanRead(nil, "c1", "ops", "devices/ok"))
	require.False(t, h.CanRead(nil, "c1", "ops", "devices/secret"), "denied topic")
	require.False(t, h.CanRead(nil, "c1", "guest", "devices/ok"), "rules go by username")
}

// The session owner is the identity's username, not the CONNECT's: an
// HMAC device signs a new username ("<product>:<device>:<ms>") at every
// connect and still owns its session; another device of the product does
// not. On a real engine, which enforces ownership.
func TestEngineSessionOwnerDerivedUsername(t *testing.T) {
	h := NewHook(HookOptions{Chain: &Chain{Providers: []Provider{newTestHMAC(t, HMACOptions{})}}})
	addr := startEngine(t, h)
	now := time.Now()
	dial := func(device string, ts time.Time) byte {
		r := hmacRequest(productSecret, "sn-1", "meter", device, ts, now)
		_, code := connect5(t, addr, "sn-1", r.Username, string(r.Password), nil)
		return code
	}
	require.Zero(t, dial("m-1", now))
	require.Zero(t, dial("m-1", now.Add(time.Millisecond)), "a new signature of the same device")
	require.Equal(t, byte(0x86), dial("m-2", now.Add(2*time.Millisecond)), "another device of the product")
}

// Of identities racing for a free client ID, one wins: the engine decides
// ownership under one lock.
func TestEngineSessionOwnerRace(t *testing.T) {
	h := NewHook(HookOptions{Chain: &Chain{Providers: []Provider{passwords{"alice": "a", "bob": "b"}}}})
	addr := startEngine(t, h)
	for round := range 10 {
		id := fmt.Sprintf("race-%d", round)
		var mu sync.Mutex
		won := map[string]bool{}
		var wg sync.WaitGroup
		for i := range 6 {
			user, pass := "alice", "a"
			if i%2 == 1 {
				user, pass = "bob", "b"
			}
			wg.Go(func() {
				if _, code := connect5(t, addr, id, user, pass, nil); code == 0 {
					mu.Lock()
					won[user] = true
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		require.Len(t, won, 1, "round %d: one identity holds the ID: %v", round, won)
	}
}
