package engine_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

func TestMain(m *testing.M) {
	code := m.Run()
	fuzzShutdown() // FuzzEngine's seeds run as tests on one shared engine
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// start runs an engine with one TCP listener on a free loopback port until
// the test ends.
func start(t testing.TB, o engine.Options) (*engine.Engine, string) {
	t.Helper()
	if o.Listeners == nil {
		o.Listeners = []engine.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}}
	}
	e, err := engine.New(o)
	require.NoError(t, err)
	require.NoError(t, e.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Shutdown(ctx))
	})
	if a := e.Addr("tcp"); a != nil {
		return e, a.String()
	}
	return e, ""
}

func dialV3(t testing.TB, addr, id string, tune ...func(*paho3.ClientOptions)) paho3.Client {
	t.Helper()
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).
		SetOrderMatters(true).SetWriteTimeout(10 * time.Second)
	for _, f := range tune {
		f(o)
	}
	c := paho3.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second), "connect %s timed out", id)
	require.NoError(t, tok.Error(), "connect %s", id)
	t.Cleanup(func() { c.Disconnect(50) })
	return c
}

func dialV5(t testing.TB, addr string, cp *paho.Connect, onPub func(paho.PublishReceived) (bool, error)) (*paho.Client, *paho.Connack) {
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
	ca, err := c.Connect(ctx, cp)
	require.NoError(t, err, "connect %s", cp.ClientID)
	require.Equal(t, byte(0), ca.ReasonCode)
	t.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
		<-c.Done()
	})
	return c, ca
}

// inbox collects messages a paho 3 client receives.
type inbox struct {
	mu   sync.Mutex
	msgs []paho3.Message
}

func (in *inbox) handler(_ paho3.Client, m paho3.Message) {
	in.mu.Lock()
	in.msgs = append(in.msgs, m)
	in.mu.Unlock()
}

func (in *inbox) payloads() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]string, len(in.msgs))
	for i, m := range in.msgs {
		out[i] = string(m.Payload())
	}
	return out
}

func wait(t testing.TB, tok paho3.Token) {
	t.Helper()
	require.True(t, tok.WaitTimeout(10*time.Second), "timed out")
	require.NoError(t, tok.Error())
}

func TestPublishSubscribeEveryQoS(t *testing.T) {
	_, addr := start(t, engine.Options{})
	var in inbox
	sub := dialV3(t, addr, "sub")
	wait(t, sub.Subscribe("cars/+/speed", 2, in.handler))
	pub := dialV3(t, addr, "pub")
	for qos := byte(0); qos <= 2; qos++ {
		wait(t, pub.Publish("cars/c1/speed", qos, false, []byte{'0' + qos}))
	}
	require.Eventually(t, func() bool { return len(in.payloads()) == 3 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"0", "1", "2"}, in.payloads())
	in.mu.Lock()
	for i, m := range in.msgs {
		require.Equal(t, byte(i), m.Qos(), "min(publish, subscription) QoS")
		require.Equal(t, "cars/c1/speed", m.Topic())
	}
	in.mu.Unlock()
}

func TestRetainedMessagesOnSubscribe(t *testing.T) {
	_, addr := start(t, engine.Options{})
	pub := dialV3(t, addr, "pub")
	wait(t, pub.Publish("home/kitchen/temp", 1, true, []byte("21")))
	wait(t, pub.Publish("home/hall/temp", 1, true, []byte("19")))
	wait(t, pub.Publish("home/hall/temp", 1, true, []byte{})) // cleared [MQTT-3.3.1-6]
	var in inbox
	sub := dialV3(t, addr, "sub")
	wait(t, sub.Subscribe("home/#", 1, in.handler))
	require.Eventually(t, func() bool { return len(in.payloads()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Never(t, func() bool { return len(in.payloads()) > 1 }, 200*time.Millisecond, 10*time.Millisecond)
	in.mu.Lock()
	require.True(t, in.msgs[0].Retained(), "retained messages carry RETAIN [MQTT-3.3.1-8]")
	require.Equal(t, "21", string(in.msgs[0].Payload()))
	in.mu.Unlock()
}

func TestV5PropertiesPassThrough(t *testing.T) {
	_, addr := start(t, engine.Options{})
	got := make(chan *paho.Publish, 1)
	sub, _ := dialV5(t, addr, &paho.Connect{ClientID: "sub5", CleanStart: true, KeepAlive: 30}, func(pr paho.PublishReceived) (bool, error) {
		got <- pr.Packet
		return true, nil
	})
	ctx := t.Context()
	_, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "rpc/#", QoS: 1}},
		Properties: &paho.SubscribeProperties{SubscriptionIdentifier: new(7)}})
	require.NoError(t, err)
	pub, _ := dialV5(t, addr, &paho.Connect{ClientID: "pub5", CleanStart: true, KeepAlive: 30}, nil)
	_, err = pub.Publish(ctx, &paho.Publish{Topic: "rpc/req", QoS: 1, Payload: []byte("ping"), Properties: &paho.PublishProperties{
		ResponseTopic: "rpc/resp", CorrelationData: []byte{1, 2, 3}, ContentType: "text/plain",
		User: paho.UserProperties{{Key: "a", Value: "1"}, {Key: "a", Value: "2"}}, MessageExpiry: new(uint32(60)),
	}})
	require.NoError(t, err)
	select {
	case p := <-got:
		require.Equal(t, "ping", string(p.Payload))
		require.Equal(t, "rpc/resp", p.Properties.ResponseTopic)
		require.Equal(t, []byte{1, 2, 3}, p.Properties.CorrelationData)
		require.Equal(t, "text/plain", p.Properties.ContentType)
		require.Equal(t, paho.UserProperties{{Key: "a", Value: "1"}, {Key: "a", Value: "2"}}, p.Properties.User)
		require.Equal(t, []int{7}, []int{*p.Properties.SubscriptionIdentifier})
		require.NotNil(t, p.Properties.MessageExpiry)
		require.LessOrEqual(t, *p.Properties.MessageExpiry, uint32(60))
	case <-time.After(5 * time.Second):
		t.Fatal("no message")
	}
}

//go:fix inline
func new[T any](v T) *T { return &v }

// authFunc is an Authenticator from a function.
type authFunc func(*engine.ConnectInfo) (engine.Identity, error)

func (f authFunc) Authenticate(_ context.Context, ci *engine.ConnectInfo) (engine.Identity, error) {
	return f(ci)
}
