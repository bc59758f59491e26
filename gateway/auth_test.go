package gateway_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// authEnv runs a gateway whose devices authenticate from a static file
// (car1/secret1, car2/secret2, bound to client IDs car1, car2) and are
// confined to their own topics.
func authEnv(t *testing.T, q *auth.Quotas) *gatewaytest.Env {
	t.Helper()
	var users strings.Builder
	users.WriteString("users:\n")
	for _, u := range [][2]string{{"car1", "secret1"}, {"car2", "secret2"}} {
		h, err := bcrypt.GenerateFromPassword([]byte(u[1]), bcrypt.MinCost)
		require.NoError(t, err)
		users.WriteString("  - username: " + u[0] + "\n    password_hash: \"" + string(h) + "\"\n    clientid: " + u[0] + "\n")
	}
	path := filepath.Join(t.TempDir(), "users.yaml")
	require.NoError(t, os.WriteFile(path, []byte(users.String()), 0o600))
	static, err := auth.NewStaticFile(path, time.Minute, zerologNop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = static.Close() })
	acl, err := auth.NewACL([]auth.ACLRule{{Action: "allow", Publish: []string{"devices/%c/#"}, Subscribe: []string{"devices/%c/commands/#"}}})
	require.NoError(t, err)
	return gatewaytest.Start(t, gatewaytest.Options{Auth: auth.NewHook(auth.HookOptions{
		Chain: &auth.Chain{Providers: []auth.Provider{static}}, ACL: acl, Quotas: q,
	})})
}

func dialAuth(t *testing.T, addr, id, user, pass string, tune ...func(*paho3.ClientOptions)) (paho3.Client, error) {
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetUsername(user).SetPassword(pass).
		SetAutoReconnect(false).SetConnectRetry(false)
	for _, f := range tune {
		f(o)
	}
	c := paho3.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	if tok.Error() == nil {
		t.Cleanup(func() { c.Disconnect(50) })
	}
	return c, tok.Error()
}

// Only known devices get in; MQTT 5 sees 0x86, MQTT 3 return code 5 (mochi's
// mapping of 0x86; 4 once gateway/conn.go rewrites it: docs/security.md).
func TestAuthRefusesUnknownDevices(t *testing.T) {
	env := authEnv(t, nil)
	_, err := dialAuth(t, env.TCP, "car1", "car1", "secret1")
	require.NoError(t, err)
	for _, c := range [][3]string{{"car1", "car1", "wrong"}, {"car1", "", ""}, {"car9", "car9", "x"}, {"car2", "car1", "secret1"}, {"a+b", "car1", "secret1"}} {
		_, err := dialAuth(t, env.TCP, c[0], c[1], c[2])
		require.Error(t, err, "%v", c)
		require.Contains(t, err.Error(), "bad user name or password", "%v: MQTT 3 return code 4", c)
	}
	conn := rawConn(t, env.TCP, nil)
	_, err = conn.Write(packet(0x10, str("MQTT"), []byte{5, 0xC2, 0, 60, 0}, str("car1"), str("car1"), str("bad")))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	ack := readPacket(t, conn)
	require.Equal(t, byte(0x86), ack[3], "MQTT 5: bad user name or password")
}

// A device confined to its own topics cannot subscribe beyond them, gets
// no other device's live or retained messages, and cannot publish outside
// them (MQTT 5: PUBACK 0x87; MQTT 3: disconnected).
func TestACLConfinesDevices(t *testing.T) {
	env := authEnv(t, nil)
	var got received
	car1, err := dialAuth(t, env.TCP, "car1", "car1", "secret1")
	require.NoError(t, err)
	car2, err := dialAuth(t, env.TCP, "car2", "car2", "secret2")
	require.NoError(t, err)
	tok := car2.Publish("devices/car2/commands/x", 1, true, "retained for car2") // retained, car2's own
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	for _, f := range []string{"#", "+/+/#", "devices/+/#", "$share/g/devices/car2/#", "devices/car2/commands/#"} {
		tok := car1.Subscribe(f, 1, got.add)
		require.True(t, tok.WaitTimeout(5*time.Second))
		res := tok.(*paho3.SubscribeToken).Result()
		code, ok := res[f]
		if !ok { // paho files shared subscriptions under the filter without $share/<group>/
			code = res[strings.SplitN(f, "/", 3)[2]]
		}
		require.Equal(t, byte(0x80), code, "filter %s refused", f)
	}
	tok = car1.Subscribe("devices/car1/commands/#", 1, got.add)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.Equal(t, byte(1), tok.(*paho3.SubscribeToken).Result()["devices/car1/commands/#"])
	tok = car2.Publish("devices/car2/commands/y", 1, false, "live for car2")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.Never(t, func() bool { return len(got.get()) > 0 }, 200*time.Millisecond, 10*time.Millisecond,
		"car1 got a message of car2's topics")
	require.Empty(t, got.get())

	// MQTT 5 publish outside its topics: PUBACK 0x87.
	c5 := dialV5With(t, env.TCP, &paho.Connect{ClientID: "car2", KeepAlive: 30, CleanStart: true,
		UsernameFlag: true, Username: "car2", PasswordFlag: true, Password: []byte("secret2")}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, _ := c5.Publish(ctx, &paho.Publish{Topic: "devices/car1/x", QoS: 1, Payload: []byte("x")})
	require.NotNil(t, res)
	require.Equal(t, byte(0x87), res.ReasonCode)
	_ = c5.Disconnect(&paho.Disconnect{})
	<-c5.Done()

	// MQTT 3: disconnected.
	lost := make(chan struct{}, 1)
	c3, err := dialAuth(t, env.TCP, "car1", "car1", "secret1", func(o *paho3.ClientOptions) {
		o.SetConnectionLostHandler(func(paho3.Client, error) { lost <- struct{}{} })
	})
	require.NoError(t, err)
	c3.Publish("devices/car2/x", 1, false, "not yours")
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("MQTT 3 client publishing outside its topics was not disconnected")
	}
}

// Over its publish rate an MQTT 5 device gets 0x96; connect floods from one
// IP are banned while other IPs still connect.
func TestQuotas(t *testing.T) {
	now := time.Now()
	q := auth.NewQuotas(auth.QuotaConfig{PublishRate: 1, PublishBurst: 2, ConnectRatePerIP: 5, ConnectBurstPerIP: 5,
		BanAfter: 3, BanFor: time.Hour}, func() time.Time { return now })
	env := authEnv(t, q)

	c5 := dialV5With(t, env.TCP, &paho.Connect{ClientID: "car1", KeepAlive: 30, CleanStart: true,
		UsernameFlag: true, Username: "car1", PasswordFlag: true, Password: []byte("secret1")}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	codes := []byte{}
	for _, qos := range []byte{1, 1, 1, 2} {
		res, _ := c5.Publish(ctx, &paho.Publish{Topic: "devices/car1/t", QoS: qos, Payload: []byte("x")})
		require.NotNil(t, res, "QoS %d: an ack of the right type (QoS 2: PUBREC)", qos)
		codes = append(codes, res.ReasonCode)
	}
	require.Equal(t, []byte{0, 0, 0x96, 0x96}, codes)
	_ = c5.Disconnect(&paho.Disconnect{})
	<-c5.Done()

	// A flood from 127.0.0.1 (the clock does not move: no refill).
	for range 20 {
		c, err := net.Dial("tcp", env.TCP)
		if err == nil {
			_ = c.Close()
		}
	}
	// Each socket is admitted on its own goroutine: wait until the flood
	// has been counted (the IP is banned) before the probe.
	require.Eventually(t, func() bool {
		release, err := q.AdmitConnection("127.0.0.1")
		if err == nil {
			release()
		}
		return errors.Is(err, auth.ErrBanned)
	}, 10*time.Second, 10*time.Millisecond, "127.0.0.1 banned")
	c := rawConn(t, env.TCP, nil)
	requireClosed(t, c, 5*time.Second) // banned: closed before CONNECT
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	other, err := d.Dial("tcp", env.TCP)
	require.NoError(t, err)
	defer other.Close()
	_, err = other.Write(connectV4("car2x"))
	require.NoError(t, err)
	require.NoError(t, other.SetReadDeadline(time.Now().Add(5*time.Second)))
	ack := readPacket(t, other)
	require.Equal(t, byte(0x20), ack[0], "another IP still gets a CONNACK")
}

// A JWT's expiry ends the connection: MQTT 5 gets DISCONNECT 0xA0.
func TestJWTExpiryDisconnects(t *testing.T) {
	secret := []byte("jwt-secret")
	p, err := auth.NewJWT(auth.JWTOptions{Secret: secret})
	require.NoError(t, err)
	env := gatewaytest.Start(t, gatewaytest.Options{Auth: auth.NewHook(auth.HookOptions{Chain: &auth.Chain{Providers: []auth.Provider{p}}})})
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"clientid": "car-j", "exp": time.Now().Add(3 * time.Second).Unix(), // whole seconds: 2–3 s from now
	}).SignedString(secret)
	require.NoError(t, err)
	gone := make(chan byte, 1)
	c := dialV5With(t, env.TCP, &paho.Connect{ClientID: "car-j", KeepAlive: 30, CleanStart: true,
		UsernameFlag: true, Username: "car-j", PasswordFlag: true, Password: []byte(tok)},
		func(cfg *paho.ClientConfig) {
			cfg.OnServerDisconnect = func(d *paho.Disconnect) { gone <- d.ReasonCode }
		})
	select {
	case code := <-gone:
		require.Equal(t, byte(0xA0), code, "maximum connect time")
	case <-time.After(10 * time.Second):
		t.Fatal("not disconnected at the token's expiry")
	}
	<-c.Done()
}

// A flood of connects from one IP (as fast as this machine dials, on the
// real clock) gets that IP banned, while another IP connects normally.
func TestConnectFloodBanned(t *testing.T) {
	q := auth.NewQuotas(auth.QuotaConfig{ConnectRatePerIP: 100, ConnectBurstPerIP: 100, BanAfter: 50, BanFor: time.Hour}, time.Now)
	env := gatewaytest.Start(t, gatewaytest.Options{Auth: auth.NewHook(auth.HookOptions{Chain: &auth.Chain{AllowAnonymous: true}, Quotas: q})})
	flood := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}}
	start := time.Now()
	for range 2000 {
		c, err := flood.Dial("tcp", env.TCP)
		if err == nil {
			_ = c.Close()
		}
	}
	t.Logf("2,000 connects from 127.0.0.3 in %v", time.Since(start))
	c, err := flood.Dial("tcp", env.TCP)
	require.NoError(t, err)
	requireClosed(t, c, 5*time.Second) // banned: closed before CONNECT is read
	other := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.4")}}
	o, err := other.Dial("tcp", env.TCP)
	require.NoError(t, err)
	defer o.Close()
	_, err = o.Write(connectV4("fine"))
	require.NoError(t, err)
	require.NoError(t, o.SetReadDeadline(time.Now().Add(5*time.Second)))
	require.Equal(t, []byte{0x20, 2, 0, 0}, readPacket(t, o))
}

// A client ID's session cannot be taken over by a different identity.
func TestTakeoverNeedsSameIdentity(t *testing.T) {
	secret := []byte("jwt-secret")
	p, err := auth.NewJWT(auth.JWTOptions{Secret: secret})
	require.NoError(t, err)
	env := gatewaytest.Start(t, gatewaytest.Options{Auth: auth.NewHook(auth.HookOptions{Chain: &auth.Chain{Providers: []auth.Provider{p}}})})
	token := func(sub string) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
			"clientid": "car-t", "sub": sub, "exp": time.Now().Add(time.Hour).Unix(),
		}).SignedString(secret)
		require.NoError(t, err)
		return tok
	}
	owner, err := dialAuth(t, env.TCP, "car-t", "owner", token("owner"))
	require.NoError(t, err)
	_, err = dialAuth(t, env.TCP, "car-t", "intruder", token("intruder"))
	require.Error(t, err, "another identity is refused")
	require.True(t, owner.IsConnectionOpen(), "the owner keeps its connection")
	_, err = dialAuth(t, env.TCP, "car-t", "owner", token("owner"))
	require.NoError(t, err, "the same identity takes over")
}

// A publish to $SYS/… or into the gateway's internal namespace is refused
// visibly (mochi alone would drop a $SYS publish without an ack): MQTT 5
// QoS 1 gets PUBACK 0x87, QoS 2 PUBREC 0x87, QoS 0 is dropped with the
// connection kept; an MQTT 3 client publishing at QoS 1 is disconnected.
func TestPublishToSysRefused(t *testing.T) {
	env := authEnv(t, nil)
	var got received
	_, err := dialAuth(t, env.TCP, "car1", "car1", "secret1", func(o *paho3.ClientOptions) {
		o.SetDefaultPublishHandler(got.add) // whatever arrives, subscribed or not
	})
	require.NoError(t, err)

	c5 := dialV5With(t, env.TCP, &paho.Connect{ClientID: "car2", KeepAlive: 30, CleanStart: true,
		UsernameFlag: true, Username: "car2", PasswordFlag: true, Password: []byte("secret2")}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, p := range []struct {
		topic string
		qos   byte
	}{{"$SYS/broker/uptime", 1}, {"$SYS/x", 2}, {"$sys/x", 1}, {"$ferrymq/p2p/car1", 1}, {"$ferrymq/p2p/car1", 2}} {
		res, err := c5.Publish(ctx, &paho.Publish{Topic: p.topic, QoS: p.qos, Payload: []byte("x")})
		require.NotNil(t, res, "%s QoS %d: answered (%v)", p.topic, p.qos, err)
		require.Equal(t, byte(0x87), res.ReasonCode, "%s QoS %d: not authorized", p.topic, p.qos)
	}
	_, err = c5.Publish(ctx, &paho.Publish{Topic: "$SYS/x", QoS: 0, Payload: []byte("x")})
	require.NoError(t, err)
	res, err := c5.Publish(ctx, &paho.Publish{Topic: "devices/car2/up", QoS: 1, Payload: []byte("x")})
	require.NoError(t, err, "QoS 0 was dropped, the connection kept")
	require.Equal(t, byte(0), res.ReasonCode)
	require.Empty(t, got.get(), "nothing reached car1 (its point-to-point subscription included)")

	// MQTT 3: QoS 0 dropped, QoS 1 disconnected.
	lost := make(chan struct{}, 1)
	c3, err := dialAuth(t, env.TCP, "car2", "car2", "secret2", func(o *paho3.ClientOptions) {
		o.SetConnectionLostHandler(func(paho3.Client, error) { lost <- struct{}{} })
	})
	require.NoError(t, err)
	require.True(t, c3.Publish("$SYS/x", 0, false, "x").WaitTimeout(5*time.Second))
	pub := c3.Publish("devices/car2/up", 1, false, "x")
	require.True(t, pub.WaitTimeout(5*time.Second))
	require.NoError(t, pub.Error(), "QoS 0 to $SYS was dropped, the connection kept")
	c3.Publish("$SYS/x", 1, false, "x")
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("MQTT 3 client publishing to $SYS at QoS 1 was not disconnected")
	}
}

// An MQTT 5 publish by topic alias alone (empty topic name) is checked
// against the topic the alias stands for.
func TestTopicAliasUnderAuth(t *testing.T) {
	env := authEnv(t, nil)
	got := make(chan string, 4)
	c5 := dialV5With(t, env.TCP, &paho.Connect{ClientID: "car1", KeepAlive: 30, CleanStart: true,
		UsernameFlag: true, Username: "car1", PasswordFlag: true, Password: []byte("secret1")},
		func(cfg *paho.ClientConfig) {
			cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
				got <- r.Packet.Topic + "=" + string(r.Packet.Payload)
				return true, nil
			}}
		})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	sa, err := c5.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "devices/car1/commands/#", QoS: 1}}})
	require.NoError(t, err)
	require.Equal(t, []byte{1}, sa.Reasons)
	alias := uint16(1)
	for _, p := range []*paho.Publish{
		{Topic: "devices/car1/commands/a", QoS: 1, Payload: []byte("set"), Properties: &paho.PublishProperties{TopicAlias: &alias}},
		{QoS: 1, Payload: []byte("used"), Properties: &paho.PublishProperties{TopicAlias: &alias}},
	} {
		res, err := c5.Publish(ctx, p)
		require.NoError(t, err)
		require.Equal(t, byte(0), res.ReasonCode)
	}
	for _, want := range []string{"devices/car1/commands/a=set", "devices/car1/commands/a=used"} {
		select {
		case m := <-got:
			require.Equal(t, want, m)
		case <-ctx.Done():
			t.Fatalf("%s not delivered", want)
		}
	}
}

// jwtFor signs an HS256 token for clientID whose identity is sub.
func jwtFor(t *testing.T, secret []byte, clientID, sub string) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"clientid": clientID, "sub": sub, "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString(secret)
	require.NoError(t, err)
	return tok
}

// connackV5 sends an MQTT 5 CONNECT (session expiry in seconds) and
// returns the CONNACK reason code; an accepted client disconnects.
func connackV5(t *testing.T, addr, id, password string, clean bool, expiry uint32) byte {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	c := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cp := &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: clean, UsernameFlag: true, Username: "x",
		PasswordFlag: true, Password: []byte(password), Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}
	ca, err := c.Connect(ctx, cp)
	if err == nil {
		_ = c.Disconnect(&paho.Disconnect{})
		<-c.Done()
		return 0
	}
	require.NotNil(t, ca, "connect %s: %v", id, err)
	return ca.ReasonCode
}

// A client ID's session belongs to the identity that made it, also while
// it is offline (the engine keeps its username): a different identity is
// refused, with or without a clean start.
func TestSessionOwnerRefusesOthers(t *testing.T) {
	secret := []byte("jwt-secret")
	p, err := auth.NewJWT(auth.JWTOptions{Secret: secret})
	require.NoError(t, err)
	env := gatewaytest.Start(t, gatewaytest.Options{Auth: auth.NewHook(auth.HookOptions{
		Chain: &auth.Chain{Providers: []auth.Provider{p}},
	})})

	// An offline persistent session.
	owner, err := dialAuth(t, env.TCP, "car-p", "any", jwtFor(t, secret, "car-p", "owner"), func(o *paho3.ClientOptions) {
		o.SetCleanSession(false)
	})
	require.NoError(t, err)
	owner.Disconnect(50)
	require.Eventually(t, func() bool {
		e := env.Gateway.Engine()
		return e.HasSession("car-p") && !e.Connected("car-p")
	}, 5*time.Second, 10*time.Millisecond, "the session stays, offline")
	for _, id := range []string{"car-p"} {
		_, err = dialAuth(t, env.TCP, id, "owner", jwtFor(t, secret, id, "intruder"))
		require.Error(t, err, "%s: MQTT 3 clean session of another identity", id)
		require.Equal(t, byte(0x86), connackV5(t, env.TCP, id, jwtFor(t, secret, id, "intruder"), true, 0),
			"%s: MQTT 5 clean start of another identity", id)
		require.Equal(t, byte(0x86), connackV5(t, env.TCP, id, jwtFor(t, secret, id, "intruder"), false, 3600), id)
		require.Zero(t, connackV5(t, env.TCP, id, jwtFor(t, secret, id, "owner"), false, 3600), "%s: the owner", id)
	}
	// The owner's clean start without session expiry ends its session when
	// it disconnects: the ID is free again.
	require.Zero(t, connackV5(t, env.TCP, "car-p", jwtFor(t, secret, "car-p", "owner"), true, 0))
	require.Eventually(t, func() bool { // once the gateway has seen the DISCONNECT
		return connackV5(t, env.TCP, "car-p", jwtFor(t, secret, "car-p", "newcomer"), true, 0) == 0
	}, 5*time.Second, 20*time.Millisecond)
}
