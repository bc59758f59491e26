package gateway_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// waitParked waits until id's session is offline (its messages in the
// session store, stubs in memory).
func waitParked(t *testing.T, env *gatewaytest.Env, id string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, offline, ok := sessionOf(env, id)
		return ok && offline
	}, 10*time.Second, 10*time.Millisecond, "%s offline", id)
}

// An offline car is parked; what reaches it afterwards — another device's
// QoS 1 publish on a topic it subscribed, a point-to-point command, a
// downlink command on a subscribed topic — is queued on disk, QoS 0 and
// non-matching topics are not; when it reconnects it gets the three in
// order, and the two commands get "delivered" receipts.
func TestParkedSessionQueuesOnDisk(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Sessions: true})
	persistent := func(o *paho3.ClientOptions) { o.SetCleanSession(false) }
	c := dialV3(t, env.TCP, "car9", persistent)
	for _, f := range []string{"cars/car9/#", "fleet/all"} {
		tok := c.Subscribe(f, 1, nil)
		require.True(t, tok.WaitTimeout(5*time.Second))
		require.NoError(t, tok.Error())
	}
	c.Disconnect(100)
	waitParked(t, env, "car9")

	other := dialV3(t, env.TCP, "car10")
	for _, p := range []struct {
		topic string
		qos   byte
		body  string
	}{{"cars/car9/door", 1, "open"}, {"cars/car9/door", 0, "qos0"}, {"cars/car10/door", 1, "not-car9"}} {
		tok := other.Publish(p.topic, p.qos, false, p.body)
		require.True(t, tok.WaitTimeout(5*time.Second))
		require.NoError(t, tok.Error())
	}
	require.Eventually(t, func() bool { q, _, _ := sessionOf(env, "car9"); return q == 1 },
		10*time.Second, 10*time.Millisecond, "the QoS 1 publish is queued, the QoS 0 one and car10's are not")
	p2p := command(t, env, "car9", "wake", map[string]string{bridge.PropClientID: "car9"})
	require.Eventually(t, func() bool { q, _, _ := sessionOf(env, "car9"); return q == 2 },
		10*time.Second, 10*time.Millisecond)
	fleet := command(t, env, "fleet", "update", map[string]string{bridge.PropTopic: "fleet/all"})
	require.Eventually(t, func() bool { q, _, _ := sessionOf(env, "car9"); return q == 3 },
		10*time.Second, 10*time.Millisecond)
	ci, ok := env.Gateway.Engine().Client("car9")
	require.True(t, ok && !ci.Connected)
	require.Equal(t, len("open")+len("wake")+len("update"), ci.QueuedBytes)

	var got received
	again := dialV3(t, env.TCP, "car9", persistent, func(o *paho3.ClientOptions) {
		o.SetDefaultPublishHandler(got.add).SetOrderMatters(true)
	})
	require.Eventually(t, func() bool { return len(got.get()) == 3 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"cars/car9/door=open", "commands/car9=wake", "fleet/all=update"}, got.get())
	require.Eventually(t, func() bool {
		rs := receipts(t, env)
		return rs[p2p].Outcome == bridge.OutcomeDelivered && rs[fleet].Outcome == bridge.OutcomeDelivered
	}, 10*time.Second, 10*time.Millisecond, "receipts for both commands")
	_, offline, _ := sessionOf(env, "car9")
	require.False(t, offline)
	require.Eventually(t, func() bool { q, _, _ := sessionOf(env, "car9"); return q == 0 },
		10*time.Second, 10*time.Millisecond, "acknowledged messages leave the log")

	// Subscriptions came back too: a new publish reaches the online car.
	tok := other.Publish("cars/car9/door", 1, false, "closed")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.Eventually(t, func() bool { return len(got.get()) == 4 }, 10*time.Second, 10*time.Millisecond)
	again.Disconnect(100)
}

// A queued command whose TTL passes while its car is parked gets an
// "expired" receipt and is not delivered; a parked MQTT 5 session whose
// expiry passes is dropped with its queue ("expired" receipts).
func TestParkedExpiry(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Sessions: true})
	c := dialV3(t, env.TCP, "car11", func(o *paho3.ClientOptions) { o.SetCleanSession(false) })
	c.Disconnect(100)
	waitParked(t, env, "car11")
	short := command(t, env, "car11", "soon-stale", map[string]string{bridge.PropClientID: "car11", bridge.PropTTL: "1s"})
	long := command(t, env, "car11", "fresh", map[string]string{bridge.PropClientID: "car11"})
	require.Eventually(t, func() bool { return receipts(t, env)[short].Outcome == bridge.OutcomeExpired },
		10*time.Second, 20*time.Millisecond, "expired receipt for the 1 s command")
	q, _, _ := sessionOf(env, "car11")
	require.Equal(t, 1, q)
	var got received
	dialV3(t, env.TCP, "car11", func(o *paho3.ClientOptions) { o.SetCleanSession(false).SetDefaultPublishHandler(got.add) })
	require.Eventually(t, func() bool { return receipts(t, env)[long].Outcome == bridge.OutcomeDelivered },
		10*time.Second, 20*time.Millisecond)
	require.Equal(t, []string{"commands/car11=fresh"}, got.get())

	v5 := dialV5With(t, env.TCP, &paho.Connect{ClientID: "car12", KeepAlive: 30, CleanStart: true,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: ptr(uint32(2))}}, nil)
	require.NoError(t, v5.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	<-v5.Done()
	waitParked(t, env, "car12")
	orphan := command(t, env, "car12", "never", map[string]string{bridge.PropClientID: "car12"})
	require.Eventually(t, func() bool {
		r := receipts(t, env)[orphan]
		_, _, stored := sessionOf(env, "car12")
		return r.Outcome == bridge.OutcomeExpired && r.Reason == "the session expired" && !stored
	}, 10*time.Second, 20*time.Millisecond, "the session expired with its queue")
}

// startRefusingReceipts starts a gateway with sessions whose durable
// discards go through a stand-in for a core that refuses writes while
// refusing is set (it starts set); calls counts the attempts. (A real full
// disk is in the torture run.)
func startRefusingReceipts(t *testing.T) (env *gatewaytest.Env, refusing *atomic.Bool, calls *atomic.Int32) {
	var envp atomic.Pointer[gatewaytest.Env]
	refusing, calls = new(atomic.Bool), new(atomic.Int32)
	refusing.Store(true)
	d := &refusingDelivery{env: &envp, refusing: refusing, calls: calls}
	env = gatewaytest.Start(t, gatewaytest.Options{Sessions: true, Gateway: gateway.Options{Hooks: engine.Hooks{Delivery: d}}})
	envp.Store(env)
	return env, refusing, calls
}

// refusingDelivery is the bridge's Delivery with its durable discards
// refused while refusing is set.
type refusingDelivery struct {
	env      *atomic.Pointer[gatewaytest.Env]
	refusing *atomic.Bool
	calls    *atomic.Int32
}

func (d *refusingDelivery) Sent(id string, m *engine.Message, pid uint16, dup bool, at time.Time) {
	d.env.Load().Bridge.Sent(id, m, pid, dup, at)
}
func (d *refusingDelivery) Delivered(id string, m *engine.Message, pid uint16) {
	d.env.Load().Bridge.Delivered(id, m, pid)
}
func (d *refusingDelivery) Discarded(id string, m *engine.Message, expired bool, reason string) {
	d.env.Load().Bridge.Discarded(id, m, expired, reason)
}

func (d *refusingDelivery) DiscardedDurably(ctx context.Context, id string, m *engine.Message, expired bool, reason string) error {
	d.calls.Add(1)
	if d.refusing.Load() {
		return errors.New("the core refuses writes")
	}
	return d.env.Load().Bridge.DiscardedDurably(ctx, id, m, expired, reason)
}

// A queued command that expires while its car is parked leaves the queue
// only once its "expired" receipt is stored: while the core refuses the
// receipt (a full disk until the store is reopened), the command stays
// queued — expired, never delivered — and the receipt is tried again at
// each sweep.
func TestParkedExpiryReceiptIsNotLost(t *testing.T) {
	env, refusing, calls := startRefusingReceipts(t)
	c := dialV3(t, env.TCP, "car14", func(o *paho3.ClientOptions) { o.SetCleanSession(false) })
	c.Disconnect(100)
	waitParked(t, env, "car14")
	short := command(t, env, "car14", "stale", map[string]string{bridge.PropClientID: "car14", bridge.PropTTL: "1s"})
	require.Eventually(t, func() bool { return calls.Load() >= 2 }, 10*time.Second, 10*time.Millisecond, "the receipt is asked for")
	q, _, _ := sessionOf(env, "car14")
	require.Equal(t, 1, q, "refused: the command stays queued")
	_, receipted := receipts(t, env)[short]
	require.False(t, receipted)
	refusing.Store(false) // the store was reopened
	require.Eventually(t, func() bool { return receipts(t, env)[short].Outcome == bridge.OutcomeExpired },
		10*time.Second, 20*time.Millisecond, "stored once the core takes it")
	require.Eventually(t, func() bool { q, _, _ := sessionOf(env, "car14"); return q == 0 },
		10*time.Second, 10*time.Millisecond, "and only then the command leaves the queue")
	require.GreaterOrEqual(t, calls.Load(), int32(3))
}

// A parked MQTT 5 session whose expiry passes while the core refuses its
// queued commands' receipts is not ended (the commands stay, undelivered)
// until the receipts are stored; meanwhile it is gone for its client: a
// reconnect gets no session and not the commands.
func TestExpiredSessionWaitsForItsReceipts(t *testing.T) {
	env, refusing, calls := startRefusingReceipts(t)
	connect := func() *paho.Client {
		return dialV5With(t, env.TCP, &paho.Connect{ClientID: "car15", KeepAlive: 30, CleanStart: false,
			Properties: &paho.ConnectProperties{SessionExpiryInterval: ptr(uint32(1))}}, nil)
	}
	v5 := connect()
	require.NoError(t, v5.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	<-v5.Done()
	waitParked(t, env, "car15")
	a := command(t, env, "car15", "a", map[string]string{bridge.PropClientID: "car15"})
	b := command(t, env, "car15", "b", map[string]string{bridge.PropClientID: "car15"})
	require.Eventually(t, func() bool { return calls.Load() >= 4 }, 10*time.Second, 10*time.Millisecond,
		"the expired session's receipts are asked for")
	require.Eventually(t, func() bool { _, _, stored := sessionOf(env, "car15"); return !stored }, 10*time.Second, 10*time.Millisecond,
		"expired: gone for its client at once")
	for _, id := range []string{a, b} {
		_, receipted := receipts(t, env)[id]
		require.False(t, receipted, "no receipt while refused")
	}
	refusing.Store(false)
	require.Eventually(t, func() bool {
		rs := receipts(t, env)
		return rs[a].Reason == "the session expired" && rs[b].Reason == "the session expired"
	}, 10*time.Second, 20*time.Millisecond, "receipts stored, then the session ends")

	// Expired and still held (receipts refused again): a reconnect finds
	// nothing of it.
	refusing.Store(true)
	v5 = connect()
	require.NoError(t, v5.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	<-v5.Done()
	waitParked(t, env, "car15")
	c := command(t, env, "car15", "c", map[string]string{bridge.PropClientID: "car15"})
	before := calls.Load()
	require.Eventually(t, func() bool { return calls.Load() > before+1 }, 10*time.Second, 10*time.Millisecond)
	var delivered atomic.Int32
	conn, err := net.DialTimeout("tcp", env.TCP, 5*time.Second)
	require.NoError(t, err)
	back := paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(paho.PublishReceived) (bool, error) { delivered.Add(1); return true, nil }}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ca, err := back.Connect(ctx, &paho.Connect{ClientID: "car15", KeepAlive: 30, CleanStart: false,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: ptr(uint32(60))}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = back.Disconnect(&paho.Disconnect{ReasonCode: 0}); <-back.Done() })
	require.False(t, ca.SessionPresent, "an expired session is not resumed")
	require.Never(t, func() bool { return delivered.Load() > 0 }, 300*time.Millisecond, 10*time.Millisecond,
		"a command of the expired session was delivered")
	refusing.Store(false)
	require.Eventually(t, func() bool { return receipts(t, env)[c].Outcome == bridge.OutcomeExpired },
		10*time.Second, 20*time.Millisecond)
}

// A clean start discards a parked session: nothing is delivered, the
// queued command gets a "dropped" receipt, CONNACK says no session.
func TestCleanStartDiscardsParkedSession(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Sessions: true})
	c := dialV3(t, env.TCP, "car13", func(o *paho3.ClientOptions) { o.SetCleanSession(false) })
	c.Disconnect(100)
	waitParked(t, env, "car13")
	id := command(t, env, "car13", "old", map[string]string{bridge.PropClientID: "car13"})
	require.Eventually(t, func() bool { q, _, _ := sessionOf(env, "car13"); return q == 1 },
		10*time.Second, 10*time.Millisecond)
	var got received
	clean := dialV3(t, env.TCP, "car13", func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add) })
	require.Eventually(t, func() bool { return receipts(t, env)[id].Outcome == bridge.OutcomeDropped },
		10*time.Second, 20*time.Millisecond)
	require.Never(t, func() bool { return len(got.get()) > 0 }, 200*time.Millisecond, 10*time.Millisecond)
	clean.Disconnect(100)
	require.Eventually(t, func() bool { _, _, stored := sessionOf(env, "car13"); return !stored }, 5*time.Second, 10*time.Millisecond,
		"a clean session is not kept")
}

// A point-to-point command for a client ID this node has never seen is
// held: a car that connects within the hold gets it; one that never
// connects gets an "expired" receipt; the hold per client is bounded.
func TestPointToPointHeldForUnknownClient(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Bridge: bridge.Options{HoldUnknown: 1500 * time.Millisecond, OfflineMaxMessages: 2}})
	first := command(t, env, "new-car", "provision", map[string]string{bridge.PropClientID: "new-car"})
	ghost := command(t, env, "ghost", "hello?", map[string]string{bridge.PropClientID: "ghost"})
	command(t, env, "ghost", "hello again", map[string]string{bridge.PropClientID: "ghost"})
	over := command(t, env, "ghost", "one too many", map[string]string{bridge.PropClientID: "ghost"})
	require.Eventually(t, func() bool { return receipts(t, env)[over].Outcome == bridge.OutcomeDropped },
		10*time.Second, 10*time.Millisecond, "the third command for ghost is over its hold")

	var got received
	c := dialV3(t, env.TCP, "new-car", func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add) })
	require.Eventually(t, func() bool { return len(got.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"commands/new-car=provision"}, got.get())
	require.Eventually(t, func() bool {
		rs := receipts(t, env)
		return rs[first].Outcome == bridge.OutcomeDelivered && rs[ghost].Outcome == bridge.OutcomeExpired
	}, 10*time.Second, 20*time.Millisecond, "delivered to new-car; expired for ghost")
	require.Equal(t, "the client did not connect to this node in time", receipts(t, env)[ghost].Reason)
	c.Disconnect(100)
}

// passwordIsUser authenticates anyone whose password is "pw-" + username
// (a stand-in provider: the point is the identity, not the credential).
type passwordIsUser struct{}

func (passwordIsUser) Name() string { return "test" }

func (passwordIsUser) Authenticate(r *auth.Request) (auth.Identity, error) {
	if string(r.Password) != "pw-"+r.Username {
		return auth.Identity{}, errors.New("wrong password")
	}
	return auth.Identity{ClientID: r.ClientID, Username: r.Username}, nil
}

// A parked session keeps its owner: another identity with valid
// credentials may not take the client ID over (CONNACK refused), the owner
// resumes it and gets what was queued.
func TestParkedSessionKeepsItsOwner(t *testing.T) {
	hook := auth.NewHook(auth.HookOptions{Chain: &auth.Chain{Providers: []auth.Provider{passwordIsUser{}}}})
	env := gatewaytest.Start(t, gatewaytest.Options{Sessions: true, Auth: hook})
	persistent := func(user string) func(*paho3.ClientOptions) {
		return func(o *paho3.ClientOptions) { o.SetCleanSession(false).SetUsername(user).SetPassword("pw-" + user) }
	}
	c := dialV3(t, env.TCP, "car14", persistent("alice"))
	c.Disconnect(100)
	waitParked(t, env, "car14")
	command(t, env, "car14", "for-alice", map[string]string{bridge.PropClientID: "car14"})
	require.Eventually(t, func() bool { q, _, _ := sessionOf(env, "car14"); return q == 1 },
		10*time.Second, 10*time.Millisecond)

	_, err := dialAuth(t, env.TCP, "car14", "mallory", "pw-mallory", persistent("mallory"))
	require.Error(t, err, "another identity may not take the parked session")
	q, offline, ok := sessionOf(env, "car14")
	require.True(t, ok && offline && q == 1, "the session is untouched")

	var got received
	dialV3(t, env.TCP, "car14", persistent("alice"), func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add) })
	require.Eventually(t, func() bool { return len(got.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"commands/car14=for-alice"}, got.get())
}

// A will whose delay had not run out when the gateway stopped is published
// after the restart, once its delay (counted from the start) has passed —
// not at once; a client that connects again within the delay cancels it.
func TestWillDelaySurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	env := gatewaytest.Start(t, gatewaytest.Options{Dir: dir, Sessions: true})
	for _, id := range []string{"car15", "car16"} {
		c := dialV5With(t, env.TCP, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true,
			Properties:     &paho.ConnectProperties{SessionExpiryInterval: ptr(uint32(60))},
			WillMessage:    &paho.WillMessage{Topic: "status/" + id, QoS: 1, Payload: []byte("gone")},
			WillProperties: &paho.WillProperties{WillDelayInterval: ptr(uint32(2))}}, nil)
		_ = c // the gateway stops under it: no DISCONNECT, the will is due
	}
	env.Stop(t)

	env = gatewaytest.Start(t, gatewaytest.Options{Dir: dir, Sessions: true})
	started := time.Now()
	var got received
	w := dialV3(t, env.TCP, "watcher")
	tok := w.Subscribe("status/#", 1, got.add)
	require.True(t, tok.WaitTimeout(5*time.Second))
	back := dialV5With(t, env.TCP, &paho.Connect{ClientID: "car16", KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: ptr(uint32(60))}}, nil)
	require.Eventually(t, func() bool { return len(got.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(started), 1900*time.Millisecond, "not before its delay")
	require.Equal(t, []string{"status/car15=gone"}, got.get(), "car16 came back within its delay: no will")
	// car16's will was due with car15's: it would have followed by now.
	require.Never(t, func() bool { return len(got.get()) > 1 }, 500*time.Millisecond, 10*time.Millisecond,
		"a will published although its client came back within the delay")
	require.Len(t, got.get(), 1)
	require.NoError(t, back.Disconnect(&paho.Disconnect{ReasonCode: 0}))
}

// An inbound QoS 2 publish answered PUBREC survives a restart of the
// gateway: the client's PUBREL afterwards gets a successful PUBCOMP (not
// 0x92 "packet identifier not found"), and the message is stored once.
func TestInboundQoS2SurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	env := gatewaytest.Start(t, gatewaytest.Options{Dir: dir, Sessions: true})
	connect := packet(0x10, str("MQTT"), []byte{5, 0x00, 0, 60, 5, 0x11, 0, 0, 0, 60}, str("car17")) // clean start 0, expiry 60 s
	c := rawConn(t, env.TCP, connect)
	_, err := c.Write(packet(0x34, str("cars/car17/trip"), []byte{0, 7, 0}, []byte("42 km")))
	require.NoError(t, err)
	p := readPacket(t, c)
	typ, body := p[0], p[2:]
	require.Equal(t, byte(0x50), typ, "PUBREC")
	require.Equal(t, []byte{0, 7}, body[:2])
	require.NoError(t, c.Close()) // gone before PUBREL
	env.Stop(t)

	env = gatewaytest.Start(t, gatewaytest.Options{Dir: dir, Sessions: true})
	c = rawConn(t, env.TCP, connect)
	_, err = c.Write([]byte{0x62, 2, 0, 7}) // PUBREL 7
	require.NoError(t, err)
	for {
		p = readPacket(t, c)
		typ, body = p[0], p[2:]
		if typ == 0x50 {
			continue // mochi resends the PUBREC of a resumed session first
		}
		require.Equal(t, byte(0x70), typ, "PUBCOMP")
		require.Equal(t, []byte{0, 7}, body[:2])
		if len(body) > 2 {
			require.Equal(t, byte(0), body[2], "PUBCOMP success, not 0x92")
		}
		break
	}
	require.Len(t, readAll(t, env.Store, "cars"), 1, "stored once")
	q, _, _ := sessionOf(env, "car17")
	require.Equal(t, 0, q, "the PUBCOMP removed it from the session")
}
