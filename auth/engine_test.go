package auth

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// The hook on a real engine: real listeners on loopback, paho.golang MQTT 5
// clients.

func startEngine(t *testing.T, h *Hook) string {
	t.Helper()
	e, err := engine.New(engine.Options{
		Listeners: []engine.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}},
		Hooks:     engine.Hooks{Auth: h, ACL: h, Limits: h},
	})
	require.NoError(t, err)
	require.NoError(t, e.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Shutdown(ctx))
	})
	return e.Addr("tcp").String()
}

// connect5 sends a CONNECT and returns the client and the CONNACK's code.
func connect5(t *testing.T, addr, id, user, pass string, onPub func(paho.PublishReceived) (bool, error)) (*paho.Client, byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	cfg := paho.ClientConfig{Conn: conn}
	if onPub != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPub}
	}
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cp := &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true}
	if user != "" {
		cp.Username, cp.UsernameFlag = user, true
		cp.Password, cp.PasswordFlag = []byte(pass), true
	}
	ca, err := c.Connect(ctx, cp)
	if ca == nil {
		require.Error(t, err)
		return nil, 0
	}
	if ca.ReasonCode == 0 {
		t.Cleanup(func() {
			_ = c.Disconnect(&paho.Disconnect{})
			<-c.Done()
		})
	}
	return c, ca.ReasonCode
}

func TestEngineAuthentication(t *testing.T) {
	h := NewHook(HookOptions{Chain: &Chain{Providers: []Provider{passwords{"alice": "s3cret", "bob": "hunter2"}}}})
	addr := startEngine(t, h)

	_, code := connect5(t, addr, "car-1", "alice", "wrong", nil)
	require.Equal(t, byte(0x86), code, "bad user name or password")
	_, code = connect5(t, addr, "car-1", "", "", nil)
	require.Equal(t, byte(0x86), code, "anonymous refused when not allowed")
	_, code = connect5(t, addr, "car-1", "alice", "s3cret", nil)
	require.Equal(t, byte(0), code)
	// The session of car-1 is alice's: bob may not take it over.
	_, code = connect5(t, addr, "car-1", "bob", "hunter2", nil)
	require.Equal(t, byte(0x86), code, "another identity may not take over a session")
}

func TestEngineACL(t *testing.T) {
	acl, err := NewACL([]ACLRule{
		{Action: "deny", Subscribe: []string{"devices/secret/#"}},
		{Action: "allow", Publish: []string{"devices/%c/#"}, Subscribe: []string{"devices/#", "public/#"}},
	})
	require.NoError(t, err)
	h := NewHook(HookOptions{ACL: acl})
	addr := startEngine(t, h)

	got := make(chan string, 16)
	reader, code := connect5(t, addr, "reader", "", "", func(pr paho.PublishReceived) (bool, error) {
		got <- pr.Packet.Topic
		return true, nil
	})
	require.Zero(t, code)
	ctx := t.Context()
	sa, err := reader.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
		{Topic: "devices/#", QoS: 1}, {Topic: "devices/secret/#", QoS: 1}, {Topic: "private/#", QoS: 1},
	}})
	require.NotNil(t, sa, "%v", err)
	require.Equal(t, []byte{1, 0x87, 0x87}, sa.Reasons, "denied filters get 0x87 [MQTT-3.9.3-?]")

	secret, code := connect5(t, addr, "secret", "", "", nil)
	require.Zero(t, code)
	pr, err := secret.Publish(ctx, &paho.Publish{Topic: "devices/secret/x", QoS: 1, Payload: []byte("x")})
	require.NoError(t, err)
	require.Zero(t, pr.ReasonCode, "secret may publish under its own client ID")
	pr, err = secret.Publish(ctx, &paho.Publish{Topic: "devices/other/x", QoS: 1, Payload: []byte("x")})
	require.NotNil(t, pr, "%v", err)
	require.Equal(t, byte(0x87), pr.ReasonCode, "not under its own client ID: not authorized")
	dev, code := connect5(t, addr, "d1", "", "", nil)
	require.Zero(t, code)
	_, err = dev.Publish(ctx, &paho.Publish{Topic: "devices/d1/speed", QoS: 1, Payload: []byte("87")})
	require.NoError(t, err)

	// devices/# is granted, but the deny rule keeps devices/secret/x out of
	// what it delivers.
	require.Eventually(t, func() bool { return len(got) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, "devices/d1/speed", <-got)
	require.Never(t, func() bool { return len(got) > 0 }, 200*time.Millisecond, 10*time.Millisecond)
}

func TestEngineQuotas(t *testing.T) {
	q := NewQuotas(QuotaConfig{PublishRate: 1, PublishBurst: 2, MaxSubscriptions: 2, MaxConnectionsPerIP: 3}, nil)
	h := NewHook(HookOptions{Quotas: q})
	addr := startEngine(t, h)
	c, code := connect5(t, addr, "q1", "", "", nil)
	require.Zero(t, code)
	ctx := t.Context()
	var codes []byte
	for range 4 {
		pr, err := c.Publish(ctx, &paho.Publish{Topic: "t", QoS: 1, Payload: []byte("x")})
		require.NotNil(t, pr, "%v", err)
		codes = append(codes, pr.ReasonCode)
	}
	require.Equal(t, []byte{0, 0, 0x96, 0x96}, codes, "the burst passes, then message rate too high")

	sa, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "a"}, {Topic: "b"}, {Topic: "c"}}})
	require.NotNil(t, sa, "%v", err)
	require.Equal(t, []byte{0, 0, 0x97}, sa.Reasons, "third subscription over the cap")

	// Three connections per IP: q1 and two more; the fourth is refused
	// before a byte is read.
	connect5(t, addr, "q2", "", "", nil)
	connect5(t, addr, "q3", "", "", nil)
	_, code = connect5(t, addr, "q4", "", "", nil)
	require.Zero(t, code, "no CONNACK: the socket is closed")
}
