package auth

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
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

// parked is a fake session layer: the owners of sessions parked on disk.
type parked struct {
	mu     sync.Mutex
	owners map[string]string
	asked  []string
}

func (p *parked) owner(clientID string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, clientID)
	u, ok := p.owners[clientID]
	return u, ok
}

func (p *parked) questions() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.asked...)
}

// hookServer is a real mochi server (not serving) with the hook attached,
// for driving the hook as mochi's connection code would.
type hookServer struct {
	t *testing.T
	h *Hook
	s *mqtt.Server
}

func newHookServer(t *testing.T, o HookOptions) *hookServer {
	t.Helper()
	s := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	h := NewHook(o)
	h.Attach(s)
	require.NoError(t, s.AddHook(h, nil))
	t.Cleanup(func() { _ = s.Close() })
	return &hookServer{t: t, h: h, s: s}
}

// connect authenticates a new connection of id as mochi does before
// CONNACK; when accepted, the client joins mochi's client list (replacing
// an older one of the same ID), as mochi's takeover does.
func (hs *hookServer) connect(id, user, pass string, clean bool) (*mqtt.Client, bool) {
	hs.t.Helper()
	cl := hs.s.NewClient(nil, "tcp", id, false)
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4, Connect: packets.ConnectParams{
		ClientIdentifier: id, Clean: clean, ProtocolName: []byte("MQTT"),
		UsernameFlag: user != "", Username: []byte(user), PasswordFlag: pass != "", Password: []byte(pass),
	}}
	cl.ParseConnect("tcp", pk)
	if !hs.h.OnConnectAuthenticate(cl, pk) {
		return cl, false
	}
	hs.s.Clients.Add(cl)
	return cl, true
}

// disconnect ends cl's connection as mochi does: OnDisconnect, then a
// clean session leaves the client list, a persistent one stays (offline).
func (hs *hookServer) disconnect(cl *mqtt.Client) {
	cl.Stop(nil)
	hs.h.OnDisconnect(cl, nil, cl.Properties.Clean)
	if cl.Properties.Clean {
		hs.s.Clients.Delete(cl.ID)
	}
}

func (hs *hookServer) tracked(id string) bool {
	_, ok := hs.h.clients.Load(id)
	return ok
}

// A client ID whose session exists — online, offline in mochi's list, or
// parked on disk — may be taken only by the identity that owns it, with
// or without a clean start; the hook itself keeps nothing of an offline
// session.
func TestHookSessionOwner(t *testing.T) {
	store := &parked{owners: map[string]string{"parked-1": "alice"}}
	acl, err := NewACL([]ACLRule{{Action: ActionAllow, Publish: []string{"devices/%u/#"}, Subscribe: []string{"devices/%u/#"}}})
	require.NoError(t, err)
	hs := newHookServer(t, HookOptions{
		Chain:        &Chain{Providers: []Provider{passwords{"alice": "a", "bob": "b"}}},
		ACL:          acl,
		SessionOwner: store.owner,
	})

	// Online.
	a1, ok := hs.connect("car-1", "alice", "a", false)
	require.True(t, ok)
	require.Equal(t, []string{"car-1"}, store.questions(), "a free ID: the parked store is asked")
	_, ok = hs.connect("car-1", "bob", "b", false)
	require.False(t, ok, "another identity, persistent session")
	_, ok = hs.connect("car-1", "bob", "b", true)
	require.False(t, ok, "another identity, clean start")
	_, ok = hs.connect("car-1", "alice", "wrong", false)
	require.False(t, ok, "the owner's name with a wrong password")
	a2, ok := hs.connect("car-1", "alice", "a", false)
	require.True(t, ok, "the owner takes over")
	require.Equal(t, a2, hs.h.session(a2).owner)
	require.Nil(t, hs.h.session(a1), "the replaced connection is not a live session")
	hs.disconnect(a1) // the old connection ends after the takeover
	require.NotNil(t, hs.h.session(a2), "it does not forget its successor")

	// Offline in mochi's list: the hook forgot it; its client object
	// names the owner.
	hs.disconnect(a2)
	require.False(t, hs.tracked("car-1"), "nothing kept for an offline session")
	offline, ok := hs.s.Clients.Get("car-1")
	require.True(t, ok)
	require.Equal(t, "alice", string(offline.Properties.Username))
	// Deliveries queued for it are checked by that username.
	require.True(t, hs.h.OnACLCheck(offline, "devices/alice/cmd", false))
	require.False(t, hs.h.OnACLCheck(offline, "devices/bob/cmd", false))
	_, ok = hs.connect("car-1", "bob", "b", true)
	require.False(t, ok, "offline session: another identity, clean start")
	require.Len(t, store.questions(), 1, "while mochi holds a client of the ID, the parked store is not asked")

	// Parked: mochi no longer holds it, SessionOwner answers.
	hs.s.Clients.Delete("car-1")
	store.mu.Lock()
	store.owners["car-1"] = "alice"
	store.mu.Unlock()
	for _, id := range []string{"car-1", "parked-1"} {
		_, ok = hs.connect(id, "bob", "b", false)
		require.False(t, ok, "%s parked: another identity", id)
		_, ok = hs.connect(id, "bob", "b", true)
		require.False(t, ok, "%s parked: another identity, clean start", id)
		cl, ok := hs.connect(id, "alice", "a", false)
		require.True(t, ok, "%s parked: the owner", id)
		hs.disconnect(cl)
	}
	require.Contains(t, store.questions(), "parked-1")

	// A free ID goes to whoever comes first; a clean session leaves no owner.
	b, ok := hs.connect("car-2", "bob", "b", true)
	require.True(t, ok)
	hs.disconnect(b)
	require.False(t, hs.tracked("car-2"))
	_, ok = hs.connect("car-2", "alice", "a", true)
	require.True(t, ok)
}

// Without an auth chain every identity is anonymous (empty username), so
// session ownership never refuses anyone.
func TestHookSessionOwnerAnonymous(t *testing.T) {
	hs := newHookServer(t, HookOptions{SessionOwner: func(string) (string, bool) { return "", true }})
	a, ok := hs.connect("dev", "", "", false)
	require.True(t, ok)
	_, ok = hs.connect("dev", "", "", true)
	require.True(t, ok, "online")
	hs.disconnect(a)
	_, ok = hs.connect("dev", "", "", false)
	require.True(t, ok, "offline")
	_, ok = hs.connect("parked", "", "", true)
	require.True(t, ok, "parked")
	_, ok = hs.connect("dev", "someone", "pw", false)
	require.False(t, ok, "credentials nobody recognises are still refused")
}

// The owner is the identity's username, not the CONNECT's: an HMAC device
// signs a new username ("<product>:<device>:<ms>") at every connect and
// must still own its session.
func TestHookSessionOwnerDerivedUsername(t *testing.T) {
	hs := newHookServer(t, HookOptions{Chain: &Chain{Providers: []Provider{newTestHMAC(t, HMACOptions{})}}})
	now := time.Now()
	dial := func(device string, ts time.Time) (*mqtt.Client, bool) {
		r := hmacRequest(productSecret, "sn-1", "meter", device, ts, now)
		return hs.connect("sn-1", r.Username, string(r.Password), false)
	}
	cl, ok := dial("m-1", now)
	require.True(t, ok)
	require.Equal(t, "meter:m-1", string(cl.Properties.Username), "the identity's username replaces the CONNECT's")
	hs.disconnect(cl)
	_, ok = dial("m-1", now.Add(time.Millisecond))
	require.True(t, ok, "a new signature of the same device")
	_, ok = dial("m-2", now.Add(2*time.Millisecond))
	require.False(t, ok, "another device of the product")
}

// Of identities racing for a free client ID, one wins.
func TestHookSessionOwnerRace(t *testing.T) {
	hs := newHookServer(t, HookOptions{Chain: &Chain{Providers: []Provider{passwords{"alice": "a", "bob": "b"}}}})
	for round := range 20 {
		id := fmt.Sprintf("race-%d", round)
		var winners sync.Map
		var wg sync.WaitGroup
		var accepted atomic.Int32
		for i := range 8 {
			user, pass := "alice", "a"
			if i%2 == 1 {
				user, pass = "bob", "b"
			}
			wg.Go(func() {
				cl := hs.s.NewClient(nil, "tcp", id, false)
				pk := packets.Packet{Connect: packets.ConnectParams{Username: []byte(user), Password: []byte(pass)}}
				if hs.h.OnConnectAuthenticate(cl, pk) {
					winners.Store(user, true)
					accepted.Add(1)
				}
			})
		}
		wg.Wait()
		n := 0
		winners.Range(func(any, any) bool { n++; return true })
		require.Equal(t, 1, n, "round %d: one identity holds the ID", round)
		require.GreaterOrEqual(t, accepted.Load(), int32(1))
	}
}

// A publish to $SYS (any case, as mochi tests it) becomes one the ACL
// refuses, even with no ACL rules; so does one into the internal
// namespace. A topic alias is resolved before the ACL sees the topic.
func TestHookPublishTopics(t *testing.T) {
	hs := newHookServer(t, HookOptions{})
	cl, ok := hs.connect("dev", "", "", true)
	require.True(t, ok)
	read := func(topic string, alias uint16) string {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1, TopicName: topic}
		pk.Properties.TopicAlias, pk.Properties.TopicAliasFlag = alias, alias > 0
		out, err := hs.h.OnPacketRead(cl, pk)
		require.NoError(t, err)
		return out.TopicName
	}
	for _, topic := range []string{"$SYS/broker/x", "$sys/x", "$SYS", "$SYStem/x"} {
		got := read(topic, 0)
		require.NotEqual(t, topic, got)
		require.False(t, hs.h.OnACLCheck(cl, got, true), topic)
	}
	for _, topic := range []string{"devices/dev/x", "$other/x", "SYS/x"} {
		require.Equal(t, topic, read(topic, 0))
		require.True(t, hs.h.OnACLCheck(cl, topic, true), topic)
	}
	require.False(t, hs.h.OnACLCheck(cl, "$ferrymq/p2p/other", true), "no publishing into the internal namespace")
	require.False(t, hs.h.OnACLCheck(cl, "$ferrymq/p2p/other", false), "nor reading another's commands")
	require.True(t, hs.h.OnACLCheck(cl, "$ferrymq/p2p/dev", false), "its own commands")

	cl.State.TopicAliases.Inbound.Set(3, "devices/dev/aliased")
	require.Equal(t, "devices/dev/aliased", read("", 3))
	require.Empty(t, read("", 4), "an unknown alias stays empty")
	require.Equal(t, "devices/dev/new", read("devices/dev/new", 3), "a topic with an alias is kept")

	// Not a publish, or the inline client: untouched.
	pk, err := hs.h.OnPacketRead(cl, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, TopicName: "$SYS/x"})
	require.NoError(t, err)
	require.Equal(t, "$SYS/x", pk.TopicName)
	inline := hs.s.NewClient(nil, mqtt.LocalListener, "inline", true)
	pk, err = hs.h.OnPacketRead(inline, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "$SYS/x"})
	require.NoError(t, err)
	require.Equal(t, "$SYS/x", pk.TopicName)
}

// The subscription cap counts the client's own subscriptions: not the
// bridge's internal one, and not a filter it subscribes again.
func TestHookSubscriptionCap(t *testing.T) {
	hs := newHookServer(t, HookOptions{Quotas: NewQuotas(QuotaConfig{MaxSubscriptions: 2, MaxTopicLevels: 3}, nil)})
	cl, ok := hs.connect("dev", "", "", true)
	require.True(t, ok)
	cl.State.Subscriptions.Add(mqtttopic.P2P+"dev", packets.Subscription{Filter: mqtttopic.P2P + "dev"})
	subscribe := func(filters ...string) []string {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}}
		for _, f := range filters {
			pk.Filters = append(pk.Filters, packets.Subscription{Filter: f})
		}
		var out []string
		for _, f := range hs.h.OnSubscribe(cl, pk).Filters {
			out = append(out, f.Filter)
			if f.Filter != refusedFilter {
				cl.State.Subscriptions.Add(f.Filter, f)
			}
		}
		return out
	}
	require.Equal(t, []string{"a/#", refusedFilter}, subscribe("a/#", "a/b/c/d"), "too deep")
	require.Equal(t, []string{"b", refusedFilter}, subscribe("b", "c"), "two of two")
	require.Equal(t, []string{"a/#", "b"}, subscribe("a/#", "b"), "subscribing again takes no place")
	cl.State.Subscriptions.Delete("b")
	require.Equal(t, []string{"$share/g/c", refusedFilter}, subscribe("$share/g/c", "d"))
}

// Templates are filled in with the identity's username, which a provider
// may derive from the credential: one unusable in a filter is refused at
// CONNECT when the ACL uses %u.
func TestHookTemplateSafeIdentity(t *testing.T) {
	acl, err := NewACL([]ACLRule{{Action: ActionAllow, Publish: []string{"users/%u/#"}}})
	require.NoError(t, err)
	named := namedBy("spiffe://fleet/car-1")
	hs := newHookServer(t, HookOptions{Chain: &Chain{Providers: []Provider{named}}, ACL: acl})
	_, ok := hs.connect("car-1", "", "x", true)
	require.False(t, ok, "'/' in the derived username")
	hs = newHookServer(t, HookOptions{Chain: &Chain{Providers: []Provider{named}}})
	_, ok = hs.connect("car-1", "", "x", true)
	require.True(t, ok, "no templates: any name will do")
}

// namedBy is a Provider that admits everyone under one derived username.
type namedBy string

func (namedBy) Name() string { return "named" }

func (n namedBy) Authenticate(*Request) (Identity, error) { return Identity{Username: string(n)}, nil }

// Shared subscriptions reach into the internal namespace no more than
// plain ones.
func TestHookInternalNamespace(t *testing.T) {
	hs := newHookServer(t, HookOptions{})
	cl, ok := hs.connect("dev", "", "", true)
	require.True(t, ok)
	for _, f := range []string{"$ferrymq/p2p/other", "$ferrymq/#", "$share/g/$ferrymq/p2p/other", "$share/g/$ferrymq/p2p/dev"} {
		require.False(t, hs.h.OnACLCheck(cl, f, false), f)
	}
	require.True(t, hs.h.OnACLCheck(cl, "$share/g/devices/#", false), "no ACL: other shared subscriptions pass")
}

// Readable is the delivery check for parked sessions: the read ACL by
// username, and only its own point-to-point topic in the internal namespace.
func TestHookReadable(t *testing.T) {
	acl, err := NewACL([]ACLRule{
		{Action: ActionDeny, Subscribe: []string{"devices/secret"}},
		{Action: ActionAllow, Subscribe: []string{"devices/#"}, Users: []string{"ops"}},
	})
	require.NoError(t, err)
	h := NewHook(HookOptions{ACL: acl})
	require.True(t, h.Readable("c1", "ops", "devices/ok"))
	require.False(t, h.Readable("c1", "ops", "devices/secret"), "denied topic")
	require.False(t, h.Readable("c1", "guest", "devices/ok"), "rules go by username")
	require.True(t, h.Readable("c1", "", "$ferrymq/p2p/c1"), "its own commands")
	require.False(t, h.Readable("c1", "ops", "$ferrymq/p2p/c2"), "another client's commands")
}

// A connection that authenticated but whose CONNACK failed (mochi tells no
// hook: no OnDisconnect) does not keep its client ID from another identity.
func TestHookFailedConnackOwnsNothing(t *testing.T) {
	hs := newHookServer(t, HookOptions{Chain: &Chain{Providers: []Provider{passwords{"alice": "a", "bob": "b"}}}})
	cl, ok := hs.connect("dev-1", "alice", "a", true)
	require.True(t, ok)
	hs.s.Clients.Delete(cl.ID) // the CONNACK write failed: mochi drops it without hooks
	_, ok = hs.connect("dev-1", "bob", "b", true)
	require.False(t, ok, "alice's connection is still open in the hook's view")
	cl.Stop(nil)
	_, ok = hs.connect("dev-1", "bob", "b", true)
	require.True(t, ok, "a closed connection owns nothing")
}
